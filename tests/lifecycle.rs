//! Filter lifecycle end to end: DEBUG RELOAD, restarts from RDB and AOF (also after kill -9),
//! FLUSHALL, replication and promotion, MEMBER.REBUILD (exact count, refusals, a race with
//! 10 000 ADDs, failure), rows written outside the module (sync loop, late commits) and corrupt
//! RDB payloads.
//!
//! The contract under test (README "Filter lifecycle"): whatever happened to the filter, an item
//! that is a member in PostgreSQL never gets EXISTS 0, and once the filter is trusted again
//! (complete and caught up) it holds every member. Sets are created with RECENT-TTL 1, so after
//! [`PAST_RECENT`] a "not bloom-negative" answer proves the filter itself holds the item.
mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use support::member::*;
use support::{wait_until, Valkey};

/// Sync loop interval for most servers here: outside writes and catch-up within ~200 ms.
const SYNC_FAST: (&str, &str) = ("member.sync-interval-ms", "200");

/// Sync loop interval of one hour: after its first pass the loop stays quiet for the whole
/// test, so it cannot repair a filter that the path under test (rebuild journal, replicated
/// MEMBER._ADD) failed to update. A promotion still triggers a pass at once.
const SYNC_OFF: (&str, &str) = ("member.sync-interval-ms", "3600000");

/// Longer than RECENT-TTL 1 s: from then on no recent-writes mark covers an earlier ADD.
const PAST_RECENT: Duration = Duration::from_millis(1200);

/// How long the module may take to catch up or rebuild by itself in these small tests.
const SETTLE: Duration = Duration::from_secs(10);

/// How long a rebuild of ~310k rows may take (a debug build on a busy machine).
const REBUILD_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// helpers

/// A fresh database and a Valkey with `extra` configs, and the fast sync loop unless `extra`
/// sets the interval.
fn env(extra: &[(&str, &str)]) -> Env {
    let mut cfg = extra.to_vec();
    if !extra.iter().any(|(k, _)| *k == SYNC_FAST.0) {
        cfg.push(SYNC_FAST);
    }
    Env::with(&cfg)
}

/// Last 60 lines of the server log, for assertion messages.
fn log_tail(vk: &Valkey) -> String {
    let log = vk.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// `MEMBER.CREATE <set> RECENT-TTL 1 <opts>`.
fn create(c: &mut Connection, set: &str, opts: &[&str]) {
    let mut args = vec!["MEMBER.CREATE", set, "RECENT-TTL", "1"];
    args.extend_from_slice(opts);
    ok(c, &args);
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// ADDs every item, pipelined; each must be new (1).
fn add_all(vk: &Valkey, c: &mut Connection, set: &str, items: &[String]) {
    let mut p = redis::pipe();
    for it in items {
        p.cmd("MEMBER.ADD").arg(set).arg(it);
    }
    let got: Vec<i64> = p
        .query(c)
        .unwrap_or_else(|e| panic!("ADD to {set}: {e}\nvalkey log:\n{}", log_tail(vk)));
    for (it, g) in items.iter().zip(&got) {
        assert_eq!(*g, 1, "MEMBER.ADD {set} {it} should be new");
    }
}

/// Every item must answer EXISTS 1 (pipelined; an error reply fails too).
fn assert_members(vk: &Valkey, c: &mut Connection, set: &str, items: &[String], when: &str) {
    let mut p = redis::pipe();
    for it in items {
        p.cmd("MEMBER.EXISTS").arg(set).arg(it);
    }
    let got: Vec<Value> = p.query(c).unwrap_or_else(|e| {
        panic!(
            "{when}: EXISTS on {set}: {e}\nvalkey log:\n{}",
            log_tail(vk)
        )
    });
    let wrong: Vec<(&String, &Value)> = items
        .iter()
        .zip(&got)
        .filter(|(_, v)| !matches!(v, Value::Int(1)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{when}: members of {set} not answered 1 (no false absent!): {wrong:?}\nvalkey log:\n{}",
        log_tail(vk)
    );
}

/// EXPLAIN of every item, pipelined.
fn explain_all(c: &mut Connection, set: &str, items: &[String]) -> Vec<(i64, String)> {
    let mut p = redis::pipe();
    for it in items {
        p.cmd("MEMBER.EXPLAIN").arg(set).arg(it);
    }
    p.query(c)
        .unwrap_or_else(|e| panic!("EXPLAIN on {set}: {e}"))
}

/// Every item answers 1 and none is rejected by the filter (call it past RECENT-TTL, so the
/// filter and not a recent-writes mark is what lets them through).
fn assert_in_filter(vk: &Valkey, c: &mut Connection, set: &str, items: &[String], when: &str) {
    let got = explain_all(c, set, items);
    let wrong: Vec<(&String, &(i64, String))> = items
        .iter()
        .zip(&got)
        .filter(|(_, (answer, path))| *answer != 1 || path == "bloom-negative")
        .collect();
    assert!(
        wrong.is_empty(),
        "{when}: {} of {} members of {set} are missing from the filter or not answered 1, e.g. {:?}\nvalkey log:\n{}",
        wrong.len(),
        items.len(),
        &wrong[..wrong.len().min(10)],
        log_tail(vk)
    );
}

/// A never-added item is answered 0 by the filter alone: the filter is trusted.
fn assert_rejected(vk: &Valkey, c: &mut Connection, set: &str, item: &str, when: &str) {
    let got = explain(c, set, item);
    assert_eq!(
        got,
        (0, "bloom-negative".to_string()),
        "{when}: EXPLAIN {set} {item} (never added)\nMEMBER.INFO: {:?}\nvalkey log:\n{}",
        info_all(c, set),
        log_tail(vk)
    );
}

/// The whole MEMBER.INFO reply as a flat field/value list (empty on error).
fn info_all(c: &mut Connection, set: &str) -> Vec<String> {
    redis::cmd("MEMBER.INFO")
        .arg(set)
        .query(c)
        .unwrap_or_default()
}

/// One field of an [`info_all`] reply.
fn field(info: &[String], name: &str) -> Option<String> {
    info.chunks(2)
        .find(|p| p[0] == name)
        .and_then(|p| p.get(1).cloned())
}

/// Waits until MEMBER.INFO `<set>` shows `field` = `want`.
fn wait_info(vk: &Valkey, c: &mut Connection, set: &str, field: &str, want: &str, t: Duration) {
    let mut last = None;
    let reached = wait_until(t, || {
        last = set_info(c, set, field);
        last.as_deref() == Some(want)
    });
    assert!(
        reached,
        "MEMBER.INFO {set}: {field} never became {want} within {t:?} (last {last:?})\nMEMBER.INFO: {:?}\nvalkey log:\n{}",
        info_all(c, set),
        log_tail(vk)
    );
}

/// After a restart: the set catalog is read again before any set is known.
fn reconnect_loaded(vk: &Valkey) -> Connection {
    let mut c = vk.conn();
    assert!(
        wait_catalog_loaded(&mut c, Duration::from_secs(20)),
        "catalog never loaded after restart\n{}",
        log_tail(vk)
    );
    c
}

/// One reply of a command that may fail (e.g. on a replica before the set reached it).
fn reply(c: &mut Connection, args: &[&str]) -> Option<i64> {
    match cmd(c, args) {
        Ok(Value::Int(n)) => Some(n),
        _ => None,
    }
}

/// The exact-match cache key of an unscoped item.
fn hit_key(set: &str, item: &str) -> Vec<u8> {
    let mut k = format!("member:{set}:hit:{item}").into_bytes();
    k.push(0);
    k
}

/// Sends `cmds` in one write on a raw connection (so the server runs them back to back) and
/// returns the simple-string / error / integer reply lines.
fn raw_pipeline(vk: &Valkey, cmds: &[&[&str]]) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", vk.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = Vec::new();
    for args in cmds {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in *args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
    }
    s.write_all(&out).unwrap();
    let mut r = BufReader::new(s);
    (0..cmds.len())
        .map(|_| {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            line.trim_end().to_string()
        })
        .collect()
}

/// A replica of `env`'s server with the sync loop off (SYNC_OFF), once its link is up.
fn start_quiet_replica(env: &Env) -> (Valkey, Connection) {
    let primary = format!("127.0.0.1 {}", env.vk.port());
    let replica = start_loaded(&env.db.url(), &[SYNC_OFF, ("replicaof", primary.as_str())]);
    let mut r = replica.conn();
    assert!(
        wait_until(Duration::from_secs(20), || info_section(
            &mut r,
            "replication",
            "master_link_status"
        )
        .as_deref()
            == Some("up")),
        "replica never linked\n{}",
        log_tail(&replica)
    );
    (replica, r)
}

fn info_section(c: &mut Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(c).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// The filter came from disk (RDB/AOF) rather than from a rebuild in this process.
fn assert_not_rebuilt(vk: &Valkey, c: &mut Connection, set: &str, when: &str) {
    assert_eq!(
        set_info(c, set, "last_rebuild").as_deref(),
        Some("none"),
        "{when}: the filter should have been loaded, not rebuilt\nvalkey log:\n{}",
        log_tail(vk)
    );
}

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
    assert_eq!(
        set_info(&mut c, "s", "filter_complete").as_deref(),
        Some("1")
    );
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
    let field = |c: &mut Connection, f: &str| set_info(c, "s", f).unwrap_or_default();
    assert_eq!(field(&mut c, "filter_design"), "fuse8+bloom-delta");
    assert_eq!(field(&mut c, "filter_static_items"), "1000");
    // Below 2 097 152 rows a build stays one fuse filter (src/filter_static.rs).
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
            info_section(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
                && info_section(&mut c, "persistence", "aof_rewrite_scheduled").as_deref()
                    == Some("0")
        });
        assert!(done, "AOF rewrite never finished\n{}", log_tail(&env.vk));
        assert_eq!(
            info_section(&mut c, "persistence", "aof_last_bgrewrite_status").as_deref(),
            Some("ok"),
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
    assert_eq!(set_info(&mut c, "s", "last_rebuild").as_deref(), Some("ok"));
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
            == Some("1")),
        "the replica never learned the set\nreplica log:\n{}",
        log_tail(&replica)
    );
    assert!(
        wait_until(Duration::from_secs(5), || {
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
    let env = env(&[SYNC_OFF, ("repl-diskless-sync-delay", "0")]);
    let vk = &env.vk;
    let (replica, mut r) = start_quiet_replica(&env);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    // The replica learns the set and runs its one sync pass: from then on its filter is
    // trusted, so a raced ADD missing from it would answer bloom-negative.
    assert!(
        wait_until(Duration::from_secs(5), || {
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
    assert_eq!(set_info(&mut c, "s", "last_rebuild").as_deref(), Some("ok"));
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild_rows").as_deref(),
        Some("7")
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
    let replies = raw_pipeline(vk, &[&["MEMBER.REBUILD", "s"], &["MEMBER.REBUILD", "s"]]);
    assert_eq!(
        replies,
        [
            "+OK",
            "-ERR a rebuild of this set is already running (see MEMBER.INFO)"
        ]
    );
    // Streaming 300k rows takes far longer than these few calls.
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
    wait_info(vk, &mut c, "s", "rebuild_state", "idle", REBUILD_TIMEOUT);
    assert_eq!(set_info(&mut c, "s", "last_rebuild").as_deref(), Some("ok"));
    let base = BULK as u64 + 7;
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild_rows"),
        Some(base.to_string())
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
    ok(&mut c, &["MEMBER.REBUILD", "s"]);
    let rebuild_started = t0.elapsed();
    for h in adders {
        h.join().expect("adder thread");
    }
    let adds_done = t0.elapsed();
    let still_running = set_info(&mut c, "s", "rebuild_state");
    wait_info(vk, &mut c, "s", "rebuild_state", "idle", REBUILD_TIMEOUT);
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild").as_deref(),
        Some("ok"),
        "{:?}",
        info_all(&mut c, "s")
    );
    let rows: u64 = set_info(&mut c, "s", "last_rebuild_rows")
        .unwrap()
        .parse()
        .unwrap();
    eprintln!(
        "race: rebuild started at {rebuild_started:?}, ADDs done at {adds_done:?} (rebuild then {still_running:?}), \
         its snapshot held {} of the 10000 raced ADDs",
        rows - base
    );
    assert!(
        rows > base && rows < base + 10_000,
        "the rebuild snapshot should fall in the middle of the ADDs: {} of 10000",
        rows - base
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
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n >= 2)),
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
        Some("idle")
    );
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild").as_deref(),
        Some("failed")
    );
    let why = set_info(&mut c, "s", "last_rebuild_error").unwrap_or_default();
    assert!(why.contains("member_s"), "last_rebuild_error: {why:?}");
    // The old filter keeps answering what it can answer alone.
    assert_eq!(
        set_info(&mut c, "s", "filter_complete").as_deref(),
        Some("1")
    );
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
    assert_eq!(set_info(&mut c, "s", "last_rebuild").as_deref(), Some("ok"));
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
    // The 200 000-row insert keeps the sync loop's worker busy for a while on a loaded
    // machine: the ADDs below may wait longer than the default timeout, which this test is
    // not about.
    let env = env(&[("appendonly", "yes"), ("member.db-timeout-ms", "20000")]);
    let mut c = env.conn();
    create(&mut c, "s", &[]);
    env.pg()
        .batch_execute(
            "INSERT INTO member_s (entity_id) SELECT 'bulk-' || g FROM generate_series(1, 200000) g",
        )
        .unwrap();
    add_all(&env.vk, &mut c, "s", &names("item", 20));
    ok(&mut c, &["MEMBER.REBUILD", "s"]);
    ok(&mut c, &["CLIENT", "PAUSE", "1500", "WRITE"]);
    // The rebuild finishes (and would replicate MEMBER._LOAD) during the pause.
    thread::sleep(Duration::from_millis(2000));
    assert_eq!(
        redis::cmd("PING").query::<String>(&mut c).unwrap(),
        "PONG",
        "server died during the pause:\n{}",
        log_tail(&env.vk)
    );
    wait_info(
        &env.vk,
        &mut c,
        "s",
        "rebuild_state",
        "idle",
        REBUILD_TIMEOUT,
    );
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "after-pause"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "after-pause"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "bulk-777"]), 1);
}
