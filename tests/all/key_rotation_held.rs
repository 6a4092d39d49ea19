//! A write that a node planned before it learned its set's drain, and that reached the
//! database after: it stores (or deletes) both forms, as planned (an ADD as one row of the new
//! form that names the old: docs/rotation-in-place.md), and the node's filter takes both. Held at each point by locks (the debug build's write failpoint, `members::HELD_PREFIX`,
//! a node report that holds the switch, and a lock on the change log that holds the drain's
//! deletes), so the order is the same on any machine.
use crate::support;

use std::time::Duration;

use support::member::*;
use support::wait_until;

use super::tokenize::{KeyFile, KEY1, KEY2};
use crate::support::rotation::{report_lagging_node, rotate_key, shows_phase, LAGGING};

/// A set whose writes wait for the test's failpoint lock (debug builds).
const SET: &str = "failpoint_held_cards";

fn phase(pg: &mut postgres::Client) -> Option<String> {
    pg.query_one(
        "SELECT rotate_phase FROM member_catalog WHERE name = $1",
        &[&SET],
    )
    .unwrap()
    .get(0)
}

/// Waits until `n` sessions of this test's database wait for a lock of one of the kinds
/// `events` (`advisory`, `relation`, `transactionid`) in a statement that names `like`.
pub(crate) fn wait_waiting(
    pg: &mut postgres::Client,
    events: &[&str],
    like: &str,
    n: i64,
    what: &dyn Fn() -> String,
) {
    let seen = wait_until(Duration::from_secs(30), || {
        let c: i64 = pg
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND wait_event = ANY($1) AND query LIKE $2
                    AND datname = current_database()",
                &[&events, &like],
            )
            .unwrap()
            .get(0);
        c >= n
    });
    assert!(seen, "{}: {:#?}", what(), activity(pg));
}

/// What every session of the database waits for, and runs (for a failure's message).
fn activity(pg: &mut postgres::Client) -> Vec<String> {
    pg.query(
        "SELECT coalesce(wait_event_type, '') || '/' || coalesce(wait_event, '') || ': ' || query
           FROM pg_stat_activity
          WHERE backend_type = 'client backend' AND datname = current_database()",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The switching phase, held by the lagging node: the node's report says its filter covers the
/// end, the lagging one's does not, and the catalog waits for it; once it says so too, the
/// catalog records that every node's filter covers the end (what nodes of a cluster switch on;
/// docs/security.md, "In a cluster").
fn every_filter_covers_the_end(env: &Env, pg: &mut postgres::Client) {
    let entry = format!("%,{SET}:2,%");
    let reports = |pg: &mut postgres::Client| -> Vec<String> {
        pg.query(
            "SELECT node FROM member_nodes WHERE (',' || covered || ',') LIKE $1 ORDER BY node",
            &[&entry],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let covered = |pg: &mut postgres::Client| -> Option<bool> {
        pg.query_one(
            "SELECT rotate_covered FROM member_catalog WHERE name = $1",
            &[&SET],
        )
        .unwrap()
        .get(0)
    };
    assert!(
        wait_until(Duration::from_secs(30), || reports(pg).len() == 1),
        "the node never reported that its filter covers the end: {:?}",
        reports(pg)
    );
    assert!(!reports(pg).iter().any(|n| n == LAGGING));
    // Several steps of the rotation run meanwhile (a tenth of a second apart).
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        covered(pg),
        Some(false),
        "recorded before every node covered"
    );
    pg.execute(
        "UPDATE member_nodes SET covered = $2 WHERE node = $1",
        &[&LAGGING, &format!("{SET}:2")],
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || covered(pg) == Some(true)),
        "every node reports its filter covers the end, and the catalog never said so"
    );
    // Logged once the step is back on the main thread, a moment after its commit.
    assert!(
        wait_until(Duration::from_secs(10), || env
            .vk
            .log()
            .contains("every node's filter covers the end")),
        "the log never said every node's filter covers the end"
    );
}

fn node_phase(env: &Env, pg: &mut postgres::Client, c: &mut redis::Connection, want: &str) {
    assert!(
        shows_phase(c, SET, want),
        "the node never showed phase {want}: {:?} {:?} {:?}\n{:#?}\n{}",
        set_info(c, SET, "token_rotation_form"),
        set_info(c, SET, "token_rotation_waiting_for"),
        set_info(c, SET, "token_rotation_last_error"),
        activity(pg),
        support::lifecycle::log_tail(&env.vk)
    );
}

/// A node of `SET` (debug build, so its writes can be held) with `items` added, its rotation
/// to k2 in the switching phase and held there by a lagging node's report (a second node
/// that reports the old form: the rotation waits for it before its drain, for as long as the
/// test keeps its report). The key file lives as long as the returned node.
fn switching_with_the_drain_held(
    items: &[&str],
) -> (KeyFile, Env, redis::Connection, postgres::Client) {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    // Enough workers for the held writes, the drain's held step and the node's upkeep; a
    // database timeout longer than any hold.
    let env = Env::debug_build(&[
        ("member.token-key-file", file.path()),
        ("member.db-timeout-ms", "60000"),
        ("member.workers", "8"),
    ]);
    let mut c = env.conn();
    create_synced(&mut c, SET, &["TOKENIZE", "hmac-sha256"]);
    for i in items {
        assert_eq!(int(&mut c, &["MEMBER.ADD", SET, i]), 1);
    }
    let mut pg = env.pg();
    report_lagging_node(&mut pg, SET);
    rotate_key(&mut c, SET, "k2");
    assert!(
        wait_until(Duration::from_secs(60), || phase(&mut pg).as_deref()
            == Some("switching")),
        "the rotation never reached its end: {:?}",
        set_info(&mut c, SET, "token_rotation_last_error")
    );
    node_phase(&env, &mut pg, &mut c, "switching");
    (file, env, c, pg)
}

/// A session that holds the write failpoint of `SET` (`members::HELD_PREFIX`): its writes
/// wait on their workers, before their statements, until it lets go.
fn hold_writes(env: &Env) -> postgres::Client {
    let mut failpoint = env.pg();
    crate::support::rotation::hold_writes(&mut failpoint, SET);
    failpoint
}

#[test]
fn a_write_planned_before_the_drain_and_made_in_it_keeps_both_forms() {
    let (_file, env, mut c, mut pg) = switching_with_the_drain_held(&["kept", "doomed"]);
    assert!(wait_until(Duration::from_secs(30), || set_info(
        &mut c,
        SET,
        "token_rotation_waiting_for"
    )
    .is_ok_and(|w| w.contains(LAGGING))));
    every_filter_covers_the_end(&env, &mut pg);

    // The drain's deletes will wait for the change log (its trigger writes there); the writes
    // wait for the failpoint.
    let mut log_lock = env.pg();
    log_lock
        .batch_execute("BEGIN; LOCK TABLE member_changes IN SHARE MODE")
        .unwrap();
    let mut failpoint = hold_writes(&env);
    // Planned while the node makes twins: both forms. One at a time: jobs sent in one event
    // loop iteration may share a worker, which runs them in turn.
    let (tx, done) = std::sync::mpsc::channel();
    for (n, (command, item)) in [("MEMBER.ADD", "late"), ("MEMBER.DEL", "doomed")]
        .into_iter()
        .enumerate()
    {
        let port = env.vk.port();
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .unwrap()
                .get_connection()
                .unwrap();
            let got = cmd(&mut c, &[command, SET, item]);
            let _ = tx.send(format!("{command} {item}: {got:?}"));
        });
        wait_waiting(
            &mut pg,
            &["advisory"],
            "%pg_advisory_lock_shared%",
            n as i64 + 1,
            &|| {
                format!(
                    "{command} never reached the failpoint ({:?})",
                    done.try_iter().collect::<Vec<_>>()
                )
            },
        );
    }

    // The lagging node goes: the drain starts, and the node learns it.
    pg.execute("DELETE FROM member_nodes WHERE node = $1", &[&LAGGING])
        .unwrap();
    node_phase(&env, &mut pg, &mut c, "draining");
    // The writes go on, up to the change log's lock: in the database before the drain ends.
    failpoint
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    let table = format!("member_{SET}");
    wait_waiting(
        &mut pg,
        &["relation"],
        &format!("WITH was AS %INSERT INTO {table} %"),
        1,
        &|| {
            format!(
                "the ADD never reached the database ({:?})\n{}",
                done.try_iter().collect::<Vec<_>>(),
                support::lifecycle::log_tail(&env.vk)
            )
        },
    );
    // The DEL waits either for the change log too (it deleted both forms first), or for the
    // drain's step, which deleted the old form first and waits for the log itself: whichever
    // reached the row first, as the drain's step starts when the drain does.
    wait_waiting(
        &mut pg,
        &["relation", "transactionid"],
        &format!("DELETE FROM {table} WHERE entity_id %"),
        1,
        &|| {
            format!(
                "the DEL never reached the database ({:?})",
                done.try_iter().collect::<Vec<_>>()
            )
        },
    );
    log_lock.batch_execute("ROLLBACK").unwrap();
    let mut replies: Vec<String> = done.iter().take(2).collect();
    replies.sort();
    assert_eq!(
        replies,
        [
            "MEMBER.ADD late: Ok(int(1))",
            "MEMBER.DEL doomed: Ok(int(1))"
        ]
    );

    assert!(
        wait_until(Duration::from_secs(60), || {
            set_info(&mut c, SET, "token_rotation").as_deref() == Ok("none")
                && set_info(&mut c, SET, "token_key_id").as_deref() == Ok("default>k2")
        }),
        "the rotation never ended: {:?}\n{}",
        set_info(&mut c, SET, "token_rotation_last_error"),
        support::lifecycle::log_tail(&env.vk)
    );
    let items = ["kept", "late", "doomed", "never"];
    let want = [1, 1, 0, 0];
    for (i, w) in items.iter().zip(want) {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", SET, i]), w, "EXISTS {i}");
    }
    let mut k = redis::cmd("MEMBER.MEXISTS");
    k.arg(SET).arg("ITEMS").arg(&items[..]);
    assert_eq!(k.query::<Vec<i64>>(&mut c).unwrap(), want);
    // In the database: the two members, each once, in the new form.
    let rows: i64 = pg
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 2, "kept and late, in the new form only");
    // Once a rebuild drops the bits of every form written before, the answers stay.
    cmd(&mut c, &["MEMBER.REBUILD", SET, "SYNC"]).unwrap();
    for (i, w) in items.iter().zip(want) {
        assert_eq!(
            int(&mut c, &["MEMBER.EXISTS", SET, i]),
            w,
            "EXISTS {i} after a rebuild"
        );
    }
}

/// An ADD planned with its twin in the switching phase, held until the drain has ended (the
/// `twin` column dropped): its statement stores nothing, and the client is told to retry
/// (`TRYAGAIN`, not the database's "column does not exist"); the retry, planned in the form
/// the set has now, stores the item once, in the new form.
#[test]
fn an_add_planned_with_its_twin_and_made_after_the_drain_ends_is_retried() {
    let (_file, env, mut c, mut pg) = switching_with_the_drain_held(&["kept"]);

    let mut failpoint = hold_writes(&env);
    let port = env.vk.port();
    let held = std::thread::spawn(move || {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        cmd(&mut c, &["MEMBER.ADD", SET, "late"])
    });
    wait_waiting(
        &mut pg,
        &["advisory"],
        "%pg_advisory_lock_shared%",
        1,
        &|| "the ADD never reached the failpoint".into(),
    );

    // The lagging node goes: the drain runs to its end under the held ADD.
    pg.execute("DELETE FROM member_nodes WHERE node = $1", &[&LAGGING])
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || {
            set_info(&mut c, SET, "token_rotation").as_deref() == Ok("none")
                && set_info(&mut c, SET, "token_key_id").as_deref() == Ok("default>k2")
        }),
        "the rotation never ended: {:?}\n{}",
        set_info(&mut c, SET, "token_rotation_last_error"),
        support::lifecycle::log_tail(&env.vk)
    );
    failpoint
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    let refused = held
        .join()
        .unwrap()
        .expect_err("the held ADD was not refused");
    assert_eq!(refused.code(), Some("TRYAGAIN"), "{refused}");
    assert!(
        refused
            .to_string()
            .contains("key rotation ended while this write"),
        "{refused}"
    );

    assert_eq!(int(&mut c, &["MEMBER.ADD", SET, "late"]), 1);
    for (item, want) in [("kept", 1), ("late", 1), ("never", 0)] {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", SET, item]), want, "{item}");
    }
    let table = format!("member_{SET}");
    let rows: i64 = pg
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 2, "kept and late, in the new form only");
}
