//! Helpers of the fault-injection tests (`tests/all/faults.rs`, `tests/all/timeouts.rs`): the short
//! database timeout they run with, calls that must fail with `UNAVAILABLE` in time or must
//! answer, and looks into PostgreSQL that prove a fault is really in place.

use std::time::{Duration, Instant};

use redis::{Connection, Value};

use super::member::*;
use super::{wait_until, Valkey};

/// `member.db-timeout-ms` for every test here. The module's statement timeout is then
/// 4 × 500 ms = 2 s: a write stuck on a lock still lands if the lock goes within 2 s.
pub const DB_TIMEOUT_MS: u64 = 500;
pub const FAST: [(&str, &str); 1] = [("member.db-timeout-ms", "500")];

/// Switches a running server to [`DB_TIMEOUT_MS`] once the set-up is done: a CREATE, or the
/// first statements of a fresh server, can take longer than 500 ms on a busy machine, and a
/// test about timeouts must time out only where it puts its fault.
pub fn go_fast(c: &mut Connection) {
    ok(c, &["CONFIG", "SET", FAST[0].0, FAST[0].1]);
}

/// A generous `member.db-timeout-ms` (10 s), once a test's fault is gone and what it checks
/// is that calls answer again.
pub fn go_patient(c: &mut Connection) {
    ok(c, &["CONFIG", "SET", FAST[0].0, "10000"]);
}

/// Upper bound for any error reply: the timeout plus generous slack. Not a performance
/// assertion, only "no hang".
pub fn no_hang() -> Duration {
    Duration::from_millis(DB_TIMEOUT_MS) + Duration::from_secs(2)
}

/// The error text ("CODE detail") of a redis error.
pub fn error_text(e: &redis::RedisError) -> String {
    format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
        .trim()
        .to_string()
}

/// Runs a call that must fail with `UNAVAILABLE ...` within [`no_hang`]; returns the text.
pub fn unavailable(vk: &Valkey, c: &mut Connection, args: &[&str]) -> String {
    let t = Instant::now();
    let res = cmd(c, args);
    let took = t.elapsed();
    let text = match res {
        Ok(v) => panic!(
            "{args:?}: expected an UNAVAILABLE error, got the answer {v:?} after {took:?}\nvalkey log:\n{}",
            vk.log()
        ),
        Err(e) => error_text(&e),
    };
    assert!(
        text.starts_with("UNAVAILABLE"),
        "{args:?}: expected an UNAVAILABLE error, got {text:?}\nvalkey log:\n{}",
        vk.log()
    );
    assert!(
        took <= no_hang(),
        "{args:?}: the error took {took:?} (db-timeout {DB_TIMEOUT_MS} ms)\nvalkey log:\n{}",
        vk.log()
    );
    text
}

/// One EXISTS while the database may be unavailable: `Some(answer)` or `None` for an
/// `UNAVAILABLE` error. Any other error or reply type fails the test.
pub fn exists_or_unavailable(
    vk: &Valkey,
    c: &mut Connection,
    set: &str,
    item: &str,
) -> Option<i64> {
    match cmd(c, &["MEMBER.EXISTS", set, item]) {
        Ok(Value::Int(n)) => Some(n),
        Ok(v) => panic!("EXISTS {set} {item}: unexpected reply {v:?}"),
        Err(e) => {
            let text = error_text(&e);
            assert!(
                text.starts_with("UNAVAILABLE"),
                "EXISTS {set} {item}: expected 0/1 or UNAVAILABLE, got {text:?}\nvalkey log:\n{}",
                vk.log()
            );
            None
        }
    }
}

/// Waits until `vk` has logged a failed load of the set catalog (PostgreSQL unreachable).
pub fn wait_failed_catalog_load(vk: &Valkey) {
    assert!(
        wait_until(Duration::from_secs(10), || vk
            .log()
            .contains("cannot load the set catalog")),
        "no failed catalog load logged\nvalkey log:\n{}",
        vk.log()
    );
}

/// Runs a call that must answer (the database is up); an error fails with the server log.
pub fn must_answer(vk: &Valkey, c: &mut Connection, args: &[&str]) -> Value {
    cmd(c, args).unwrap_or_else(|e| {
        panic!(
            "{args:?} failed with {:?} while PostgreSQL is up\nvalkey log:\n{}",
            error_text(&e),
            vk.log()
        )
    })
}

/// Polls EXISTS until it answers; that first answer must be `want` (a wrong 0/1 on the way
/// fails at once). Errors (`UNAVAILABLE`) while waiting are fine.
pub fn wait_for_answer(
    vk: &Valkey,
    c: &mut Connection,
    set: &str,
    item: &str,
    want: i64,
    timeout: Duration,
) {
    let mut errors = 0;
    let answered = wait_until(timeout, || match exists_or_unavailable(vk, c, set, item) {
        Some(n) => {
            assert_eq!(
                n,
                want,
                "EXISTS {set} {item} answered {n}, PostgreSQL says {want}\nvalkey log:\n{}",
                vk.log()
            );
            true
        }
        None => {
            errors += 1;
            false
        }
    });
    assert!(
        answered,
        "EXISTS {set} {item} still UNAVAILABLE after {timeout:?} ({errors} UNAVAILABLE errors)\nvalkey log:\n{}",
        vk.log()
    );
}

/// An item whose lookup the filter of `set` rejects (EXPLAIN says bloom-negative).
pub fn bloom_negative_item(c: &mut Connection, set: &str, prefix: &str) -> String {
    (0..200)
        .map(|i| format!("{prefix}-{i}"))
        .find(|item| explain(c, set, item) == (0, "bloom-negative".to_string()))
        .unwrap_or_else(|| panic!("no bloom-negative item with prefix {prefix} in {set}"))
}

/// Active rows for `item` (unscoped) in PostgreSQL.
pub fn pg_active(pg: &mut postgres::Client, set: &str, item: &str) -> i64 {
    pg.query_one(
        &format!(
            "SELECT count(*) FROM member_{set} WHERE entity_id = $1 AND scope = '' AND status = 1
             AND (expires_at IS NULL OR expires_at > now())"
        ),
        &[&item],
    )
    .unwrap()
    .get(0)
}

/// Sessions of the module waiting on a lock (proof that a fault is really in place).
pub fn module_sessions_waiting_on_lock(pg: &mut postgres::Client) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = 'libmember' AND wait_event_type = 'Lock'",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Calls made right after recovery, each needing the database: more than the 4 workers.
pub const RECOVERY_CALLS: usize = 12;

/// Every call that needs the database answers: EXISTS of `e-<i>` (in the filter, never looked
/// up, so not cached) is 1 and ADD of `d-<i>` is 1 and lands in PostgreSQL, RECOVERY_CALLS
/// times, more than there are workers, so each worker's connection gets used.
pub fn every_call_answers(vk: &Valkey, c: &mut Connection, pgc: &mut postgres::Client, set: &str) {
    for i in 0..RECOVERY_CALLS {
        let e = format!("e-{i}");
        assert_eq!(
            must_answer(vk, c, &["MEMBER.EXISTS", set, &e]),
            Value::Int(1),
            "EXISTS {e}"
        );
        let d = format!("d-{i}");
        assert_eq!(
            must_answer(vk, c, &["MEMBER.ADD", set, &d]),
            Value::Int(1),
            "ADD {d}"
        );
        assert_eq!(pg_active(pgc, set, &d), 1);
    }
}

/// Sessions the module holds open in PostgreSQL.
pub fn module_sessions(pg: &mut postgres::Client) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'libmember'",
        &[],
    )
    .unwrap()
    .get(0)
}
