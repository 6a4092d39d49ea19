//! A sync pass in bounded memory (issue 25, docs/sync.md "Paging"): a bulk INSERT of a million
//! rows made outside the module reaches the filter without the server's peak memory growing
//! with the rows, so under `maxmemory` and `allkeys-lru` none of the application's own keys is
//! evicted to make room for the pass.
mod support;

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use support::lifecycle::*;
use support::member::*;
use support::wait_until;

/// Rows the outside INSERT writes.
const ROWS: i64 = 1_000_000;
/// The application's own keys, which must all survive the pass.
const APP_KEYS: usize = 2_000;
/// What the pass may add to the server's peak memory (before paging: ~390 bytes per row,
/// 376 MB for these rows).
const PEAK_BUDGET: i64 = 64 << 20;

/// `peak.allocated` of `MEMORY STATS`.
fn peak_allocated(c: &mut Connection) -> i64 {
    let stats: Vec<Value> = redis::cmd("MEMORY").arg("STATS").query(c).unwrap();
    stats
        .chunks(2)
        .find_map(|p| match (&p[0], &p[1]) {
            (Value::BulkString(k), Value::Int(v)) if k == b"peak.allocated" => Some(*v),
            (Value::SimpleString(k), Value::Int(v)) if k == "peak.allocated" => Some(*v),
            _ => None,
        })
        .expect("MEMORY STATS has peak.allocated")
}

fn rows_applied(c: &mut Connection, set: &str) -> i64 {
    set_info(c, set, "sync_rows_applied")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn an_outside_bulk_insert_is_synced_without_evicting_the_applications_keys() {
    let env = env(&[]);
    let mut c = env.conn();
    // Sized for the rows: no auto-grow rebuild (a cost of its own) during the test.
    create(&mut c, "bulk", &["CAPACITY", "2000000"]);
    wait_info(&env.vk, &mut c, "bulk", "filter_caught_up", "1", SETTLE);
    ok(&mut c, &["CONFIG", "SET", "maxmemory", "200mb"]);
    ok(
        &mut c,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    );
    let mut p = redis::pipe();
    for i in 0..APP_KEYS {
        p.cmd("SET").arg(format!("app:{i}")).arg("v").ignore();
    }
    p.query::<()>(&mut c).unwrap();
    let before = peak_allocated(&mut c);

    let t = Instant::now();
    env.pg()
        .batch_execute(&format!(
            "INSERT INTO member_bulk (entity_id) SELECT 'bulk-' || g FROM generate_series(1, {ROWS}) g"
        ))
        .unwrap();
    let committed = t.elapsed();
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(180), || rows_applied(&mut c, "bulk")
            >= ROWS),
        "the pass never applied the {ROWS} rows: MEMBER.INFO {:?}, evicted_keys {}, DBSIZE {}\n{}",
        info_all(&mut c, "bulk"),
        info_number(&mut c, "stats", "evicted_keys"),
        int(&mut c, &["DBSIZE"]),
        log_tail(&env.vk)
    );
    eprintln!(
        "insert committed in {committed:?}; rows applied {:?} later; peak.allocated {} -> {}",
        t.elapsed(),
        before,
        peak_allocated(&mut c)
    );
    // Every row is in the filter, and the filter is trusted again (it caught up past them).
    let sample: Vec<String> = [1, 2, 499_999, 500_000, 777_777, 999_999, ROWS]
        .iter()
        .map(|i| format!("bulk-{i}"))
        .collect();
    wait_info(&env.vk, &mut c, "bulk", "filter_caught_up", "1", SETTLE);
    assert_in_filter(&env.vk, &mut c, "bulk", &sample, "after the bulk insert");
    assert_rejected(
        &env.vk,
        &mut c,
        "bulk",
        "never-inserted",
        "after the bulk insert",
    );

    assert_eq!(info_number(&mut c, "stats", "evicted_keys"), 0);
    let mut p = redis::pipe();
    for i in 0..APP_KEYS {
        p.cmd("EXISTS").arg(format!("app:{i}"));
    }
    let alive: Vec<i64> = p.query(&mut c).unwrap();
    assert_eq!(
        alive.iter().sum::<i64>(),
        APP_KEYS as i64,
        "application keys were evicted"
    );
    let rise = peak_allocated(&mut c) - before;
    assert!(
        rise < PEAK_BUDGET,
        "the pass raised peak.allocated by {rise} bytes for {ROWS} rows"
    );
}
