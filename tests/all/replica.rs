//! A replica answers "absent" from its filter only while its link to the primary is online and
//! its filter has caught up since, and never later than the stated lag bound
//! (docs/replicas.md). Each race is held open deterministically: a proxy between the replica
//! and its primary refuses the link or stalls it, a proxy between the replica and PostgreSQL
//! refuses the database, and the replica's own sync loop is off where it would otherwise
//! cover the gap by chance. Every test here fails against a build whose replica trusts its
//! filter whatever its link.
use crate::support;

use std::time::Duration;

use redis::Connection;
use support::lifecycle::{log_tail, wait_linked, SYNC_OFF};
use support::member::*;
use support::proxy::{Mode, Proxy};
use support::{fresh_db, server_version, wait_until, Pg, Valkey};

use super::failover::exists;

const WITHIN: Duration = Duration::from_secs(30);
const FULL_SYNC_NOW: (&str, &str) = ("repl-diskless-sync-delay", "0");

fn node_field(c: &mut Connection, name: &str) -> String {
    info_field(c, name).unwrap_or_else(|e| panic!("INFO member_{name}: {e:?}"))
}

/// Waits until `vk`'s INFO member `name` reads `want`.
fn wait_field(vk: &Valkey, c: &mut Connection, name: &str, want: &str) {
    assert!(
        wait_until(WITHIN, || info_field(c, name).as_deref() == Ok(want)),
        "INFO member_{name} never read {want}: {:?}\n{}",
        info_field(c, name),
        log_tail(vk)
    );
}

/// Waits until `vk` knows `set` and its filter answers "absent" there.
fn wait_serving(vk: &Valkey, c: &mut Connection, set: &str) {
    assert!(
        wait_until(WITHIN, || set_info(c, set, "filter_serves_absent")
            .as_deref()
            == Ok("1")),
        "{set}'s filter never served \"absent\": {:?}, withheld {:?}\n{}",
        set_info(c, set, "filter_serves_absent"),
        info_field(c, "serves_absent_withheld"),
        log_tail(vk)
    );
}

/// A libpq connection string for `url` through `port` instead of its own.
fn through(url: &str, port: u16) -> String {
    url.split(' ')
        .map(|kv| match kv.strip_prefix("port=") {
            Some(_) => format!("port={port}"),
            None => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Two primaries on one database; the first is then made a replica of the second while its
/// link is refused (the full sync of a Sentinel demotion, held open), and the second takes
/// ADDs, MADDs and DELs, and a set created meanwhile. The demoted node, whose filters were
/// trusted a moment before, never answers 0 for an acknowledged item while its link is down;
/// once linked and caught up it serves "absent" again, and every item answers 1. Run with
/// the full sync diskless (the default), through a file, and over two channels (Valkey 8 and
/// later: the link comes up before the snapshot is loaded).
#[test]
fn a_demoted_primary_answers_no_zero_until_linked_and_caught_up() {
    demotion(&[]);
}

#[test]
fn a_demoted_primary_through_a_disk_sync_answers_no_zero() {
    demotion(&[("repl-diskless-sync", "no")]);
}

#[test]
fn a_demoted_primary_through_a_dual_channel_sync_answers_no_zero() {
    let probe = Valkey::start_plain();
    let version = server_version(&mut probe.conn());
    if !version.valkey_at_least((8, 0, 0)) {
        eprintln!("skipped on {version:?}: dual-channel replication is Valkey 8's");
        return;
    }
    demotion(&[("dual-channel-replication-enabled", "yes")]);
}

fn demotion(sync: &[(&str, &str)]) {
    let db = fresh_db();
    // Their own sync loops off: only the link (or the database) can bring B's writes to A.
    let mut configs = vec![SYNC_OFF, FULL_SYNC_NOW, ("enable-debug-command", "yes")];
    configs.extend_from_slice(sync);
    let a = start_loaded(&db.url(), &configs);
    let b = start_loaded(&db.url(), &configs);
    let (mut ca, mut cb) = (a.conn(), b.conn());
    ok(&mut ca, &["MEMBER.CREATE", "s"]);
    assert_eq!(int(&mut ca, &["MEMBER.ADD", "s", "before"]), 1);
    wait_serving(&a, &mut ca, "s");
    assert_eq!(node_field(&mut ca, "replica_link"), "none");
    assert_eq!(int(&mut cb, &["MEMBER.EXISTS", "s", "before"]), 1);

    // A dataset on the new primary, so that its snapshot is more than the module's keys.
    let _ = cmd(&mut cb, &["DEBUG", "POPULATE", "200000", "plain"]);
    let link = Proxy::start(b.port());
    link.set(Mode::Refuse);
    ok(
        &mut ca,
        &["REPLICAOF", "127.0.0.1", &link.port().to_string()],
    );
    assert_eq!(node_field(&mut ca, "replica_link"), "down");
    assert_eq!(node_field(&mut ca, "serves_absent_withheld"), "link-down");
    assert_eq!(node_field(&mut ca, "serves_absent"), "0");
    let withheld_before: i64 = node_field(&mut ca, "filter_withheld_lookups")
        .parse()
        .unwrap();

    // Writers on the new primary; the demoted node is asked right after each acknowledgement.
    let mut asked = 0;
    let mut zeros = Vec::new();
    let mut ask = |ca: &mut Connection, set: &str, item: &str| {
        asked += 1;
        if exists(ca, set, item) == Some(0) {
            zeros.push(format!("{set}/{item}"));
        }
    };
    for i in 0..60 {
        let item = format!("n{i}");
        assert_eq!(int(&mut cb, &["MEMBER.ADD", "s", &item]), 1);
        ask(&mut ca, "s", &item);
    }
    let batch: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let mut madd = vec!["MEMBER.MADD", "s", "ITEMS"];
    madd.extend(batch.iter().map(String::as_str));
    let _ = cmd(&mut cb, &madd).unwrap();
    for item in &batch {
        ask(&mut ca, "s", item);
    }
    for i in 0..10 {
        let _ = cmd(&mut cb, &["MEMBER.DEL", "s", &format!("n{i}")]).unwrap();
    }
    // A set created on the new primary while the link is down: the demoted node learns it
    // from the catalog and builds it from the database, and still does not trust that build.
    ok(&mut cb, &["MEMBER.CREATE", "t"]);
    assert_eq!(int(&mut cb, &["MEMBER.ADD", "t", "first"]), 1);
    ask(&mut ca, "t", "first");
    for i in 0..30 {
        let item = format!("t{i}");
        assert_eq!(int(&mut cb, &["MEMBER.ADD", "t", &item]), 1);
        ask(&mut ca, "t", &item);
    }
    assert!(
        zeros.is_empty(),
        "{} of {asked} acknowledged items answered 0 on the demoted node while its link was \
         down: {zeros:?}\n{}",
        zeros.len(),
        log_tail(&a)
    );
    let withheld: i64 = node_field(&mut ca, "filter_withheld_lookups")
        .parse()
        .unwrap();
    assert!(
        withheld > withheld_before,
        "lookups sent past the filter were not counted: {withheld_before} -> {withheld}"
    );
    assert_eq!(node_field(&mut ca, "serves_absent_withheld"), "link-down");

    // The link comes up: through the handshake, the full sync (the node answers LOADING
    // meanwhile) and the grace, acknowledged items still never answer 0; after the grace and
    // a pass the node serves "absent" again.
    link.set(Mode::Pass);
    let began = std::time::Instant::now();
    let mut during = 0;
    let mut zeros = Vec::new();
    while info_field(&mut ca, "serves_absent").as_deref() != Ok("1") && began.elapsed() < WITHIN {
        let item = format!("d{during}");
        assert_eq!(int(&mut cb, &["MEMBER.ADD", "s", &item]), 1);
        during += 1;
        if let Ok(redis::Value::Int(0)) = cmd(&mut ca, &["MEMBER.EXISTS", "s", &item]) {
            // Once the node serves "absent" again, an item asked before the primary's effect
            // arrived is the read-your-writes window (docs/replicas.md), not a stale filter.
            if info_field(&mut ca, "serves_absent").as_deref() == Ok("1") {
                break;
            }
            zeros.push(item);
        }
    }
    assert!(
        zeros.is_empty(),
        "{} of {during} acknowledged items answered 0 while the link came up: {zeros:?}\n{}",
        zeros.len(),
        log_tail(&a)
    );
    assert!(
        during > 0,
        "the node served \"absent\" at once after the link came up"
    );
    let withheld_after: i64 = node_field(&mut ca, "filter_withheld_lookups")
        .parse()
        .unwrap();
    eprintln!(
        "demotion {sync:?}: {asked} asks while the link was refused and {during} while it came \
         up, none 0; {} lookups sent past the filter in all ({} while refused); from the link \
         let through to serving \"absent\" again: {:.2} s",
        withheld_after - withheld_before,
        withheld - withheld_before,
        began.elapsed().as_secs_f64()
    );
    wait_linked(&a, &mut ca, WITHIN);
    wait_field(&a, &mut ca, "serves_absent_withheld", "none");
    wait_serving(&a, &mut ca, "s");
    wait_serving(&a, &mut ca, "t");
    assert_eq!(node_field(&mut ca, "replica_link"), "up");
    for i in 10..60 {
        assert_eq!(exists(&mut ca, "s", &format!("n{i}")), Some(1), "n{i}");
    }
    for item in &batch {
        assert_eq!(exists(&mut ca, "s", item), Some(1), "{item}");
    }
    assert_eq!(exists(&mut ca, "t", "first"), Some(1));
    assert_eq!(
        explain(&mut ca, "s", "never-added"),
        (0, "bloom-negative".to_string())
    );
    // The window closes with WAIT: once the replica has acknowledged the ADD's offset, the
    // effect is applied there.
    let waited = std::time::Instant::now();
    for i in 0..200 {
        let item = format!("w{i}");
        assert_eq!(int(&mut cb, &["MEMBER.ADD", "s", &item]), 1);
        assert_eq!(int(&mut cb, &["WAIT", "1", "5000"]), 1, "WAIT after {item}");
        assert_eq!(exists(&mut ca, "s", &item), Some(1), "{item} after WAIT");
    }
    let waited = waited.elapsed();
    // What WAIT costs the writer: the same ADDs and lookups without it (a figure, not a check).
    let plain = std::time::Instant::now();
    for i in 0..200 {
        let item = format!("v{i}");
        assert_eq!(int(&mut cb, &["MEMBER.ADD", "s", &item]), 1);
        let _ = exists(&mut ca, "s", &item);
    }
    eprintln!(
        "demotion {sync:?}: 200 x (ADD, WAIT 1, EXISTS on the replica) {:.1} ms, without the \
         WAIT {:.1} ms",
        waited.as_secs_f64() * 1e3,
        plain.elapsed().as_secs_f64() * 1e3
    );
    assert!(
        wait_until(WITHIN, || a
            .log()
            .contains("answers \"absent\" from its filters again")),
        "the log does not say the replica serves again\n{}",
        log_tail(&a)
    );
}

/// A replica whose link stalls without breaking (the link still reads up) and whose database
/// is out of reach: its filter is stale and nothing can catch it up. Within the lag bound it
/// may still answer 0 for an ADD the primary acknowledged; after it, never: the lookup gets
/// `UNAVAILABLE`. Once its database is back, a pass catches it up and the item answers 1.
#[test]
fn a_stalled_replica_stops_answering_absent_after_the_lag_bound() {
    let db = fresh_db();
    let primary = start_loaded(&db.url(), &[FULL_SYNC_NOW]);
    let mut p = primary.conn();
    ok(&mut p, &["MEMBER.CREATE", "s"]);
    assert_eq!(int(&mut p, &["MEMBER.ADD", "s", "before"]), 1);
    let link = Proxy::start(primary.port());
    let pg = Proxy::start(Pg::get().port());
    let replicaof = format!("127.0.0.1 {}", link.port());
    let replica = start_loaded(
        &through(&db.url(), pg.port()),
        &[
            ("member.sync-interval-ms", "200"),
            ("member.db-timeout-ms", "1000"),
            ("replicaof", replicaof.as_str()),
        ],
    );
    let mut r = replica.conn();
    wait_linked(&replica, &mut r, WITHIN);
    wait_serving(&replica, &mut r, "s");
    let bound: u64 = node_field(&mut r, "replica_lag_bound_ms").parse().unwrap();
    assert_eq!(bound, 200 + 1000 + 1000);

    link.set(Mode::StallExisting);
    pg.set(Mode::Refuse);
    pg.cut();
    assert_eq!(int(&mut p, &["MEMBER.ADD", "s", "late"]), 1);
    wait_field(&replica, &mut r, "serves_absent_withheld", "lagging");
    assert_eq!(
        info_section(&mut r, "replication", "master_link_status").as_deref(),
        Ok("up"),
        "the stalled link should still read up"
    );
    match cmd(&mut r, &["MEMBER.EXISTS", "s", "late"]) {
        Err(e) => assert_eq!(e.code(), Some("UNAVAILABLE"), "{e}"),
        Ok(v) => panic!(
            "a replica past its lag bound answered {v:?} for an acknowledged ADD, from a \
             filter it could not catch up\n{}",
            log_tail(&replica)
        ),
    }
    assert!(
        node_field(&mut r, "replica_lag_holds")
            .parse::<u64>()
            .unwrap()
            >= 1
    );

    pg.set(Mode::Pass);
    wait_field(&replica, &mut r, "serves_absent_withheld", "none");
    assert_eq!(exists(&mut r, "s", "late"), Some(1));
    link.set(Mode::Pass);
}

/// A replica started with `replicaof` whose link is refused: it learns the set from the
/// catalog and builds its filter from the database before its link is up, and that build
/// does not answer "absent" until the link is up and a pass caught it up.
#[test]
fn a_replica_built_before_its_link_is_up_waits_for_the_link() {
    let db = fresh_db();
    let primary = start_loaded(&db.url(), &[FULL_SYNC_NOW, SYNC_OFF]);
    let mut p = primary.conn();
    ok(&mut p, &["MEMBER.CREATE", "s"]);
    assert_eq!(int(&mut p, &["MEMBER.ADD", "s", "before"]), 1);
    let link = Proxy::start(primary.port());
    link.set(Mode::Refuse);
    let replicaof = format!("127.0.0.1 {}", link.port());
    let replica = start_loaded(&db.url(), &[SYNC_OFF, ("replicaof", replicaof.as_str())]);
    let mut r = replica.conn();
    assert_eq!(exists(&mut r, "s", "before"), Some(1));
    assert!(
        wait_until(WITHIN, || set_info(&mut r, "s", "filter_complete")
            .as_deref()
            == Ok("1")),
        "the replica never built its filter\n{}",
        log_tail(&replica)
    );
    assert_eq!(node_field(&mut r, "serves_absent_withheld"), "link-down");
    for i in 0..30 {
        let item = format!("x{i}");
        assert_eq!(int(&mut p, &["MEMBER.ADD", "s", &item]), 1);
        assert_ne!(
            exists(&mut r, "s", &item),
            Some(0),
            "{item} answered 0 on a replica whose link never came up\n{}",
            log_tail(&replica)
        );
    }
    link.set(Mode::Pass);
    wait_linked(&replica, &mut r, WITHIN);
    wait_serving(&replica, &mut r, "s");
    assert_eq!(exists(&mut r, "s", "x29"), Some(1));
}
