//! Set definitions reach every node from the catalog, however the node got its data: a replica
//! that full-syncs after a CREATE (never seeing MEMBER._SET), a replica whose link needed a
//! full resynchronization, another node on the same database, a promoted replica; names that
//! are really unknown stay unknown at a bounded cost; MEMBER.DROP.
use crate::support;

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use support::member::*;
use support::{wait_until, Valkey};

/// The sync loop (and the catalog version check) every 300 ms on the servers that need it.
const SYNC_FAST: (&str, &str) = ("member.sync-interval-ms", "300");
/// No periodic catalog check during the test: only the events under test (a dataset load,
/// a promotion, a lookup of an unknown name, a replicated command) can teach the node a set.
const SYNC_OFF: (&str, &str) = ("member.sync-interval-ms", "3600000");
/// One sync interval of SYNC_FAST, with room for a busy machine.
const ONE_INTERVAL: Duration = Duration::from_secs(5);

fn log_tail(vk: &Valkey) -> String {
    let log = vk.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn reply(c: &mut Connection, args: &[&str]) -> Result<i64, String> {
    match cmd(c, args) {
        Ok(Value::Int(n)) => Ok(n),
        Ok(v) => Err(format!("{v:?}")),
        Err(e) => Err(format!(
            "{} {}",
            e.code().unwrap_or(""),
            e.detail().unwrap_or("")
        )),
    }
}

fn info_int(c: &mut Connection, name: &str) -> i64 {
    let v = info_field(c, name).unwrap();
    v.parse()
        .unwrap_or_else(|e| panic!("INFO member {name} {v:?}: {e}"))
}

/// Makes `replica` a replica of `primary` and waits for the link.
fn link(replica: &Valkey, r: &mut Connection, primary: &Valkey) {
    ok(r, &["REPLICAOF", "127.0.0.1", &primary.port().to_string()]);
    wait_linked(replica, r);
}

fn wait_linked(replica: &Valkey, r: &mut Connection) {
    assert!(
        wait_until(Duration::from_secs(30), || info_section(
            r,
            "replication",
            "master_link_status"
        )
        .as_deref()
            == Ok("up")),
        "replica never linked\n{}",
        log_tail(replica)
    );
}

/// Waits until `args` answers `want` on `c`.
fn wait_reply(vk: &Valkey, c: &mut Connection, args: &[&str], want: i64, within: Duration) {
    let mut last = Err(String::new());
    let ok = wait_until(within, || {
        last = reply(c, args);
        last == Ok(want)
    });
    assert!(
        ok,
        "{args:?} never answered {want} (last: {last:?})\nlog:\n{}",
        log_tail(vk)
    );
}

const UNKNOWN: &str = "ERR no such set";

#[test]
fn replica_linked_after_create_learns_the_set_and_serves_it_promoted() {
    let env = Env::with(&[("repl-diskless-sync-delay", "0"), SYNC_FAST]);
    // Running, catalog loaded, but not linked yet: it never sees the CREATE's MEMBER._SET.
    let replica = start_loaded(&env.db.url(), &[SYNC_OFF]);
    let mut r = replica.conn();
    let mut p = env.conn();
    ok(&mut p, &["MEMBER.CREATE", "w", "RECENT-TTL", "1"]);
    assert_eq!(int(&mut p, &["MEMBER.ADD", "w", "a"]), 1);
    link(&replica, &mut r, &env.vk);

    // The full synchronization's load made it re-read the catalog: it knows the set before
    // anyone names it (its periodic check is off).
    assert!(
        wait_until(ONE_INTERVAL, || info_field(&mut r, "sets").as_deref()
            == Ok("1")),
        "the replica did not re-read the catalog after its full sync: sets = {:?}\n{}",
        info_field(&mut r, "sets"),
        log_tail(&replica)
    );
    wait_reply(
        &replica,
        &mut r,
        &["MEMBER.EXISTS", "w", "a"],
        1,
        ONE_INTERVAL,
    );
    // Its filter (from the RDB) is adopted and caught up: absent items get 0 from it.
    wait_reply(
        &replica,
        &mut r,
        &["MEMBER.EXISTS", "w", "zz"],
        0,
        ONE_INTERVAL,
    );
    assert!(
        wait_until(ONE_INTERVAL, || set_info(&mut r, "w", "filter_caught_up")
            .as_deref()
            == Ok("1")),
        "the replica's filter never caught up: {:?}",
        set_info(&mut r, "w", "filter_caught_up")
    );

    ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
    assert_eq!(reply(&mut r, &["MEMBER.EXISTS", "w", "a"]), Ok(1));
    assert_eq!(reply(&mut r, &["MEMBER.ADD", "w", "b"]), Ok(1));
    assert_eq!(reply(&mut r, &["MEMBER.EXISTS", "w", "b"]), Ok(1));
    // The old primary sees it as a write from outside, within one sync interval.
    wait_reply(
        &env.vk,
        &mut p,
        &["MEMBER.EXISTS", "w", "b"],
        1,
        ONE_INTERVAL,
    );
}

#[test]
fn a_node_asks_the_catalog_for_a_name_it_does_not_know() {
    let env = Env::with(&[SYNC_OFF]);
    // Another node on the same database, not a replica: it learns nothing by replication.
    let other = start_loaded(&env.db.url(), &[SYNC_OFF]);
    let mut o = other.conn();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "elsewhere"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "elsewhere", "x"]), 1);
    // Its periodic check is off: only asking the catalog on the lookup can answer these.
    assert_eq!(reply(&mut o, &["MEMBER.EXISTS", "elsewhere", "x"]), Ok(1));
    assert_eq!(reply(&mut o, &["MEMBER.EXISTS", "elsewhere", "y"]), Ok(0));
    assert_eq!(reply(&mut o, &["MEMBER.ADD", "elsewhere", "y"]), Ok(1));
    assert_eq!(reply(&mut o, &["MEMBER.EXISTS", "elsewhere", "y"]), Ok(1));
    // The other commands ask too.
    ok(&mut c, &["MEMBER.CREATE", "info_me"]);
    assert_eq!(
        set_info(&mut o, "info_me", "name").as_deref(),
        Ok("info_me")
    );
    ok(&mut c, &["MEMBER.CREATE", "del_me"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "del_me", "d"]), 1);
    assert_eq!(reply(&mut o, &["MEMBER.DEL", "del_me", "d"]), Ok(1));
    ok(&mut c, &["MEMBER.CREATE", "rebuild_me"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "rebuild_me", "r"]), 1);
    assert_eq!(
        reply(&mut o, &["MEMBER.REBUILD", "rebuild_me", "SYNC"]),
        Ok(1)
    );
}

#[test]
fn unknown_names_stay_unknown_at_one_catalog_query_per_second() {
    let env = Env::with(&[SYNC_FAST]);
    let mut c = env.conn();
    let before = info_int(&mut c, "catalog_asks");
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        // A pipelined burst: concurrent lookups of one name share one query.
        let mut p = redis::pipe();
        for _ in 0..50 {
            p.cmd("MEMBER.EXISTS").arg("ghost").arg("x");
        }
        p.cmd("MEMBER.ADD").arg("ghost").arg("x");
        p.cmd("MEMBER.INFO").arg("ghost");
        // The client reports the first error reply of the pipeline.
        match p.query::<Vec<Value>>(&mut c) {
            Ok(v) => panic!("lookups of an unknown set answered {v:?}"),
            Err(e) => assert_eq!(e.code(), Some("ERR"), "{e}"),
        }
        let e = err(&mut c, &["MEMBER.EXISTS", "ghost", "x"]);
        assert!(e.starts_with(UNKNOWN), "{e}");
        sent += 53;
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let asks = info_int(&mut c, "catalog_asks") - before;
    assert!(sent > 1000, "only {sent} lookups sent");
    assert!(
        asks >= 1 && asks as f64 <= elapsed.ceil() + 1.0,
        "{asks} catalog queries for {sent} lookups of one unknown name in {elapsed:.1} s"
    );
    // Many different random names: each is asked once, and memory stays bounded.
    for i in 0..100 {
        let name = format!("ghost_{i}");
        let e = err(&mut c, &["MEMBER.EXISTS", &name, "x"]);
        assert!(e.starts_with(UNKNOWN), "{e}");
    }
    // A name created after it was found unknown is served once the brief memory expires.
    let mut pg = env.pg();
    std::thread::sleep(Duration::from_millis(1100));
    let e = err(&mut c, &["MEMBER.EXISTS", "late", "x"]);
    assert!(e.starts_with(UNKNOWN), "{e}");
    let other = start_loaded(&env.db.url(), &[SYNC_OFF]);
    ok(&mut other.conn(), &["MEMBER.CREATE", "late"]);
    let n: i64 = pg
        .query_one(
            "SELECT count(*) FROM member_catalog WHERE name = 'late'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    wait_reply(
        &env.vk,
        &mut c,
        &["MEMBER.EXISTS", "late", "x"],
        0,
        ONE_INTERVAL,
    );
}

#[test]
fn another_node_learns_a_create_within_one_sync_interval() {
    let env = Env::with(&[SYNC_FAST]);
    let mut c = env.conn();
    let other = start_loaded(&env.db.url(), &[SYNC_FAST]);
    let mut o = other.conn();
    ok(&mut o, &["MEMBER.CREATE", "made_there"]);
    // Nobody names it here: the periodic version check alone must bring it.
    assert!(
        wait_until(ONE_INTERVAL, || info_field(&mut c, "sets").as_deref()
            == Ok("1")),
        "the set created on another node never arrived: sets = {:?}\n{}",
        info_field(&mut c, "sets"),
        log_tail(&env.vk)
    );
    // Idle cost: the version check reads one row; the catalog itself is re-read only when the
    // version moved. A definition edited in the table without moving the version stays unseen
    // while the checks go on...
    let v1 = info_field(&mut c, "catalog_version").unwrap();
    let ttl = set_info(&mut c, "made_there", "cache_ttl").unwrap();
    let mut pg = env.pg();
    pg.batch_execute(
        "UPDATE member_catalog SET cache_ttl = cache_ttl + 1 WHERE name = 'made_there'",
    )
    .unwrap();
    // A negative window: 1 s is three checks at 300 ms, and one re-read of the catalog in it
    // would show the edit. (On a busy machine fewer checks run, which can only hide a fault,
    // never invent one; the positive half below shows the edit is there to be seen.)
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(info_field(&mut c, "catalog_version").unwrap(), v1);
    assert_eq!(
        set_info(&mut c, "made_there", "cache_ttl").unwrap(),
        ttl,
        "the catalog was re-read though its version had not moved"
    );
    // ...and the first check after the version moves re-reads it.
    pg.batch_execute("UPDATE member_catalog_version SET version = version + 1")
        .unwrap();
    assert!(
        wait_until(ONE_INTERVAL, || set_info(&mut c, "made_there", "cache_ttl")
            .is_ok_and(|v| v != ttl)),
        "the catalog was not re-read after its version moved\n{}",
        log_tail(&env.vk)
    );
}

/// `EXISTS <key>` on the server.
fn key_exists(c: &mut Connection, key: &[u8]) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1
}

fn table_exists(pg: &mut postgres::Client, set: &str) -> bool {
    pg.query_one(
        "SELECT to_regclass($1) IS NOT NULL",
        &[&format!("member_{set}")],
    )
    .unwrap()
    .get(0)
}

fn catalog_has(pg: &mut postgres::Client, set: &str) -> bool {
    let n: i64 = pg
        .query_one(
            "SELECT count(*) FROM member_catalog WHERE name = $1",
            &[&set],
        )
        .unwrap()
        .get(0);
    n == 1
}

/// Waits until a lookup of `set` gets "no such set" on `c`.
fn wait_unknown(vk: &Valkey, c: &mut Connection, set: &str, within: Duration) {
    let mut last = Ok(0);
    let gone = wait_until(within, || {
        last = reply(c, &["MEMBER.EXISTS", set, "x"]);
        last.as_ref().is_err_and(|e| e.starts_with(UNKNOWN))
    });
    assert!(
        gone,
        "{set} still answers {last:?} after its DROP\nlog:\n{}",
        log_tail(vk)
    );
}

#[test]
fn drop_reaches_replicas_and_other_nodes_and_a_new_create_starts_clean() {
    let env = Env::with(&[("repl-diskless-sync-delay", "0"), SYNC_FAST]);
    let mut p = env.conn();
    let mut pg = env.pg();
    let replica = start_loaded(&env.db.url(), &[SYNC_OFF]);
    let mut r = replica.conn();
    link(&replica, &mut r, &env.vk);
    // Another node that learns changes through its periodic catalog check...
    let polling = start_loaded(&env.db.url(), &[SYNC_FAST]);
    let mut o = polling.conn();
    // ...and one that checks only when told to re-read (DEBUG RELOAD loads a dataset).
    let quiet = start_loaded(&env.db.url(), &[SYNC_OFF, ("enable-debug-command", "yes")]);
    let mut q = quiet.conn();

    ok(&mut p, &["MEMBER.CREATE", "d", "RECENT-TTL", "1"]);
    assert_eq!(int(&mut p, &["MEMBER.ADD", "d", "x"]), 1);
    // Each node caches x. (To the other nodes the ADD on p is a write from outside: a filter
    // one of them built just before it may answer 0 until its sync loop has read it.)
    for c in [&mut p, &mut o, &mut q] {
        let mut last = None;
        let cached = wait_until(ONE_INTERVAL, || {
            let _ = reply(c, &["MEMBER.EXISTS", "d", "x"]);
            last = Some(explain(c, "d", "x"));
            last == Some((1, "cache-hit".to_string()))
        });
        assert!(cached, "x never cached: {last:?}");
        assert!(key_exists(c, &cache_key("d", "x", "")));
    }
    wait_reply(
        &replica,
        &mut r,
        &["MEMBER.EXISTS", "d", "x"],
        1,
        ONE_INTERVAL,
    );

    // DROP keeps the table.
    ok(&mut p, &["MEMBER.DROP", "d"]);
    assert!(!catalog_has(&mut pg, "d"));
    assert!(
        table_exists(&mut pg, "d"),
        "DROP without DELETE-DATA dropped the table"
    );
    assert!(err(&mut p, &["MEMBER.EXISTS", "d", "x"]).starts_with(UNKNOWN));
    assert!(err(&mut p, &["MEMBER.ADD", "d", "y"]).starts_with(UNKNOWN));
    assert!(err(&mut p, &["MEMBER.INFO", "d"]).starts_with(UNKNOWN));
    assert!(!key_exists(&mut p, b"member:d:bloom"));
    wait_unknown(&replica, &mut r, "d", ONE_INTERVAL);
    assert!(!key_exists(&mut r, b"member:d:bloom"));
    wait_unknown(&polling, &mut o, "d", ONE_INTERVAL);
    assert!(!key_exists(&mut o, b"member:d:bloom"));
    assert!(err(&mut p, &["MEMBER.DROP", "d"]).starts_with(UNKNOWN));

    // CREATE again: the kept table's rows are members again.
    ok(&mut p, &["MEMBER.CREATE", "d", "RECENT-TTL", "1"]);
    assert_eq!(reply(&mut p, &["MEMBER.EXISTS", "d", "x"]), Ok(1));
    assert_eq!(explain(&mut p, "d", "x"), (1, "cache-hit".to_string()));

    // DROP DELETE-DATA drops the table in the same transaction; a new CREATE starts clean.
    ok(&mut p, &["MEMBER.DROP", "d", "DELETE-DATA"]);
    assert!(!catalog_has(&mut pg, "d"));
    assert!(!table_exists(&mut pg, "d"), "DELETE-DATA left the table");
    ok(&mut p, &["MEMBER.CREATE", "d", "RECENT-TTL", "1"]);
    assert_eq!(explain(&mut p, "d", "x"), (0, "bloom-negative".to_string()));
    assert_eq!(set_info(&mut p, "d", "filter_items").as_deref(), Ok("0"));
    // The old exact-match key may still exist, but it is not believed: with the filter gone,
    // a lookup that cannot block must not answer 1 from it.
    // EXEC's raw reply (an error in it stays a value): the lookup may be refused inside MULTI
    // (it would need the database), which must not hide the DEL's count beside it.
    ok(&mut p, &["MULTI"]);
    for args in [&["DEL", "member:d:bloom"][..], &["MEMBER.EXISTS", "d", "x"]] {
        let queued = cmd(&mut p, args).unwrap();
        assert_eq!(queued, Value::SimpleString("QUEUED".into()), "{args:?}");
    }
    let exec = redis::ConnectionLike::req_command(&mut p, &redis::cmd("EXEC")).unwrap();
    let Value::Array(replies) = exec else {
        panic!("EXEC: {exec:?}");
    };
    let [Value::Int(del), exists] = &replies[..] else {
        panic!("MULTI replies: {replies:?}");
    };
    assert_eq!(*del, 1, "the DEL of the dropped set's filter found no key");
    assert!(
        !matches!(exists, Value::Int(1)),
        "the new set answered 1 from the dropped set's exact-match key: {exists:?}"
    );
    // The replica follows: the old filter and entries are gone there too.
    // (The DEL of the filter reached it too: it answers from the primary's rebuilt one.)
    wait_reply(
        &replica,
        &mut r,
        &["MEMBER.EXISTS", "d", "x"],
        0,
        ONE_INTERVAL,
    );
    // Its filter is the new set's (made for that catalog row) and answers "absent": x is not
    // in it, or, when a sync pass read the change log from a watermark older than the first
    // set's rows (the replica's own passes add logged rows whatever their age: a false
    // positive at worst, docs/sync.md), the database has confirmed it absent.
    assert!(
        wait_until(ONE_INTERVAL, || {
            let (answer, path) = explain(&mut r, "d", "x");
            answer == 0
                && (path == "bloom-negative" || path == "fp-cache")
                && set_info(&mut r, "d", "filter_origin").as_deref() == Ok("here")
        }),
        "the replica's filter for the new set: {:?}\nMEMBER.NODEINFO d: {:?}\n{}",
        explain(&mut r, "d", "x"),
        support::lifecycle::info_all(&mut r, "d"),
        log_tail(&replica)
    );
    // The polling node: dropped and created again between two checks or not, it never
    // answers from what it held before.
    wait_reply(
        &polling,
        &mut o,
        &["MEMBER.EXISTS", "d", "x"],
        0,
        ONE_INTERVAL,
    );
    // The quiet node still holds the first set's cache entry (its checks are off); a re-read
    // finds a catalog row of another identity and forgets it all.
    ok(&mut q, &["DEBUG", "RELOAD"]);
    wait_reply(
        &quiet,
        &mut q,
        &["MEMBER.EXISTS", "d", "x"],
        0,
        ONE_INTERVAL,
    );
    assert_ne!(explain(&mut q, "d", "x").1, "cache-hit");
}

#[test]
fn full_resync_after_a_cut_link_learns_created_and_dropped_sets() {
    let env = Env::with(&[
        ("repl-diskless-sync-delay", "0"),
        ("repl-backlog-size", "16384"),
        SYNC_FAST,
    ]);
    let mut p = env.conn();
    let replica = start_loaded(&env.db.url(), &[SYNC_OFF, ("enable-debug-command", "yes")]);
    let mut r = replica.conn();
    link(&replica, &mut r, &env.vk);
    for set in ["keep", "gone"] {
        ok(&mut p, &["MEMBER.CREATE", set, "RECENT-TTL", "1"]);
        assert_eq!(int(&mut p, &["MEMBER.ADD", set, "a"]), 1);
        wait_reply(
            &replica,
            &mut r,
            &["MEMBER.EXISTS", set, "a"],
            1,
            ONE_INTERVAL,
        );
    }
    let full_before: i64 = info_section(&mut p, "stats", "sync_full")
        .unwrap()
        .parse()
        .unwrap();

    // Cut the link and keep the replica from reconnecting while the primary drops a set,
    // creates one and writes past its tiny backlog: only a full resync can follow.
    // One transaction, so that no reconnection can slip in between the two.
    let mut sleeper = replica.conn();
    let sleeping = std::thread::spawn(move || {
        redis::pipe()
            .atomic()
            .cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("master")
            .cmd("DEBUG")
            .arg("SLEEP")
            .arg("3")
            .query::<(i64, String)>(&mut sleeper)
    });
    // The primary has seen the link go (the replica, asleep, cannot make another).
    assert!(
        wait_until(ONE_INTERVAL, || info_section(
            &mut p,
            "replication",
            "connected_slaves"
        )
        .as_deref()
            == Ok("0")),
        "the primary still sees its replica"
    );
    ok(&mut p, &["MEMBER.DROP", "gone"]);
    ok(&mut p, &["MEMBER.CREATE", "fresh", "RECENT-TTL", "1"]);
    assert_eq!(int(&mut p, &["MEMBER.ADD", "fresh", "f"]), 1);
    assert_eq!(int(&mut p, &["MEMBER.ADD", "keep", "b"]), 1);
    // Well past the backlog, in blocks large enough for Redis 7's lazy trimming.
    let filler = "z".repeat(512 * 1024);
    for i in 0..8 {
        let _: () = redis::cmd("SET")
            .arg(format!("filler{i}"))
            .arg(&filler)
            .query(&mut p)
            .unwrap();
    }
    let (killed, _) = sleeping.join().unwrap().expect("CLIENT KILL + DEBUG SLEEP");
    assert_eq!(killed, 1, "no link to the primary was cut");
    wait_linked(&replica, &mut r);
    let full_after: i64 = info_section(&mut p, "stats", "sync_full")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        full_after > full_before,
        "the replica resynchronized partially; the test needs a full resync"
    );

    // The full sync's load made it re-read the catalog (its periodic check is off): it
    // reflects the catalog's current version and knows keep and fresh, not gone, before
    // anyone names a set.
    let version: i64 = env
        .pg()
        .query_one("SELECT version FROM member_catalog_version", &[])
        .unwrap()
        .get(0);
    assert!(
        wait_until(ONE_INTERVAL, || info_field(&mut r, "catalog_version")
            == Ok(version.to_string())),
        "after the full resync the replica reflects catalog version {:?}, not {version}\n{}",
        info_field(&mut r, "catalog_version"),
        log_tail(&replica)
    );
    assert_eq!(info_field(&mut r, "sets").as_deref(), Ok("2"));
    // The filter it already knew came anew from the RDB, not caught up: it catches up at
    // once (not at its next sync interval, an hour away).
    assert!(
        wait_until(ONE_INTERVAL, || set_info(
            &mut r,
            "keep",
            "filter_caught_up"
        )
        .as_deref()
            == Ok("1")),
        "keep's filter never caught up after the full resync: {:?}",
        set_info(&mut r, "keep", "filter_caught_up")
    );
    wait_reply(
        &replica,
        &mut r,
        &["MEMBER.EXISTS", "fresh", "f"],
        1,
        ONE_INTERVAL,
    );
    wait_reply(
        &replica,
        &mut r,
        &["MEMBER.EXISTS", "keep", "b"],
        1,
        ONE_INTERVAL,
    );
    let gone = reply(&mut r, &["MEMBER.EXISTS", "gone", "a"]);
    assert!(
        gone.as_ref().is_err_and(|e| e.starts_with(UNKNOWN)),
        "the replica still serves a set dropped while its link was cut: {gone:?}\n{}",
        log_tail(&replica)
    );

    ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
    assert_eq!(reply(&mut r, &["MEMBER.ADD", "fresh", "g"]), Ok(1));
    assert_eq!(reply(&mut r, &["MEMBER.EXISTS", "fresh", "g"]), Ok(1));
    assert!(err(&mut r, &["MEMBER.ADD", "gone", "a"]).starts_with(UNKNOWN));
}

#[test]
fn drop_refusals() {
    let env = Env::with(&[("repl-diskless-sync-delay", "0")]);
    let mut p = env.conn();
    assert!(err(&mut p, &["MEMBER.DROP", "nosuch"]).starts_with(UNKNOWN));
    assert!(err(&mut p, &["MEMBER.DROP"]).contains("wrong number"));
    assert!(err(&mut p, &["MEMBER.DROP", "Bad"]).contains("invalid set name"));
    ok(&mut p, &["MEMBER.CREATE", "s"]);
    assert!(err(&mut p, &["MEMBER.DROP", "s", "NOW"]).contains("unknown option"));
    assert!(err(&mut p, &["MEMBER.DROP", "s", "DELETE-DATA", "x"]).contains("wrong number"));
    assert!(err(&mut p, &["MEMBER._DROP", "s"]).contains("internal command"));
    let e = err(
        &mut p,
        &["EVAL", "return redis.call('MEMBER.DROP', 's')", "0"],
    );
    assert!(e.contains("cannot block"), "{e}");
    // Nothing was dropped by the refused calls.
    assert_eq!(reply(&mut p, &["MEMBER.EXISTS", "s", "x"]), Ok(0));
    let replica = start_loaded(&env.db.url(), &[]);
    let mut r = replica.conn();
    link(&replica, &mut r, &env.vk);
    let e = err(&mut r, &["MEMBER.DROP", "s"]);
    assert!(e.starts_with("READONLY"), "DROP on a replica: {e}");
    assert!(catalog_has(&mut env.pg(), "s"));
}

#[test]
fn a_promoted_replica_confirms_its_sets_before_serving() {
    let env = Env::with(&[("repl-diskless-sync-delay", "0"), SYNC_OFF]);
    let mut p = env.conn();
    let replica = start_loaded(&env.db.url(), &[SYNC_OFF]);
    let mut r = replica.conn();
    link(&replica, &mut r, &env.vk);
    ok(&mut p, &["MEMBER.CREATE", "stale", "RECENT-TTL", "1"]);
    ok(&mut p, &["MEMBER.CREATE", "live", "RECENT-TTL", "1"]);
    for set in ["stale", "live"] {
        assert_eq!(int(&mut p, &["MEMBER.ADD", set, "x"]), 1);
        wait_reply(
            &replica,
            &mut r,
            &["MEMBER.EXISTS", set, "x"],
            1,
            ONE_INTERVAL,
        );
    }
    // Dropped through another node: nothing reaches the replica by replication, and its
    // periodic check is off.
    let other = start_loaded(&env.db.url(), &[SYNC_OFF]);
    ok(&mut other.conn(), &["MEMBER.DROP", "stale"]);
    assert_eq!(reply(&mut r, &["MEMBER.EXISTS", "stale", "x"]), Ok(1));

    // Promoted, it serves no set the catalog has not confirmed since.
    ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
    let e = reply(&mut r, &["MEMBER.ADD", "stale", "y"]);
    assert!(
        e.as_ref().is_err_and(|e| e.starts_with(UNKNOWN)),
        "the promoted replica wrote to a set dropped elsewhere: {e:?}"
    );
    let e = reply(&mut r, &["MEMBER.EXISTS", "stale", "x"]);
    assert!(e.as_ref().is_err_and(|e| e.starts_with(UNKNOWN)), "{e:?}");
    assert_eq!(reply(&mut r, &["MEMBER.EXISTS", "live", "x"]), Ok(1));
    assert_eq!(reply(&mut r, &["MEMBER.ADD", "live", "y"]), Ok(1));
    let n: i64 = env
        .pg()
        .query_one(
            "SELECT count(*) FROM member_stale WHERE entity_id = 'y'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "a row was written to the dropped set's table");
}
