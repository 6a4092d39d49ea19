//! What the online key rotation tests share (docs/security.md, "Rotating a tokenized set's
//! key online"): the answers a set must give and a round that checks them, the rotation's
//! phase as MEMBER.INFO shows it, and the ways the tests start, hold and lag a rotation.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use redis::{Connection, Value};

use super::member::{cmd, int, set_info};
use super::wait_until;

/// The wall clock, to set an error beside the server's log.
pub fn stamp() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    format!("{}.{:03}", t.as_secs() % 86_400, t.subsec_millis())
}

/// Each item with the answer it must get: 1 for `present` and acknowledged adds, 0 for
/// `absent` and acknowledged deletes.
pub fn wanted(
    (present, added): (&[String], &[String]),
    (absent, deleted): (&[String], &[String]),
) -> Vec<(String, i64)> {
    present
        .iter()
        .chain(added)
        .map(|i| (i.clone(), 1))
        .chain(absent.iter().chain(deleted).map(|i| (i.clone(), 0)))
        .collect()
}

/// What the writers acknowledged: added (never deleted since) and deleted.
#[derive(Default)]
pub struct Acked {
    pub added: BTreeSet<String>,
    pub deleted: BTreeSet<String>,
}

/// Checks, on `c`, that in `set` every item of `present` (and the acknowledged adds) answers 1
/// and every item of `absent` (and the acknowledged deletes) 0, by EXISTS and MEXISTS. Returns
/// the wrong answers seen.
pub fn check_round(
    c: &mut Connection,
    set: &str,
    present: &[String],
    absent: &[String],
    acked: &Mutex<Acked>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    let (added, deleted): (Vec<String>, Vec<String>) = {
        let a = acked.lock().unwrap();
        // The most recent adds and a sample of the older ones (a round stays short).
        let n = a.added.len();
        (
            a.added
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 10 == 0 || i + 300 >= n)
                .map(|(_, x)| x.clone())
                .collect(),
            a.deleted.iter().cloned().collect(),
        )
    };
    let want = wanted((present, &added), (absent, &deleted));
    let items: Vec<String> = want.iter().map(|(i, _)| i.clone()).collect();
    let mut got: Vec<i64> = Vec::with_capacity(items.len());
    for part in items.chunks(500) {
        let mut k = redis::cmd("MEMBER.MEXISTS");
        k.arg(set).arg("ITEMS").arg(part);
        match k.query::<Vec<i64>>(c) {
            Ok(g) => got.extend(g),
            Err(e) => {
                wrong.push(format!("{} MEXISTS: {e}", stamp()));
                return wrong;
            }
        }
    }
    for ((item, w), g) in want.iter().zip(&got) {
        if w != g {
            wrong.push(format!("MEXISTS {item}: {g}, not {w}"));
        }
    }
    for (item, w) in want.iter().step_by(want.len() / 40 + 1) {
        match cmd(c, &["MEMBER.EXISTS", set, item]) {
            Ok(Value::Int(g)) if g == *w => {}
            g => wrong.push(format!("{} EXISTS {item}: {g:?}, not {w}", stamp())),
        }
    }
    wrong
}

pub fn mexists(c: &mut Connection, set: &str, items: &[String]) -> Vec<i64> {
    let mut k = redis::cmd("MEMBER.MEXISTS");
    k.arg(set).arg("ITEMS").arg(items);
    k.query(c).unwrap()
}

/// Whether `c` says, within 30 s, that `set` rotates in `phase`.
pub fn shows_phase(c: &mut Connection, set: &str, phase: &str) -> bool {
    wait_until(Duration::from_secs(30), || {
        set_info(c, set, "token_rotation").as_deref() == Ok(phase)
    })
}

/// MEMBER.ADD of each of `items`, each new to `set`.
pub fn add_each(c: &mut Connection, set: &str, items: &[String]) {
    for i in items {
        assert_eq!(int(c, &["MEMBER.ADD", set, i]), 1, "ADD {i}");
    }
}

/// Holds `set`'s rotation still, for as long as the session `pg` lives or keeps the lock:
/// every step takes that lock without waiting, and skips when it is held.
pub fn hold_rotation(pg: &mut postgres::Client, set: &str) {
    pg.execute(
        "SELECT pg_advisory_lock(hashtextextended('member rotation ' || $1, 0))",
        &[&set],
    )
    .unwrap();
}

/// Holds the writes of `set` (a set named `failpoint_held_…`, on a node of the debug build:
/// `members::HELD_PREFIX`) on their workers, before their statements, for as long as the
/// session `pg` lives or keeps the lock.
pub fn hold_writes(pg: &mut postgres::Client, set: &str) {
    pg.execute(
        "SELECT pg_advisory_lock(hashtextextended('libmember failpoint ' || $1, 0))",
        &[&set],
    )
    .unwrap();
}

/// `MEMBER.ALTER <set> ROTATE-KEY <id>`, tried again for up to 60 s while refused with
/// `TRYAGAIN` (the start's DDL found the table locked by writers through all its tries: on a
/// loaded machine, the test's own writers); any other reply than OK fails the test.
pub fn rotate_key(c: &mut Connection, set: &str, id: &str) {
    let mut last = String::new();
    let started = wait_until(Duration::from_secs(60), || {
        match cmd(c, &["MEMBER.ALTER", set, "ROTATE-KEY", id]) {
            Ok(Value::Okay) => true,
            Err(e) if e.code() == Some("TRYAGAIN") => {
                last = e.to_string();
                false
            }
            other => panic!("ROTATE-KEY {set} {id}: {other:?}"),
        }
    });
    assert!(started, "ROTATE-KEY {set} {id} refused for 60 s: {last}");
}

/// The node report that holds a rotation before its drain (`report_lagging_node`).
pub const LAGGING: &str = "test-lagging-node";

/// Reports a second node, with the ring of the real node that reported last (an older report
/// may be a stopped node's, from before the ring changed), that follows the rotation
/// of `set` (a chain of one key) but computes its old form: the rotation waits for it before
/// its drain until `DELETE`d (its report is dated an hour ahead, so it stays fresh).
pub fn report_lagging_node(pg: &mut postgres::Client, set: &str) {
    assert!(wait_until(Duration::from_secs(30), || {
        pg.execute(
            "INSERT INTO member_nodes (node, port, role, ring, serving, rotation_level, seen_at)
             SELECT $1, port, role, ring, $2 || ':1', rotation_level, now() + interval '1 hour'
               FROM member_nodes WHERE node <> $1
              ORDER BY seen_at DESC LIMIT 1 ON CONFLICT (node) DO NOTHING",
            &[&LAGGING, &set],
        )
        .unwrap()
            == 1
    }));
}
