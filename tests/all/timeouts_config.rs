//! Timeouts follow the configuration (docs/operations.md, "Timeouts"): after `CONFIG SET
//! member.db-timeout-ms` on a running node, the next statement of every worker connection,
//! opened before the change, direct or through pgbouncer in either mode, runs under the new
//! value. A lookup's statement ends in the database at the client's timeout; an ADD's keeps
//! its landing slack (four times the timeout), so one that waited behind a lock still lands.
use crate::support;

use std::time::Duration;

use redis::Value;
use support::member::*;
use support::pgbouncer::{Mode, Pgbouncer};
use support::wait_until;

/// Module statements of `kind` (`SELECT`, `INSERT`) on set `s`'s table waiting for a lock.
fn waiting(pg: &mut postgres::Client, kind: &str) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()
            AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%member_s%'",
        &[&kind],
    )
    .unwrap()
    .get(0)
}

fn run(e: &Env, logs: impl Fn() -> String) {
    let mut c = e.conn();
    create_synced(&mut c, "s", &[]);
    let mut pg = e.pg();
    pg.batch_execute("INSERT INTO member_s (entity_id) VALUES ('k1'), ('k2')")
        .unwrap();
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]), 2);
    // Every worker connection opens under the old value (12 s for statements, 3 s for
    // lookups): a round of lookups and writes through all of them.
    for i in 0..16 {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", &format!("warm{i}")]), 1);
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "k2"]), 1);
    }
    ok(&mut c, &["CONFIG", "SET", "member.db-timeout-ms", "1000"]);
    let mut locker = e.pg();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_s IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    // A lookup: its client gets UNAVAILABLE at 1 s, and its statement ends in the database
    // with it, not 12 s (the old value's four times) or 4 s (the new one's) later.
    let answer = err(&mut c, &["MEMBER.EXISTS", "s", "k1"]);
    assert!(answer.starts_with("UNAVAILABLE"), "{answer}");
    let mut watcher = e.pg();
    assert!(
        wait_until(Duration::from_secs(3), || waiting(&mut watcher, "SELECT")
            == 0),
        "the lookup's statement still waits in the database after its client gave up\n{}",
        logs()
    );
    // An ADD: its client gets UNAVAILABLE at 1 s, and its statement waits on (the landing
    // slack, 4 s): released now, it commits and reaches the filter.
    let answer = err(&mut c, &["MEMBER.ADD", "s", "late"]);
    assert!(answer.starts_with("UNAVAILABLE"), "{answer}");
    assert_eq!(
        waiting(&mut watcher, "INSERT"),
        1,
        "the ADD's statement no longer waits\n{}",
        logs()
    );
    locker.batch_execute("COMMIT").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || {
            pg.query_opt("SELECT 1 FROM member_s WHERE entity_id = 'late'", &[])
                .unwrap()
                .is_some()
        }),
        "the late ADD never committed\n{}",
        logs()
    );
    assert!(
        wait_until(Duration::from_secs(10), || cmd(
            &mut c,
            &["MEMBER.EXISTS", "s", "late"]
        )
        .is_ok_and(|v| v == Value::Int(1))),
        "the late ADD never answered 1"
    );
}

#[test]
fn direct_connections_follow_a_changed_timeout() {
    let e = Env::with(&[("member.db-timeout-ms", "3000")]);
    run(&e, || e.vk.log());
}

fn through(mode: Mode) {
    let pb = Pgbouncer::get(mode);
    let e = Env::through(|db| pb.url(db), &[("member.db-timeout-ms", "3000")]);
    run(&e, || {
        format!("module:\n{}\npgbouncer:\n{}", e.vk.log(), pb.log())
    });
}

#[test]
fn session_pooled_connections_follow_a_changed_timeout() {
    through(Mode::Session);
}

#[test]
fn transaction_pooled_connections_follow_a_changed_timeout() {
    through(Mode::Transaction);
}
