//! Filter lifecycle end to end, while the server runs: replication and promotion,
//! MEMBER.REBUILD (exact count, refusals, a race with 10 000 ADDs, failure), rows written
//! outside the module (sync loop, late commits). Restarts and data files: `tests/all/lifecycle.rs`,
//! whose contract this file tests too.
use crate::support;

use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;
use support::lifecycle::*;
use support::member::*;
use support::{wait_until, Valkey};

// ---------------------------------------------------------------------------------------------
// replication

#[test]
fn replica_and_promotion() {
    // No 5 s wait before the full sync.
    let env = env(&[("repl-diskless-sync-delay", "0")]);
    // The replica's own sync loop stays quiet: only the replicated MEMBER._ADD can put an
    // item into its filter (until the promotion, which triggers a catch-up pass).
    let (replica, mut r) = start_quiet_replica(&env);
    let mut p = env.conn();

    create(&mut p, "s", &[]);
    // The replica learns the set through replication (the definition and the filter
    // together; naming the set before they arrive would have it ask the catalog and wait for
    // the filter on its own) and runs its one sync pass before any ADD.
    assert!(
        wait_until(Duration::from_secs(20), || info_field(&mut r, "sets")
            .as_deref()
            == Ok("1")),
        "the replica never learned the set\nreplica log:\n{}",
        log_tail(&replica)
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            let info = info_all(&mut r, "s");
            field(&info, "sync_age_ms").is_some_and(|v| v != "never")
                || field(&info, "sync_last_error").is_some()
        }),
        "the replica never learned the set or never ran a sync pass: {:?}\nreplica log:\n{}",
        info_all(&mut r, "s"),
        log_tail(&replica)
    );
    let items = names("item", 20);
    add_all(&env.vk, &mut p, "s", &items);
    // P looks some of them up (and caches them); "r-only" it never looks up.
    assert_members(&env.vk, &mut p, "s", &items[..5], "on the primary");
    add_all(&env.vk, &mut p, "s", &["r-only".to_string()]);

    assert!(
        wait_until(Duration::from_secs(5), || reply(
            &mut r,
            &["MEMBER.EXISTS", "s", "r-only"]
        ) == Some(1)),
        "the replica never answered 1 for r-only: {:?}\nreplica log:\n{}",
        cmd(&mut r, &["MEMBER.EXISTS", "s", "r-only"]),
        log_tail(&replica)
    );
    assert_members(&replica, &mut r, "s", &items, "on the replica");
    assert_eq!(int(&mut r, &["MEMBER.EXISTS", "s", "never-added"]), 0);
    let e = err(&mut r, &["MEMBER.ADD", "s", "on-replica"]);
    assert!(e.starts_with("READONLY"), "ADD on a replica: {e}");
    // The replica does not fill exact-match keys.
    let cached: i64 = redis::cmd("EXISTS")
        .arg(hit_key("s", "r-only"))
        .query(&mut r)
        .unwrap();
    assert_eq!(
        cached, 0,
        "the replica created a cache key for its own lookup"
    );

    // The replica's filter is trusted and got every replicated MEMBER._ADD.
    thread::sleep(PAST_RECENT);
    assert_rejected(&replica, &mut r, "s", "never-added", "on the replica");
    let mut all = items.clone();
    all.push("r-only".into());
    assert_in_filter(&replica, &mut r, "s", &all, "on the replica");

    // DEL on the primary reaches the replica (its cached entry too, if it has one).
    assert_eq!(int(&mut p, &["MEMBER.DEL", "s", &items[0]]), 1);
    assert!(
        wait_until(Duration::from_secs(5), || reply(
            &mut r,
            &["MEMBER.EXISTS", "s", &items[0]]
        ) == Some(0)),
        "the replica still answers {:?} for a member deleted on the primary\nreplica log:\n{}",
        cmd(&mut r, &["MEMBER.EXISTS", "s", &items[0]]),
        log_tail(&replica)
    );
    let remaining: Vec<String> = all[1..].to_vec();

    // Internal commands are refused from ordinary clients.
    for args in [
        vec!["MEMBER._ADD", "s", "forged", ""],
        vec!["MEMBER._DEL", "s", "item-1", ""],
        vec!["MEMBER._LOAD", "member:s:bloom", "garbage"],
        vec!["MEMBER._SET", "s", "0.5", "1", "1", "1", "none"],
    ] {
        let e = err(&mut p, &args);
        assert!(e.contains("internal command"), "{args:?} -> {e}");
    }
    assert_rejected(
        &env.vk,
        &mut p,
        "s",
        "forged",
        "after a refused MEMBER._ADD",
    );
    assert_members(
        &env.vk,
        &mut p,
        "s",
        &remaining,
        "after refused internal commands",
    );

    // Promotion.
    ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
    assert_members(&replica, &mut r, "s", &remaining, "right after promotion");
    assert_eq!(int(&mut r, &["MEMBER.ADD", "s", "on-promoted"]), 1);
    assert_eq!(int(&mut r, &["MEMBER.EXISTS", "s", "on-promoted"]), 1);
    // Caught up by a pass that started a handover grace (db-timeout + 1 s) after the promotion.
    wait_info(&replica, &mut r, "s", "filter_serves_absent", "1", SETTLE);
    thread::sleep(PAST_RECENT);
    let mut promoted = remaining.clone();
    promoted.push("on-promoted".into());
    assert_in_filter(&replica, &mut r, "s", &promoted, "after promotion");
    assert_rejected(&replica, &mut r, "s", "never-added", "after promotion");
}

// ---------------------------------------------------------------------------------------------
// MEMBER.REBUILD

/// 5 connections × 2000 pipelined ADDs of `race-<conn>-<i>`; returns all items.
fn spawn_adders(vk: &Valkey, set: &str) -> (Vec<thread::JoinHandle<()>>, Vec<String>) {
    let mut all = Vec::new();
    let handles = (0..5)
        .map(|t| {
            let items = names(&format!("race-{t}"), 2000);
            all.extend(items.iter().cloned());
            let mut conn = vk.conn();
            let set = set.to_string();
            thread::spawn(move || {
                let mut p = redis::pipe();
                for it in &items {
                    p.cmd("MEMBER.ADD").arg(&set).arg(it);
                }
                let got: Vec<i64> = p.query(&mut conn).expect("pipelined ADDs");
                assert!(got.iter().all(|&g| g == 1), "an ADD was not new");
            })
        })
        .collect();
    (handles, all)
}

/// Checks `items` in 5 parallel pipelines.
fn assert_in_filter_parallel(vk: &Valkey, set: &str, items: &[String], when: &str) {
    let log = || log_tail(vk);
    let handles: Vec<_> = items
        .chunks(items.len().div_ceil(5))
        .map(|chunk| {
            let chunk = chunk.to_vec();
            let mut conn = vk.conn();
            let set = set.to_string();
            thread::spawn(move || {
                explain_all(&mut conn, &set, &chunk)
                    .into_iter()
                    .zip(chunk)
                    .filter(|((a, path), _)| *a != 1 || path == "bloom-negative")
                    .map(|(res, item)| (item, res))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let wrong: Vec<_> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        wrong.is_empty(),
        "{when}: {} of {} items missing from the filter or not answered 1, e.g. {:?}\nvalkey log:\n{}",
        wrong.len(),
        items.len(),
        &wrong[..wrong.len().min(10)],
        log()
    );
}

#[test]
fn rebuild_sync_and_races() {
    const BULK: i64 = 300_000;
    // Only the rebuild and its journal may put the raced ADDs into the filter, on the primary
    // and on its replica (which receives the swap as MEMBER._LOAD).
    // ADDs held at a lock below wait for it rather than time out.
    let env = env(&[
        SYNC_OFF,
        ("repl-diskless-sync-delay", "0"),
        ("member.db-timeout-ms", "60000"),
    ]);
    let vk = &env.vk;
    let (replica, mut r) = start_quiet_replica(&env);
    let mut c = env.conn();
    // REBUILD SYNC of 300 000 rows in a debug build, on a machine shared with the other
    // tests: give it minutes, not the connection's default minute.
    c.set_read_timeout(Some(std::time::Duration::from_secs(600)))
        .unwrap();
    create(&mut c, "s", &[]);
    // The replica learns the set and runs its one sync pass: from then on its filter is
    // trusted, so a raced ADD missing from it would answer bloom-negative.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let info = info_all(&mut r, "s");
            field(&info, "sync_age_ms").is_some_and(|v| v != "never")
        }),
        "the replica never learned the set or never ran a sync pass: {:?}\nreplica log:\n{}",
        info_all(&mut r, "s"),
        log_tail(&replica)
    );
    let small = names("m", 7);
    add_all(vk, &mut c, "s", &small);
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]), 7);
    assert_eq!(set_info(&mut c, "s", "last_rebuild").as_deref(), Ok("ok"));
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild_rows").as_deref(),
        Ok("7")
    );
    let e = err(&mut c, &["MEMBER.REBUILD", "nosuch"]);
    assert!(e.starts_with("ERR no such set"), "{e}");
    let e = err(&mut c, &["MEMBER.REBUILD", "nosuch", "SYNC"]);
    assert!(e.starts_with("ERR no such set"), "{e}");

    // A slow rebuild: 300k rows. Two REBUILDs back to back: the second is refused.
    env.pg()
        .execute(
            "INSERT INTO member_s (entity_id) SELECT 'bulk-'||g FROM generate_series(1, $1::int8) g",
            &[&BULK],
        )
        .unwrap();
    // The rebuild's read of the table waits for this lock (ACCESS EXCLUSIVE blocks even a
    // read), so the rebuild stays running through the checks below whatever the machine's
    // speed; the lock goes once they are done.
    let mut holder = env.pg();
    holder
        .batch_execute("BEGIN; LOCK TABLE member_s IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let replies = raw_pipeline(vk, &[&["MEMBER.REBUILD", "s"], &["MEMBER.REBUILD", "s"]]);
    assert_eq!(
        replies,
        [
            "+OK",
            "-ERR a rebuild of this set is already running (see MEMBER.INFO)"
        ]
    );
    let info = info_all(&mut c, "s");
    assert_eq!(
        field(&info, "rebuild_state").as_deref(),
        Some("running"),
        "{info:?}"
    );
    for f in [
        "rebuild_rows",
        "rebuild_rows_estimate",
        "rebuild_percent",
        "rebuild_elapsed_s",
    ] {
        assert!(
            field(&info, f).is_some(),
            "{f} missing while running: {info:?}"
        );
    }
    let e = err(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]);
    assert_eq!(
        e,
        "ERR a rebuild of this set is already running (see MEMBER.INFO)"
    );
    holder.batch_execute("COMMIT").unwrap();
    wait_info(vk, &mut c, "s", "rebuild_state", "idle", REBUILD_TIMEOUT);
    assert_eq!(set_info(&mut c, "s", "last_rebuild").as_deref(), Ok("ok"));
    let base = BULK as u64 + 7;
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild_rows"),
        Ok(base.to_string())
    );

    // Race: 10 000 ADDs while a rebuild runs and completes. The rebuild starts once some of
    // them have committed, so its snapshot holds some and its journal (or, for ADDs finishing
    // after the swap, the new filter directly) the others.
    let mut pg = env.pg();
    let count = |pg: &mut postgres::Client| -> i64 {
        pg.query_one("SELECT count(*) FROM member_s", &[])
            .unwrap()
            .get(0)
    };
    let t0 = Instant::now();
    let (adders, raced) = spawn_adders(vk, "s");
    assert!(wait_until(Duration::from_secs(30), || count(&mut pg)
        >= base as i64 + 1000));
    // The other ADDs wait at the table (EXCLUSIVE blocks INSERT, not the rebuild's reads)
    // until the rebuild has its snapshot: it then holds exactly the rows committed so far,
    // whatever the machine's load, and the rest commit while it streams or after its swap.
    let mut locker = env.pg();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_s IN EXCLUSIVE MODE")
        .unwrap();
    let held = count(&mut pg);
    let asked: std::time::SystemTime = pg
        .query_one("SELECT clock_timestamp()", &[])
        .unwrap()
        .get(0);
    ok(&mut c, &["MEMBER.REBUILD", "s"]);
    assert!(
        wait_until(REBUILD_TIMEOUT, || {
            let copying: i64 = pg
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE query LIKE 'COPY (SELECT entity_id, scope FROM member_s %'
                       AND query_start > $1",
                    &[&asked],
                )
                .unwrap()
                .get(0);
            copying > 0
        }),
        "the rebuild never started its COPY"
    );
    locker.batch_execute("COMMIT").unwrap();
    let rebuild_started = t0.elapsed();
    for h in adders {
        h.join().expect("adder thread");
    }
    let adds_done = t0.elapsed();
    let still_running = set_info(&mut c, "s", "rebuild_state");
    wait_info(vk, &mut c, "s", "rebuild_state", "idle", REBUILD_TIMEOUT);
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild").as_deref(),
        Ok("ok"),
        "{:?}",
        info_all(&mut c, "s")
    );
    let rows: u64 = set_info(&mut c, "s", "last_rebuild_rows")
        .unwrap()
        .parse()
        .unwrap();
    let held = held as u64;
    eprintln!(
        "race: rebuild started at {rebuild_started:?}, ADDs done at {adds_done:?} (rebuild then {still_running:?}), \
         its snapshot held {} of the 10000 raced ADDs, its catch-up after the COPY {} more",
        held - base,
        rows as i64 - held as i64
    );
    assert!(
        held > base && held < base + 10_000,
        "the rebuild snapshot should fall in the middle of the ADDs: {} of 10000",
        held - base
    );
    // The count: the rows the snapshot held, and those the change log gave the catch-up
    // after the COPY (committed while it ran), each once (docs/commands.md, MEMBER.REBUILD).
    assert!(
        rows >= held && rows <= base + 10_000,
        "the rebuild counted {rows} members: its snapshot held {held}, and {} ADDs were made",
        base + 10_000
    );
    thread::sleep(PAST_RECENT);
    assert_in_filter_parallel(vk, "s", &raced, "after ADDs raced a rebuild");
    // The replica got the swap and every ADD journaled while the rebuild streamed: the
    // payload is made before the journal is folded in, so those ADDs travel with it.
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut c).unwrap();
    assert_eq!(acked, 1, "the replica did not catch up with the primary");
    // Both large filters (the 300k build and the raced one) were decoded off the replica's
    // main thread, and the ADDs that arrived meanwhile were folded into the second.
    assert!(
        wait_until(SETTLE, || info_field(&mut r, "loads_off_thread")
            .is_ok_and(|v| v.parse::<u64>().is_ok_and(|n| n >= 2))),
        "replica loads_off_thread: {:?}",
        info_field(&mut r, "loads_off_thread")
    );
    assert_rejected(
        &replica,
        &mut r,
        "s",
        "never-added",
        "on the replica after the race",
    );
    assert_in_filter_parallel(
        &replica,
        "s",
        &raced,
        "on the replica after ADDs raced a rebuild",
    );

    // A deleted member leaves the filter at the next rebuild.
    assert_eq!(int(&mut c, &["MEMBER.DEL", "s", "m-0"]), 1);
    assert_eq!(
        int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]),
        (base + 10_000 - 1) as i64
    );
    assert_rejected(vk, &mut c, "s", "m-0", "after DEL and REBUILD SYNC");
}

#[test]
fn rebuild_failure_keeps_old_filter() {
    let env = env(&[]);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    let items = names("item", 10);
    add_all(&env.vk, &mut c, "s", &items);
    let mut pg = env.pg();
    pg.batch_execute("ALTER TABLE member_s RENAME TO member_s_away")
        .unwrap();

    let e = err(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]);
    assert!(
        e.starts_with("ERR") && e.contains("member_s"),
        "REBUILD SYNC of a set whose table is gone: {e}"
    );
    assert_eq!(
        set_info(&mut c, "s", "rebuild_state").as_deref(),
        Ok("idle")
    );
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild").as_deref(),
        Ok("failed")
    );
    let why = set_info(&mut c, "s", "last_rebuild_error").unwrap();
    assert!(why.contains("member_s"), "last_rebuild_error: {why:?}");
    // The old filter keeps answering what it can answer alone.
    assert_eq!(set_info(&mut c, "s", "filter_complete").as_deref(), Ok("1"));
    assert_rejected(
        &env.vk,
        &mut c,
        "s",
        "never-added",
        "after a failed rebuild",
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "never-added"]), 0);

    pg.batch_execute("ALTER TABLE member_s_away RENAME TO member_s")
        .unwrap();
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]), 10);
    assert_eq!(set_info(&mut c, "s", "last_rebuild").as_deref(), Ok("ok"));
    assert_members(&env.vk, &mut c, "s", &items, "after the table came back");
}

// ---------------------------------------------------------------------------------------------
// the sync loop

#[test]
fn outside_writes_reach_the_filter() {
    let env = env(&[]);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    add_all(&env.vk, &mut c, "s", &names("item", 3));
    wait_info(&env.vk, &mut c, "s", "filter_caught_up", "1", SETTLE);

    let answered = |c: &mut Connection, item: &str| {
        let mut last = (0, String::new());
        let ok = wait_until(Duration::from_secs(3), || {
            last = explain(c, "s", item);
            last.0 == 1 && last.1 != "bloom-negative"
        });
        (ok, last)
    };

    let mut pg = env.pg();
    pg.batch_execute("INSERT INTO member_s (entity_id) VALUES ('outside')")
        .unwrap();
    let (ok, last) = answered(&mut c, "outside");
    assert!(
        ok,
        "a row inserted outside the module never reached the filter within 3 s: EXPLAIN {last:?}\nMEMBER.INFO: {:?}\nvalkey log:\n{}",
        info_all(&mut c, "s"),
        log_tail(&env.vk)
    );

    // A transaction that stays open across several sync passes, then commits.
    let mut late = env.pg();
    late.batch_execute("BEGIN; INSERT INTO member_s (entity_id) VALUES ('late')")
        .unwrap();
    let late_xid: i64 = late
        .query_one("SELECT pg_current_xact_id()::text::int8", &[])
        .unwrap()
        .get(0);
    let applied_before: u64 = set_info(&mut c, "s", "sync_rows_applied")
        .unwrap()
        .parse()
        .unwrap();
    thread::sleep(Duration::from_millis(1500));
    // Passes ran meanwhile, and none moved the watermark past the open transaction.
    let age: u64 = set_info(&mut c, "s", "sync_age_ms")
        .unwrap()
        .parse()
        .unwrap_or(u64::MAX);
    assert!(
        age < 1000,
        "the sync loop is not running: sync_age_ms {age}"
    );
    let watermark: i64 = set_info(&mut c, "s", "sync_watermark_xid")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        watermark <= late_xid,
        "the watermark {watermark} passed the id {late_xid} of a transaction still open"
    );
    late.batch_execute("COMMIT").unwrap();
    let (ok, last) = answered(&mut c, "late");
    assert!(
        ok,
        "a row committed late never reached the filter within 3 s: EXPLAIN {last:?}\nMEMBER.INFO: {:?}\nvalkey log:\n{}",
        info_all(&mut c, "s"),
        log_tail(&env.vk)
    );
    let applied_after: u64 = set_info(&mut c, "s", "sync_rows_applied")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        applied_after > applied_before,
        "sync_rows_applied did not grow"
    );
}

/// `member.rebuild-interval-s` rebuilds every set that often, by itself (docs/operations.md "Filter
/// lifecycle"), keeping every member.
#[test]
fn rebuild_interval_rebuilds_every_set_by_itself() {
    let env = env(&[("member.rebuild-interval-s", "1")]);
    let mut c = env.conn();
    create(&mut c, "p", &[]);
    let items = names("p", 50);
    add_all(&env.vk, &mut c, "p", &items);
    // Two more rebuilds: the second started after the adds (the first may have been running).
    let done =
        |c: &mut Connection| -> u64 { info_field(c, "rebuilds_done").unwrap().parse().unwrap() };
    let before = done(&mut c);
    assert!(
        wait_until(SETTLE, || done(&mut c) >= before + 2),
        "no periodic rebuilds: {} then {}\n{}",
        before,
        done(&mut c),
        log_tail(&env.vk)
    );
    assert_eq!(
        set_info(&mut c, "p", "last_rebuild_reason").as_deref(),
        Ok("periodic")
    );
    thread::sleep(PAST_RECENT);
    wait_info(&env.vk, &mut c, "p", "filter_caught_up", "1", SETTLE);
    assert_in_filter(&env.vk, &mut c, "p", &items, "after a periodic rebuild");
}
