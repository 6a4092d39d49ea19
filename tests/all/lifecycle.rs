//! Filter lifecycle end to end, across restarts: DEBUG RELOAD, restarts from RDB and AOF
//! (also after kill -9), FLUSHALL, corrupt RDB payloads, cache keys and effects that outlive
//! their moment. Replication, MEMBER.REBUILD and the sync loop: `tests/all/lifecycle_rebuild.rs`.
//!
//! The contract under test (docs/operations.md "Filter lifecycle"): whatever happened to the
//! filter, an item that is a member in PostgreSQL never gets EXISTS 0, and once the filter is
//! trusted again (complete and caught up) it holds every member. Sets are created with
//! RECENT-TTL 1, so after `PAST_RECENT` a "not bloom-negative" answer proves the filter itself
//! holds the item.
use crate::support;

use std::thread;
use std::time::Duration;

use redis::{Connection, Value};
use support::lifecycle::*;
use support::member::*;
use support::{wait_until, Valkey};

// ---------------------------------------------------------------------------------------------
// persistence

#[test]
fn debug_reload_keeps_members() {
    let env = env(&[("enable-debug-command", "yes")]);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    let items = names("item", 50);
    add_all(&env.vk, &mut c, "s", &items);

    // CREATE built the filter through the rebuild path; the reload must not build another.
    let rebuilds = info_field(&mut c, "rebuilds_done");
    ok(&mut c, &["DEBUG", "RELOAD"]);
    assert_members(&env.vk, &mut c, "s", &items, "right after DEBUG RELOAD");

    wait_info(&env.vk, &mut c, "s", "filter_caught_up", "1", SETTLE);
    assert_eq!(set_info(&mut c, "s", "filter_complete").as_deref(), Ok("1"));
    assert_eq!(
        info_field(&mut c, "rebuilds_done"),
        rebuilds,
        "after DEBUG RELOAD: the filter should have been loaded, not rebuilt"
    );
    thread::sleep(PAST_RECENT);
    assert_rejected(&env.vk, &mut c, "s", "never-added", "after DEBUG RELOAD");
    assert_in_filter(&env.vk, &mut c, "s", &items, "after DEBUG RELOAD");
}

/// Issue 11: a rebuilt filter keeps its rows in a static part and later adds in a delta; both
/// survive a reload (payload version 3) and MEMBER.INFO names them.
#[test]
fn debug_reload_keeps_both_parts_of_a_rebuilt_filter() {
    let env = env(&[("enable-debug-command", "yes")]);
    let mut c = env.conn();
    create(&mut c, "s", &["CAPACITY", "1000"]);
    env.pg()
        .batch_execute(
            "INSERT INTO member_s (entity_id) SELECT 'row-' || g FROM generate_series(1, 1000) g",
        )
        .unwrap();
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]), 1000);
    let late = names("late", 15);
    add_all(&env.vk, &mut c, "s", &late);
    let field = |c: &mut Connection, f: &str| set_info(c, "s", f).unwrap();
    assert_eq!(field(&mut c, "filter_design"), "fuse8+bloom-delta");
    assert_eq!(field(&mut c, "filter_static_items"), "1000");
    // Below 2 097 152 rows a build stays one fuse filter (src/filter/bloom/fuse.rs).
    assert_eq!(field(&mut c, "filter_static_parts"), "1");
    assert_eq!(field(&mut c, "filter_delta_items"), "15");
    let before: Vec<String> = ["filter_bits", "filter_static_bits", "filter_delta_bits"]
        .iter()
        .map(|f| field(&mut c, f))
        .collect();

    ok(&mut c, &["DEBUG", "RELOAD"]);
    let after: Vec<String> = ["filter_bits", "filter_static_bits", "filter_delta_bits"]
        .iter()
        .map(|f| field(&mut c, f))
        .collect();
    assert_eq!(after, before, "the reload changed the filter's parts");
    assert_eq!(field(&mut c, "filter_delta_items"), "15");
    wait_info(&env.vk, &mut c, "s", "filter_caught_up", "1", SETTLE);
    thread::sleep(PAST_RECENT);
    let rows: Vec<String> = (1..=1000).map(|i| format!("row-{i}")).collect();
    assert_in_filter(
        &env.vk,
        &mut c,
        "s",
        &rows,
        "static part, after DEBUG RELOAD",
    );
    assert_in_filter(&env.vk, &mut c, "s", &late, "delta, after DEBUG RELOAD");
    assert_rejected(&env.vk, &mut c, "s", "never-added", "after DEBUG RELOAD");
}

#[test]
fn restart_from_rdb_and_kill9_catch_up() {
    let mut env = env(&[]);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    let before = vec!["a".to_string(), "b".to_string()];
    add_all(&env.vk, &mut c, "s", &before);
    ok(&mut c, &["SAVE"]);
    let after = vec!["c".to_string()];
    add_all(&env.vk, &mut c, "s", &after); // not in the snapshot
    let all = [before, after.clone()].concat();

    env.vk.kill9_and_restart();
    let mut c = reconnect_loaded(&env.vk);
    // c is in PostgreSQL but not in the loaded filter: sync catch-up or the database.
    assert_members(
        &env.vk,
        &mut c,
        "s",
        &all,
        "right after kill -9 and restart",
    );

    wait_info(&env.vk, &mut c, "s", "filter_caught_up", "1", SETTLE);
    assert_not_rebuilt(&env.vk, &mut c, "s", "after restart from RDB");
    // A new process has no recent-writes marks: only the filter can let c through.
    assert_in_filter(
        &env.vk,
        &mut c,
        "s",
        &all,
        "after catch-up from the RDB watermark",
    );
    assert_rejected(
        &env.vk,
        &mut c,
        "s",
        "never-added",
        "after restart from RDB",
    );
}

/// ADDs, a stop, a restart from the AOF alone. Plain: every effect is in the incremental
/// file (`MEMBER._SET`, `MEMBER._LOAD`, `MEMBER._ADD`), stop with SHUTDOWN NOSAVE. With
/// `rewrite`: no RDB preamble, BGREWRITEAOF (the filter becomes one `MEMBER._LOAD` in the base
/// file), more ADDs after it, stop with SIGKILL.
fn aof_round_trip(rewrite: bool) {
    let mut cfg = vec![("appendonly", "yes")];
    if rewrite {
        cfg.push(("aof-use-rdb-preamble", "no"));
    }
    let mut env = env(&cfg);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    let mut items = names("early", 20);
    add_all(&env.vk, &mut c, "s", &items);
    if rewrite {
        let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
        let done = wait_until(Duration::from_secs(20), || {
            info_section(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Ok("0")
                && info_section(&mut c, "persistence", "aof_rewrite_scheduled").as_deref()
                    == Ok("0")
        });
        assert!(done, "AOF rewrite never finished\n{}", log_tail(&env.vk));
        assert_eq!(
            info_section(&mut c, "persistence", "aof_last_bgrewrite_status").as_deref(),
            Ok("ok"),
            "{}",
            log_tail(&env.vk)
        );
        let base = std::fs::read_dir(env.vk.dir().join("appendonlydir"))
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".base.aof"))
            .map(|e| std::fs::read(e.path()).unwrap())
            .expect("no base AOF file after the rewrite");
        assert!(
            base.windows(12).any(|w| w == b"MEMBER._LOAD"),
            "the rewritten base AOF does not carry the filter as MEMBER._LOAD"
        );
        let late = names("late", 20);
        add_all(&env.vk, &mut c, "s", &late);
        items.extend(late);
    }
    if rewrite {
        env.vk.kill9();
    } else {
        env.vk.shutdown(&["NOSAVE"]);
    }
    assert!(
        !env.vk.dir().join("dump.rdb").exists(),
        "the restart must come from the AOF alone"
    );
    env.vk.restart();
    let mut c = reconnect_loaded(&env.vk);
    assert_members(&env.vk, &mut c, "s", &items, "right after restart from AOF");
    wait_info(&env.vk, &mut c, "s", "filter_caught_up", "1", SETTLE);
    assert_not_rebuilt(&env.vk, &mut c, "s", "after restart from AOF");
    assert_in_filter(&env.vk, &mut c, "s", &items, "after restart from AOF");
    assert_rejected(
        &env.vk,
        &mut c,
        "s",
        "never-added",
        "after restart from AOF",
    );
}

#[test]
fn restart_from_aof() {
    aof_round_trip(false);
}

#[test]
fn restart_from_aof_rewritten_without_rdb_preamble() {
    aof_round_trip(true);
}

#[test]
fn flushall_falls_through_and_rebuilds() {
    // The rebuild alone must restore the filter, the sync loop does not help.
    let env = env(&[SYNC_OFF]);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    let mut items = names("item", 30);
    add_all(&env.vk, &mut c, "s", &items);
    // Some of them cached, so FLUSHALL drops exact-match keys too.
    assert_members(&env.vk, &mut c, "s", &items[..10], "before FLUSHALL");

    ok(&mut c, &["FLUSHALL"]);
    assert_members(&env.vk, &mut c, "s", &items, "right after FLUSHALL");
    // An ADD before the rebuild lands has no filter to go to: the rebuild's journal must
    // carry it into the new one.
    let extra = vec!["after-flush".to_string()];
    add_all(&env.vk, &mut c, "s", &extra);
    items.extend(extra);

    wait_info(&env.vk, &mut c, "s", "filter_complete", "1", SETTLE);
    wait_info(&env.vk, &mut c, "s", "filter_caught_up", "1", SETTLE);
    assert_eq!(set_info(&mut c, "s", "last_rebuild").as_deref(), Ok("ok"));
    thread::sleep(PAST_RECENT);
    assert_in_filter(&env.vk, &mut c, "s", &items, "after FLUSHALL and rebuild");
    assert_rejected(
        &env.vk,
        &mut c,
        "s",
        "never-added",
        "after FLUSHALL and rebuild",
    );
}

// ---------------------------------------------------------------------------------------------
// corrupt data files

/// Lines in a log that mean the server crashed instead of refusing the file.
const CRASH_MARKERS: [&str; 4] = [
    "crashed by signal",
    "STACK TRACE",
    "BUG REPORT",
    "Guru Meditation",
];

/// Starts `vk` on its dir with `dump.rdb` replaced by `bytes`; it must exit by itself with a
/// non-zero status and a log without crash report. Returns the log of that start.
fn start_on_bad_rdb(vk: &mut Valkey, bytes: &[u8], what: &str) -> String {
    std::fs::write(vk.dir().join("dump.rdb"), bytes).unwrap();
    let from = vk.log().len();
    let status = vk.start_expecting_exit(Duration::from_secs(15));
    let log = vk.log()[from..].to_string();
    let status = status.unwrap_or_else(|| {
        panic!("{what}: valkey-server kept running on a corrupt RDB\nlog:\n{log}")
    });
    assert!(
        !status.success(),
        "{what}: exited with success ({status})\nlog:\n{log}"
    );
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(" # ")).collect();
    eprintln!(
        "{what}: exited with {status}; warnings:\n{}",
        warnings.join("\n")
    );
    for m in CRASH_MARKERS {
        assert!(
            !log.contains(m),
            "{what}: the server crashed ({status}) instead of refusing the file (log has {m:?})\nlog:\n{log}"
        );
    }
    log
}

#[test]
fn corrupt_rdb_fails_to_load_without_crashing() {
    // Uncompressed, so the payload is in the file verbatim.
    let mut env = env(&[("rdbcompression", "no")]);
    let mut c = env.conn();
    create(&mut c, "s", &["CAPACITY", "10000"]);
    add_all(&env.vk, &mut c, "s", &names("item", 100));
    ok(&mut c, &["SAVE"]);
    env.vk.shutdown(&["NOSAVE"]);
    let good = std::fs::read(env.vk.dir().join("dump.rdb")).unwrap();
    let at = good
        .windows(4)
        .position(|w| w == b"LMBF")
        .expect("filter payload (magic LMBF) not found in dump.rdb");
    assert!(good.len() > at + 1000, "payload shorter than expected");

    // (a) one flipped byte in the bit array.
    let mut flipped = good.clone();
    flipped[at + 100] ^= 0x5a;
    let log = start_on_bad_rdb(&mut env.vk, &flipped, "flipped byte");
    assert!(
        log.contains("libmember") && log.contains("checksum"),
        "flipped byte: no libmember checksum error in the log\nlog:\n{log}"
    );

    // (b) the file cut off inside the payload.
    let log = start_on_bad_rdb(&mut env.vk, &good[..at + 100], "truncated file");
    assert!(
        ["Short read", "Unexpected EOF", "RDB reading", "libmember"]
            .iter()
            .any(|m| log.contains(m)),
        "truncated file: no load error in the log\nlog:\n{log}"
    );

    // The intact file still loads.
    std::fs::write(env.vk.dir().join("dump.rdb"), &good).unwrap();
    env.vk.restart();
    let mut c = reconnect_loaded(&env.vk);
    assert_members(&env.vk, &mut c, "s", &names("item", 100), "intact RDB");
}

// ---------------------------------------------------------------------------------------------
// review findings

#[test]
fn cache_entries_from_an_earlier_process_are_not_trusted() {
    let mut env = env(&[]);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    add_all(&env.vk, &mut c, "s", &["zed".to_string()]);
    assert_eq!(explain(&mut c, "s", "zed"), (1, "db-hit".to_string()));
    assert_eq!(explain(&mut c, "s", "zed"), (1, "cache-hit".to_string()));
    ok(&mut c, &["SAVE"]); // the snapshot holds zed's exact-match key
    assert_eq!(int(&mut c, &["MEMBER.DEL", "s", "zed"]), 1);
    // The invalidation dies with the process; the restored key must not answer for it.
    env.vk.kill9_and_restart();
    let mut c = reconnect_loaded(&env.vk);
    let restored: i64 = redis::cmd("EXISTS")
        .arg(hit_key("s", "zed"))
        .query(&mut c)
        .unwrap();
    assert_eq!(restored, 1, "the snapshot should carry the stale entry");
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "zed"]), 0);
    assert_eq!(explain(&mut c, "s", "zed").0, 0);
}

#[test]
fn effects_during_client_pause_write_are_held_not_fatal() {
    // With an AOF, every derived effect is propagated; propagating while writes are paused
    // aborts the server (valkey-io/valkey#1921), so the module must hold them back.
    let env = env(&[("appendonly", "yes"), ("member.db-timeout-ms", "20000")]);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    env.pg()
        .batch_execute(
            "INSERT INTO member_s (entity_id) SELECT 'bulk-' || g FROM generate_series(1, 1000) g",
        )
        .unwrap();
    add_all(&env.vk, &mut c, "s", &names("item", 20));
    // The rebuild's COPY waits at a lock until the pause is in place; the pause, longer than
    // any rebuild here, is lifted once the rebuild has finished (and would have replicated
    // MEMBER._LOAD) inside it: the race is certain, whatever the load.
    let mut locker = env.pg();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_s IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    ok(&mut c, &["MEMBER.REBUILD", "s"]);
    ok(&mut c, &["CLIENT", "PAUSE", "600000", "WRITE"]);
    assert_eq!(
        set_info(&mut c, "s", "rebuild_state").as_deref(),
        Ok("running")
    );
    locker.batch_execute("COMMIT").unwrap();
    wait_info(
        &env.vk,
        &mut c,
        "s",
        "rebuild_state",
        "idle",
        REBUILD_TIMEOUT,
    );
    assert_eq!(
        redis::cmd("PING").query::<String>(&mut c).unwrap(),
        "PONG",
        "server died during the pause:\n{}",
        log_tail(&env.vk)
    );
    ok(&mut c, &["CLIENT", "UNPAUSE"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "after-pause"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "after-pause"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "bulk-777"]), 1);
}
