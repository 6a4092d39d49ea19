//! A rebuild in bounded memory (docs/sync.md, "Rebuilding in bounded memory"): the rows a
//! build reads past a quarter of `member.build-memory` go to an unnamed file, and the static
//! part is built in as many parts as keep its constructions within the rest, so the server's
//! peak memory during a rebuild rises by at most the budget plus twice the filter, whatever
//! the number of rows; under a `maxmemory` too tight for the new filter the rebuild fails
//! cleanly and the old filter keeps serving.
use crate::support;

use std::time::Duration;

use redis::{Connection, Value};
use support::lifecycle::*;
use support::member::*;
use support::wait_until;

fn number(c: &mut Connection, set: &str, field: &str) -> i64 {
    let v = set_info(c, set, field).unwrap();
    v.parse()
        .unwrap_or_else(|e| panic!("MEMBER.INFO {set} {field} {v:?}: {e}"))
}

/// Fills `set` with `rows` rows written outside the module and waits until the sync pass
/// applied them.
fn fill(env: &Env, c: &mut Connection, set: &str, rows: i64) {
    env.pg()
        .batch_execute(&format!(
            "INSERT INTO member_{set} (entity_id) SELECT 'r-' || g FROM generate_series(1, {rows}) g"
        ))
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(180), || number(
            c,
            set,
            "sync_rows_applied"
        ) >= rows),
        "the sync pass never applied {rows} rows: {:?}\n{}",
        info_all(c, set),
        log_tail(&env.vk)
    );
}

fn rebuild_and_wait(c: &mut Connection, set: &str) -> Result<i64, String> {
    // A debug build reading many rows on a busy machine may take minutes.
    c.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    match cmd(c, &["MEMBER.REBUILD", set, "SYNC"]) {
        Ok(Value::Int(rows)) => Ok(rows),
        Ok(other) => panic!("MEMBER.REBUILD SYNC answered {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn a_rebuild_stays_within_its_budget_and_spills_the_rest() {
    // 1 MB for the build (the least it takes): 256 KB of rows in memory, the rest spilled;
    // 512 KB of constructions. Before, a rebuild held ~57 bytes a row: 17 MB for these rows.
    let env = env(&[("member.build-memory", "1mb")]);
    let mut c = env.conn();
    create(&mut c, "big", &["CAPACITY", "300000"]);
    wait_info(&env.vk, &mut c, "big", "filter_caught_up", "1", SETTLE);
    fill(&env, &mut c, "big", 300_000);
    // The server's peak memory is never reset, and the sync pass that applied the rows has a
    // peak of its own (its pages, up to 8 MB). So the rebuild is measured on a second server
    // over the same database, whose only work has been builds: its first build at start and
    // the rebuild below, both under the same budget.
    let built = support::member::start_loaded(&env.db.url(), &[("member.build-memory", "1mb")]);
    let mut c = built.conn();
    wait_info(
        &built,
        &mut c,
        "big",
        "filter_complete",
        "1",
        REBUILD_TIMEOUT,
    );
    // Settle, then rebuild: the filter, its payload and the build's share of
    // member.build-memory are all the rebuild may add to the peak.
    let settled: i64 = info_number(&mut c, "memory", "used_memory");
    assert_eq!(rebuild_and_wait(&mut c, "big"), Ok(300_000));
    let filter = number(&mut c, "big", "filter_bytes");
    let rise = peak_allocated(&mut c) - settled;
    let allowed = (1 << 20) + 2 * filter + (4 << 20);
    eprintln!("rebuild of 300 000 rows: peak rose {rise} bytes over used_memory {settled} (filter {filter} bytes, allowed {allowed})");
    assert!(
        rise <= allowed,
        "the rebuild raised the peak by {rise} bytes (filter {filter} bytes, allowed {allowed})"
    );
    // Its rows went through the spill file, its static part is in many parts, and every
    // row is in the filter.
    let log = built.log();
    let line = log
        .lines()
        .find(|l| l.contains("rebuilt set 'big' (manual"))
        .unwrap_or_else(|| panic!("no rebuild logged:\n{}", log_tail(&built)));
    assert!(
        line.contains("bytes of rows spilled to a file") && !line.contains(" 0 bytes of rows"),
        "{line}"
    );
    assert!(number(&mut c, "big", "filter_static_parts") > 1);
    let sample: Vec<String> = [1, 2, 99_999, 150_000, 299_999, 300_000]
        .iter()
        .map(|i| format!("r-{i}"))
        .collect();
    assert_in_filter(&built, &mut c, "big", &sample, "after the rebuild");
    assert_rejected(&built, &mut c, "big", "never-written", "after the rebuild");
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "big", "r-277777"]), 1);
    // The spill file was unlinked when it was made: nothing is left in the server's dir.
    let left: Vec<String> = std::fs::read_dir(built.dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("libmember-build-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_rebuild_under_a_tight_maxmemory_fails_cleanly_and_the_old_filter_serves() {
    let env = env(&[]);
    let mut c = env.conn();
    create(&mut c, "tight", &["CAPACITY", "4000000"]);
    wait_info(&env.vk, &mut c, "tight", "filter_caught_up", "1", SETTLE);
    fill(&env, &mut c, "tight", 10_000);
    ok(
        &mut c,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    );
    let mut p = redis::pipe();
    for i in 0..2_000 {
        p.cmd("SET").arg(format!("app:{i}")).arg("v").ignore();
    }
    p.query::<()>(&mut c).unwrap();
    // Room for the application, not for a filter of 4 M members (about 4.8 MB): the rebuild is
    // refused before it reads a row.
    let used = info_number(&mut c, "memory", "used_memory");
    ok(
        &mut c,
        &[
            "CONFIG",
            "SET",
            "maxmemory",
            &(used + (3 << 20)).to_string(),
        ],
    );
    // The budget is measured once a second on the main thread: wait until it shows the new
    // headroom (about 3 MB, under the filter's 4.8 MB).
    assert!(
        wait_until(Duration::from_secs(10), || info_field(
            &mut c,
            "memory_budget"
        )
        .is_ok_and(|b| b.parse::<i64>().is_ok_and(|b| b < 4 << 20))),
        "the module never measured the new headroom: memory_budget {:?}",
        info_field(&mut c, "memory_budget")
    );
    let why = rebuild_and_wait(&mut c, "tight").expect_err("the rebuild was refused");
    assert!(why.contains("maxmemory"), "{why}");
    ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(info_number(&mut c, "stats", "evicted_keys"), 0);
    let sample: Vec<String> = [1, 5_000, 10_000]
        .iter()
        .map(|i| format!("r-{i}"))
        .collect();
    assert_in_filter(
        &env.vk,
        &mut c,
        "tight",
        &sample,
        "after the refused rebuild",
    );
    assert_rejected(
        &env.vk,
        &mut c,
        "tight",
        "never-written",
        "after the refused rebuild",
    );
}
