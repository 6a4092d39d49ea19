//! The load of the cluster rotation tests (`key_rotation_cluster::`): readers that ask every
//! item on the primary its raw bytes route to, by EXISTS and MEXISTS, and check each answer
//! against what was acknowledged; a writer of MEMBER.ADD, MADD, ADD-then-DEL and outside
//! INSERTs in the form the catalog gives; and what a failure's message shows of the nodes.
use crate::support;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::Connection;
use support::cluster::Cluster;
use support::member::*;

use super::tokenize::{KEY1, KEY2};
use crate::support::rotation::{stamp, wanted};

pub(crate) const SET: &str = "rot_cl";
/// Rows an outside writer puts in before the rotation, in the first key's form.
pub(crate) const BULK: i64 = 3_000;

/// What the writer acknowledged: added (never deleted since) and deleted; and outside rows.
#[derive(Default)]
pub(crate) struct Acked {
    pub(crate) added: BTreeSet<String>,
    pub(crate) deleted: BTreeSet<String>,
    /// Outside INSERTs committed: each answers 1 within a sync interval, checked at the end.
    pub(crate) outside: BTreeSet<String>,
}

/// One connection per node, by port: an item's EXISTS goes to the primary its raw bytes route
/// to, as a cluster client sends it.
pub(crate) struct Conns(pub(crate) HashMap<u16, Connection>);

impl Conns {
    pub(crate) fn new(cl: &Cluster) -> Conns {
        Conns(cl.nodes.iter().map(|n| (n.port(), n.conn())).collect())
    }

    pub(crate) fn to(&mut self, cl: &Cluster, item: &str) -> &mut Connection {
        let port = cl.owner(cl.keyslot(item)).port();
        self.0.get_mut(&port).expect("a connection to every node")
    }
}

pub(crate) fn mexists(c: &mut Connection, items: &[String]) -> redis::RedisResult<Vec<i64>> {
    redis::cmd("MEMBER.MEXISTS")
        .arg(SET)
        .arg("ITEMS")
        .arg(items)
        .query(c)
}

/// The reader's calls, and of them how many were refused.
#[derive(Default)]
pub(crate) struct Reads {
    pub(crate) calls: usize,
    pub(crate) refused: usize,
}

/// A reply that is no answer, and that the contract allows: the database did not answer in
/// time, a slot is moving.
pub(crate) fn refusal(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("UNAVAILABLE" | "TRYAGAIN"))
}

/// Every item of `present` and every acknowledged add answers 1, every item of `absent` and
/// every acknowledged delete 0: by MEXISTS on the set's node, and by EXISTS of a sample on the
/// node each item routes to. The wrong answers; the calls go to `reads`.
pub(crate) fn check_round(
    cl: &Cluster,
    conns: &mut Conns,
    (present, absent): (&[String], &[String]),
    (acked, reads): (&Mutex<Acked>, &mut Reads),
) -> Vec<String> {
    let (added, deleted): (Vec<String>, Vec<String>) = {
        let a = acked.lock().unwrap();
        (
            a.added.iter().cloned().collect(),
            a.deleted.iter().cloned().collect(),
        )
    };
    let want = wanted((present, &added), (absent, &deleted));
    let mut wrong = Vec::new();
    let owner = cl.set_owner(SET).port();
    for part in want.chunks(400) {
        reads.calls += 1;
        let items: Vec<String> = part.iter().map(|(i, _)| i.clone()).collect();
        match mexists(conns.0.get_mut(&owner).unwrap(), &items) {
            Ok(got) => wrong.extend(
                part.iter()
                    .zip(got)
                    .filter(|((_, w), g)| w != g)
                    .map(|((i, w), g)| format!("{} MEXISTS {i}: {g}, not {w}", stamp())),
            ),
            Err(e) if refusal(&e) => reads.refused += 1,
            Err(e) => wrong.push(format!("{} MEXISTS: {e}", stamp())),
        }
    }
    for (item, w) in want.iter().step_by(want.len() / 60 + 1) {
        reads.calls += 1;
        match cmd(conns.to(cl, item), &["MEMBER.EXISTS", SET, item]) {
            Ok(redis::Value::Int(g)) if g == *w => {}
            Err(e) if refusal(&e) => reads.refused += 1,
            g => wrong.push(format!("{} EXISTS {item}: {g:?}, not {w}", stamp())),
        }
    }
    wrong
}

/// For the items answered wrong: how each answers now, and whether its row is stored.
pub(crate) fn now_of(
    cl: &Cluster,
    conns: &mut Conns,
    pg: &mut postgres::Client,
    wrong: &[String],
) -> Vec<String> {
    let items: BTreeSet<&str> = wrong
        .iter()
        .filter_map(|w| w.split(' ').nth(2))
        .map(|i| i.trim_end_matches(':'))
        .take(5)
        .collect();
    items
        .into_iter()
        .map(|item| {
            let stored: i64 = pg
                .query_one(
                    "SELECT count(*) FROM member_rot_cl
                      WHERE entity_id = member_catalog_token('rot_cl', $1, '', $2, $3)",
                    &[&item, &KEY1, &KEY2],
                )
                .unwrap()
                .get(0);
            let how = explain(conns.to(cl, item), SET, item);
            format!("{item}: {how:?}, stored {stored}")
        })
        .collect()
}

/// Each node's log lines about the set's rotation, for a failure's message.
pub(crate) fn rotation_log(cl: &Cluster) -> String {
    cl.nodes
        .iter()
        .map(|n| {
            let lines: Vec<String> =
                n.vk.log()
                    .lines()
                    .filter(|l| l.contains(SET))
                    .map(str::to_string)
                    .collect();
            format!("{} ({}):\n{}", n.port(), n.primary, lines.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sets the flag when dropped: a panic in the test's own thread still stops its helpers.
pub(crate) struct StopOnDrop<'a>(pub(crate) &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What the writer saw: unexpected errors, and of its calls how many were refused as the
/// contract allows (a slot moving, a twin's owner not confirming: nothing acknowledged).
#[derive(Default)]
pub(crate) struct Written {
    pub(crate) errors: Vec<String>,
    pub(crate) refused: usize,
    pub(crate) calls: usize,
    /// Outside INSERTs tried, and the first few refused (a form the chain outgrew).
    pub(crate) outside_tried: usize,
    pub(crate) outside_refused: Vec<String>,
}

impl Written {
    fn failed(&mut self, what: String) {
        if what.contains("TRYAGAIN") || what.contains("the write was stored, but") {
            self.refused += 1;
        } else {
            self.errors.push(what);
        }
    }
}

/// MEMBER.ADD, MADD and DEL on the nodes the items route to, and outside INSERTs in the form
/// the catalog gives; what is acknowledged goes to `acked`.
pub(crate) fn write_until(cl: &Cluster, stop: &AtomicBool, acked: &Mutex<Acked>) -> Written {
    let mut conns = Conns::new(cl);
    let mut pg = cl.db().client();
    let owner = cl.set_owner(SET).port();
    let mut w = Written::default();
    let mut i = 0;
    while !stop.load(Ordering::Acquire) {
        w.calls += 1;
        let item = format!("new-{i}");
        if i % 3 == 0 {
            let pair = [item.clone(), format!("new-{i}-b")];
            let got: redis::RedisResult<Vec<i64>> = redis::cmd("MEMBER.MADD")
                .arg(SET)
                .arg("ITEMS")
                .arg(&pair)
                .query(conns.0.get_mut(&owner).unwrap());
            match got {
                Ok(_) => acked.lock().unwrap().added.extend(pair),
                Err(e) => w.failed(format!("MADD {pair:?}: {e}")),
            }
        } else {
            match cmd(conns.to(cl, &item), &["MEMBER.ADD", SET, &item]) {
                Ok(redis::Value::Int(_)) => {
                    acked.lock().unwrap().added.insert(item.clone());
                }
                g => w.failed(format!("ADD {item}: {g:?}")),
            }
        }
        if i % 4 == 1 {
            // An item added and deleted again: checked once its DEL is acknowledged.
            let doomed = format!("tmp-{i}");
            let added = cmd(conns.to(cl, &doomed), &["MEMBER.ADD", SET, &doomed]);
            match added.and_then(|_| cmd(conns.to(cl, &doomed), &["MEMBER.DEL", SET, &doomed])) {
                Ok(redis::Value::Int(1)) => {
                    acked.lock().unwrap().deleted.insert(doomed);
                }
                g => w.failed(format!("ADD then DEL {doomed}: {g:?}")),
            }
        }
        if i % 5 == 2 {
            // An outside writer, in the form the catalog gives now (under the chain's keys,
            // which the end lengthens). The chain may grow between the two statements: such a
            // row is refused (the form check), never stored unfindable.
            let rotated = pg
                .query_one(
                    "SELECT token_key_fp LIKE '%>%' FROM member_catalog WHERE name = $1",
                    &[&SET],
                )
                .is_ok_and(|r| r.get::<_, bool>(0));
            let item = format!("outside-{i}");
            let made = if rotated {
                pg.execute(
                    "INSERT INTO member_rot_cl (entity_id)
                     VALUES (member_catalog_token('rot_cl', $1, '', $2, $3))",
                    &[&item, &KEY1, &KEY2],
                )
            } else {
                pg.execute(
                    "INSERT INTO member_rot_cl (entity_id)
                     VALUES (member_catalog_token('rot_cl', $1, '', $2))",
                    &[&item, &KEY1],
                )
            };
            w.outside_tried += 1;
            match made {
                Ok(_) => {
                    acked.lock().unwrap().outside.insert(item);
                }
                Err(e) if w.outside_refused.len() < 3 => w.outside_refused.push(e.to_string()),
                Err(_) => {}
            }
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    w
}
