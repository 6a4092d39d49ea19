//! A command a node planned before it learned its set's rotation asks (or deletes) the old
//! form alone: the rotation rewrites no row while one can still reach the database. A node
//! reports that it follows the rotation only once every job it submitted before it learned
//! the rotation has ended (`db::in_flight`; docs/rotation-in-place.md, "Rewriting"). Held by
//! the debug build's write failpoint (`members::HELD_PREFIX`), so the order is the same on
//! any machine.
use crate::support;

use std::time::Duration;

use support::member::*;
use support::rotation::{hold_writes, rotate_key, shows_phase};
use support::wait_until;

use super::key_rotation_held::wait_waiting;
use super::tokenize::{KeyFile, KEY1, KEY2};

/// A set whose writes wait for the test's failpoint lock (debug builds).
const SET: &str = "failpoint_held_planned";

/// When this node's report was last written, and what it says it computes, by the database's
/// clock.
fn report(pg: &mut postgres::Client) -> (std::time::SystemTime, String) {
    let r = pg
        .query_one(
            "SELECT seen_at, serving FROM member_nodes ORDER BY seen_at DESC LIMIT 1",
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

#[test]
fn a_rotation_rewrites_no_row_while_a_command_planned_before_it_is_in_flight() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    // Workers enough for the held DEL, the rotation's start and steps, and the node's upkeep;
    // a database timeout longer than the hold.
    let env = Env::debug_build(&[
        ("member.token-key-file", file.path()),
        ("member.db-timeout-ms", "60000"),
        ("member.workers", "8"),
    ]);
    let mut c = env.conn();
    create_synced(&mut c, SET, &["TOKENIZE", "hmac-sha256"]);
    for i in ["doomed", "kept"] {
        assert_eq!(int(&mut c, &["MEMBER.ADD", SET, i]), 1);
    }
    let mut pg = env.pg();
    let mut failpoint = env.pg();
    hold_writes(&mut failpoint, SET);

    // A DEL planned before the rotation (the old form alone), held at its worker.
    let port = env.vk.port();
    let held = std::thread::spawn(move || {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        cmd(&mut c, &["MEMBER.DEL", SET, "doomed"])
    });
    wait_waiting(
        &mut pg,
        &["advisory"],
        "%pg_advisory_lock_shared%",
        1,
        &|| "the DEL never reached the failpoint".into(),
    );

    rotate_key(&mut c, SET, "k2");
    assert!(shows_phase(&mut c, SET, "rewriting"));
    // A report written after the node learned the rotation: it does not say the node follows
    // it (the DEL is in flight), so the rotation waits for this node and rewrites no row.
    let learned: std::time::SystemTime = pg.query_one("SELECT now()", &[]).unwrap().get(0);
    assert!(
        wait_until(Duration::from_secs(30), || report(&mut pg).0 > learned),
        "the node wrote no report"
    );
    let (_, serving) = report(&mut pg);
    assert!(
        !serving.contains(SET),
        "the node said it follows the rotation with a DEL of the old form in flight: {serving}"
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            set_info(&mut c, SET, "token_rotation_waiting_for").is_ok_and(|w| !w.is_empty())
        }),
        "the rotation never waited for the node"
    );
    let rewritten: i64 = pg
        .query_one(
            &format!("SELECT count(*) FROM member_{SET} WHERE twin IS NOT NULL"),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(rewritten, 0, "rows rewritten while the DEL was in flight");

    // Let go: the DEL deletes the row it was planned for, then the rotation runs to its end.
    failpoint
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    assert_eq!(
        held.join().unwrap().map(|v| v == redis::Value::Int(1)),
        Ok(true)
    );
    assert!(
        wait_until(Duration::from_secs(60), || {
            set_info(&mut c, SET, "token_rotation").as_deref() == Ok("none")
        }),
        "the rotation never ended: {:?}\n{}",
        set_info(&mut c, SET, "token_rotation_last_error"),
        support::lifecycle::log_tail(&env.vk)
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", SET, "doomed"]), 0);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", SET, "kept"]), 1);
}
