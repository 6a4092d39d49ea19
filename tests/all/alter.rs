//! MEMBER.ALTER and auto-grow (issue 10): a new ERROR or CAPACITY rebuilds the filter in the
//! background while the old one serves; TTLs change the definition only; NORMALIZE, TOKENIZE
//! and bad input are refused with nothing changed; other nodes and replicas learn the new
//! definition; a set filled past its CAPACITY grows its filter by itself.
use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Connection;
use support::member::*;
use support::{start_with, wait_until, Valkey};

const SYNC_FAST: (&str, &str) = ("member.sync-interval-ms", "300");
const SYNC_OFF: (&str, &str) = ("member.sync-interval-ms", "3600000");
const WITHIN: Duration = Duration::from_secs(30);

fn info_f64(c: &mut Connection, set: &str, field: &str) -> f64 {
    let v = set_info(c, set, field).unwrap();
    v.parse()
        .unwrap_or_else(|e| panic!("MEMBER.INFO {set} {field} {v:?}: {e}"))
}

fn info_u64(c: &mut Connection, set: &str, field: &str) -> u64 {
    info_f64(c, set, field) as u64
}

fn log_tail(vk: &Valkey) -> String {
    let log = vk.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Waits until `set`'s filter on `c` is built for `capacity` members at `rate` and no rebuild
/// is running.
fn wait_built_for(vk: &Valkey, c: &mut Connection, set: &str, capacity: u64, rate: f64) {
    let ok = wait_until(WITHIN, || {
        built_for(c, set) == Some((capacity, rate))
            && set_info(c, set, "rebuild_state").as_deref() == Ok("idle")
    });
    assert!(
        ok,
        "{set}: filter never built for {capacity} at {rate} (now {:?}, last rebuild {:?} {:?})\n{}",
        built_for(c, set),
        set_info(c, set, "last_rebuild"),
        set_info(c, set, "last_rebuild_error"),
        log_tail(vk)
    );
}

/// The (capacity, error rate) `set`'s filter was built for; `None` while either cannot be
/// read (a wait polls it, so a failed read is a "not yet").
fn built_for(c: &mut Connection, set: &str) -> Option<(u64, f64)> {
    let cap = set_info(c, set, "filter_capacity").ok()?.parse().ok()?;
    let rate = set_info(c, set, "filter_error_rate").ok()?.parse().ok()?;
    Some((cap, rate))
}

fn madd(c: &mut Connection, set: &str, items: &[String]) {
    for chunk in items.chunks(1000) {
        let mut k = redis::cmd("MEMBER.MADD");
        k.arg(set).arg("ITEMS");
        for i in chunk {
            k.arg(i);
        }
        let v: Vec<i64> = k.query(c).unwrap();
        assert!(v.iter().all(|&x| x == 1), "MADD {set}: {v:?}");
    }
}

fn items(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// Every item answers 1 on `c`.
fn all_members(c: &mut Connection, set: &str, items: &[String]) {
    for i in items {
        assert_eq!(int(c, &["MEMBER.EXISTS", set, i]), 1, "{set} lost {i}");
    }
}

#[test]
fn alter_error_and_capacity_swaps_in_a_new_filter_while_lookups_are_served() {
    let env = Env::with(&[SYNC_FAST]);
    let mut c = env.conn();
    ok(
        &mut c,
        &["MEMBER.CREATE", "s", "ERROR", "0.01", "CAPACITY", "1000"],
    );
    let first = items("m", 800);
    madd(&mut c, "s", &first);
    assert_eq!(built_for(&mut c, "s"), Some((1000, 0.01)));

    // A reader checks the members the whole time: never a 0.
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, wrong) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (stop, reads, wrong) = (stop.clone(), reads.clone(), wrong.clone());
        let mut r = env.conn();
        let first = first.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for i in first.iter().step_by(7) {
                    if int(&mut r, &["MEMBER.EXISTS", "s", i]) != 1 {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    // Without SYNC: OK once the catalog holds it; the build follows in the background, and
    // adds made meanwhile reach the new filter.
    ok(
        &mut c,
        &["MEMBER.ALTER", "s", "ERROR", "0.001", "CAPACITY", "20000"],
    );
    assert_eq!(set_info(&mut c, "s", "error_rate").as_deref(), Ok("0.001"));
    assert_eq!(set_info(&mut c, "s", "capacity").as_deref(), Ok("20000"));
    let second = items("n", 300);
    madd(&mut c, "s", &second);
    wait_built_for(&env.vk, &mut c, "s", 20000, 0.001);
    assert_eq!(info_u64(&mut c, "s", "filter_hashes"), 10);
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild_reason").as_deref(),
        Ok("alter")
    );

    // With SYNC the reply comes once the new filter is in.
    ok(&mut c, &["MEMBER.ALTER", "s", "CAPACITY", "5000", "SYNC"]);
    assert_eq!(
        built_for(&mut c, "s"),
        Some((5000, 0.001)),
        "ALTER … SYNC replied before its filter was in"
    );

    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert!(reads.load(Ordering::Relaxed) > 0);
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "a member was answered 0 during the rebuilds"
    );
    all_members(&mut c, "s", &first);
    all_members(&mut c, "s", &second);
    for i in items("never", 300) {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", &i]), 0);
    }
    // The catalog holds the new settings.
    let row = env
        .pg()
        .query_one(
            "SELECT error_rate, capacity FROM member_catalog WHERE name = 's'",
            &[],
        )
        .unwrap();
    assert_eq!((row.get::<_, f64>(0), row.get::<_, i64>(1)), (0.001, 5000));
}

#[test]
fn alter_of_ttls_changes_the_definition_only() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "t", "CAPACITY", "1000"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "t", "a"]), 1);
    let bits = set_info(&mut c, "t", "filter_bits").unwrap();
    let version = info_field(&mut c, "catalog_version").unwrap();
    ok(
        &mut c,
        &["MEMBER.ALTER", "t", "cache-ttl", "60", "RECENT-TTL", "3"],
    );
    assert_eq!(set_info(&mut c, "t", "cache_ttl").as_deref(), Ok("60"));
    assert_eq!(set_info(&mut c, "t", "recent_ttl").as_deref(), Ok("3"));
    assert_eq!(set_info(&mut c, "t", "filter_bits").unwrap(), bits);
    assert_eq!(
        set_info(&mut c, "t", "rebuild_state").as_deref(),
        Ok("idle")
    );
    assert_eq!(
        set_info(&mut c, "t", "last_rebuild_reason").as_deref(),
        Ok("create"),
        "a TTL change rebuilt the filter"
    );
    // The change bumped the catalog version (other nodes learn it at their next check).
    assert!(wait_until(WITHIN, || info_field(&mut c, "catalog_version")
        .is_ok_and(|v| v != version)));
    let row = env
        .pg()
        .query_one(
            "SELECT cache_ttl, recent_ttl FROM member_catalog WHERE name = 't'",
            &[],
        )
        .unwrap();
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i32>(1)), (60, 3));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "t", "a"]), 1);
}

#[test]
fn refused_alters_change_nothing() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "r", "CAPACITY", "1000"]);
    let settings = |c: &mut Connection| {
        [
            "error_rate",
            "capacity",
            "cache_ttl",
            "recent_ttl",
            "normalize",
            "filter_bits",
        ]
        .map(|f| set_info(c, "r", f))
    };
    let before = settings(&mut c);
    let version = info_field(&mut c, "catalog_version").unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["MEMBER.ALTER", "r", "NORMALIZE", "lower"],
            "ERR NORMALIZE cannot be changed",
        ),
        (
            &["MEMBER.ALTER", "r", "normalize", "none"],
            "ERR NORMALIZE cannot be changed",
        ),
        (
            &[
                "MEMBER.ALTER",
                "r",
                "CAPACITY",
                "5",
                "TOKENIZE",
                "hmac-sha256",
            ],
            "ERR TOKENIZE cannot be changed",
        ),
        (
            &["MEMBER.ALTER", "nope", "CAPACITY", "5"],
            "ERR no such set",
        ),
        (
            &["MEMBER.ALTER", "Bad-Name", "CAPACITY", "5"],
            "ERR invalid set name",
        ),
        (&["MEMBER.ALTER", "r", "ERROR", "0"], "ERR ERROR must be"),
        (&["MEMBER.ALTER", "r", "ERROR", "0.6"], "ERR ERROR must be"),
        (&["MEMBER.ALTER", "r", "ERROR", "x"], "ERR ERROR must be"),
        (
            &["MEMBER.ALTER", "r", "CAPACITY", "0"],
            "ERR CAPACITY must be",
        ),
        (
            &["MEMBER.ALTER", "r", "CAPACITY", "4000000001"],
            "ERR CAPACITY must be",
        ),
        (
            &["MEMBER.ALTER", "r", "CACHE-TTL", "0"],
            "ERR CACHE-TTL must be",
        ),
        (
            &["MEMBER.ALTER", "r", "RECENT-TTL", "86401"],
            "ERR RECENT-TTL must be",
        ),
        (
            &["MEMBER.ALTER", "r", "CAPACITY", "5", "CAPACITY", "6"],
            "ERR option given more than once",
        ),
        (
            &["MEMBER.ALTER", "r", "SIZE", "5"],
            "ERR unknown option 'SIZE'",
        ),
        (
            &["MEMBER.ALTER", "r", "SYNC"],
            "ERR MEMBER.ALTER needs at least one of",
        ),
        (
            &["MEMBER.ALTER", "r", "CAPACITY"],
            "ERR wrong number of arguments",
        ),
        (&["MEMBER.ALTER", "r"], "ERR wrong number of arguments"),
        (&["MEMBER.ALTER"], "ERR wrong number of arguments"),
        (
            &[
                "MEMBER.ALTER",
                "r",
                "ERROR",
                "0.000001",
                "CAPACITY",
                "4000000000",
            ],
            "ERR the filter would need",
        ),
    ];
    for (args, want) in cases {
        let e = err(&mut c, args);
        assert!(e.starts_with(want), "{args:?}: {e}");
    }
    // Inside MULTI it cannot wait for the database.
    let e = redis::pipe()
        .atomic()
        .cmd("MEMBER.ALTER")
        .arg(&["r", "CAPACITY", "7"])
        .query::<(String,)>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("cannot block"), "{e}");
    // A user without write access to the set.
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "ro",
            "on",
            ">pw",
            "%R~member:*",
            "+member.alter",
            "+member.info",
        ])
        .query(&mut c)
        .unwrap();
    let mut ro = env.conn();
    let _: () = redis::cmd("AUTH")
        .arg(&["ro", "pw"])
        .query(&mut ro)
        .unwrap();
    let e = err(&mut ro, &["MEMBER.ALTER", "r", "CAPACITY", "7"]);
    assert!(
        e.starts_with("NOPERM this user may not write set 'r'"),
        "{e}"
    );

    assert_eq!(settings(&mut c), before, "a refused ALTER changed the set");
    assert_eq!(info_field(&mut c, "catalog_version").unwrap(), version);
    let row = env
        .pg()
        .query_one("SELECT capacity FROM member_catalog WHERE name = 'r'", &[])
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1000);
}

#[test]
fn another_node_and_a_replica_learn_the_altered_definition() {
    let env = Env::with(&[SYNC_FAST, ("repl-diskless-sync-delay", "0")]);
    let mut p = env.conn();
    ok(&mut p, &["MEMBER.CREATE", "x", "CAPACITY", "1000"]);
    let members = items("x", 200);
    madd(&mut p, "x", &members);
    // Another primary on the same database, and a replica of the first that learns sets only
    // through replication (its own catalog check is off).
    let other = start_with(&env.db.url(), &[SYNC_FAST]);
    let mut o = other.conn();
    assert!(wait_until(WITHIN, || set_info(
        &mut o,
        "x",
        "filter_complete"
    )
    .as_deref()
        == Ok("1")));
    let replica = start_with(&env.db.url(), &[SYNC_OFF]);
    let mut r = replica.conn();
    ok(
        &mut r,
        &["REPLICAOF", "127.0.0.1", &env.vk.port().to_string()],
    );
    assert!(
        wait_until(WITHIN, || set_info(&mut r, "x", "filter_complete")
            .as_deref()
            == Ok("1")),
        "replica never got the set\n{}",
        log_tail(&replica)
    );

    ok(
        &mut p,
        &[
            "MEMBER.ALTER",
            "x",
            "ERROR",
            "0.001",
            "CAPACITY",
            "4000",
            "CACHE-TTL",
            "77",
        ],
    );
    wait_built_for(&env.vk, &mut p, "x", 4000, 0.001);
    for (vk, c) in [(&other, &mut o), (&replica, &mut r)] {
        assert!(
            wait_until(WITHIN, || set_info(c, "x", "cache_ttl").as_deref()
                == Ok("77")),
            "a node never learned the new definition\n{}",
            log_tail(vk)
        );
        assert_eq!(set_info(c, "x", "error_rate").as_deref(), Ok("0.001"));
        wait_built_for(vk, c, "x", 4000, 0.001);
        all_members(c, "x", &members);
    }
    // The other primary built its own; the replica got its primary's.
    assert_eq!(
        set_info(&mut o, "x", "last_rebuild_reason").as_deref(),
        Ok("alter")
    );
    assert_ne!(
        set_info(&mut r, "x", "last_rebuild_reason").as_deref(),
        Ok("alter")
    );
}

#[test]
fn concurrent_alters_all_apply_and_an_alter_racing_a_drop_never_revives_the_set() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "k"]);
    // Two ALTERs of different settings at once, again and again: their answers may reach the
    // main thread in either order, and the node must end up holding both changes.
    for round in 0..20 {
        let (cache, recent) = ((50 + round).to_string(), (5 + round).to_string());
        let threads: Vec<_> = [["CACHE-TTL", &cache], ["RECENT-TTL", &recent]]
            .into_iter()
            .map(|[o, v]| {
                let (mut c, o, v) = (env.conn(), o.to_string(), v.to_string());
                std::thread::spawn(move || ok(&mut c, &["MEMBER.ALTER", "k", &o, &v]))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(
            set_info(&mut c, "k", "cache_ttl"),
            Ok(cache),
            "round {round}"
        );
        assert_eq!(
            set_info(&mut c, "k", "recent_ttl"),
            Ok(recent),
            "round {round}"
        );
    }

    for round in 0..10 {
        ok(&mut c, &["MEMBER.CREATE", "d"]);
        let mut a = env.conn();
        let alter = std::thread::spawn(move || {
            cmd(&mut a, &["MEMBER.ALTER", "d", "CACHE-TTL", "9"]).map(|_| ())
        });
        ok(&mut c, &["MEMBER.DROP", "d"]);
        match alter.join().unwrap() {
            Ok(()) => {}
            Err(e) => assert!(
                e.detail().unwrap_or("").starts_with("no such set"),
                "round {round}: {e}"
            ),
        }
        let e = err(&mut c, &["MEMBER.INFO", "d"]);
        assert!(
            e.starts_with("ERR no such set"),
            "round {round}: the set came back after its DROP: {e}"
        );
    }
}

fn wait_grown(vk: &Valkey, c: &mut Connection, set: &str, rate: f64) {
    let ok = wait_until(Duration::from_secs(60), || {
        set_info(c, set, "rebuild_state").as_deref() == Ok("idle")
            && set_info(c, set, "auto_grow_rebuilds").is_ok_and(|n| n != "0")
            && set_info(c, set, "filter_fpr_est")
                .is_ok_and(|v| v.parse::<f64>().is_ok_and(|f| f <= 2.0 * rate))
    });
    assert!(
        ok,
        "{set} never grew: fpr {:?}, grows {:?}, last {:?} {:?}\n{}",
        set_info(c, set, "filter_fpr_est"),
        set_info(c, set, "auto_grow_rebuilds"),
        set_info(c, set, "last_rebuild"),
        set_info(c, set, "last_rebuild_error"),
        log_tail(vk)
    );
}

#[test]
fn a_set_filled_to_three_times_its_capacity_grows_its_filter_by_itself() {
    let env = Env::with(&[SYNC_FAST]);
    let mut c = env.conn();
    // Through the module: the filter may grow while the adds arrive.
    ok(
        &mut c,
        &["MEMBER.CREATE", "g", "CAPACITY", "1000", "ERROR", "0.01"],
    );
    let members = items("g", 3000);
    madd(&mut c, "g", &members);
    wait_grown(&env.vk, &mut c, "g", 0.01);
    assert_eq!(
        set_info(&mut c, "g", "last_rebuild_reason").as_deref(),
        Ok("auto-grow")
    );
    assert!(info_u64(&mut c, "g", "filter_capacity") > 3000);
    all_members(&mut c, "g", &members);

    // From outside: 3000 rows in one transaction reach the filter through the sync loop,
    // past its CAPACITY at once; the grown filter is sized for twice the rows.
    ok(
        &mut c,
        &["MEMBER.CREATE", "h", "CAPACITY", "1000", "ERROR", "0.01"],
    );
    env.pg()
        .batch_execute(
            "INSERT INTO member_h (entity_id) SELECT 'h' || i FROM generate_series(0, 2999) i",
        )
        .unwrap();
    wait_grown(&env.vk, &mut c, "h", 0.01);
    assert!(info_u64(&mut c, "h", "filter_capacity") >= 6000);
    assert!(info_f64(&mut c, "h", "filter_fpr_est") <= 0.01);
    assert_eq!(info_u64(&mut c, "h", "last_rebuild_rows"), 3000);
    all_members(&mut c, "h", &items("h", 3000));
    assert!(info_field(&mut c, "auto_grow_rebuilds").is_ok_and(|n| n != "0"));
    assert!(
        env.vk.log().contains("outgrew its filter"),
        "no log line for the auto-grow"
    );
    // The catalog keeps the set's own CAPACITY: the growth is this node's filter only.
    assert_eq!(set_info(&mut c, "h", "capacity").as_deref(), Ok("1000"));
}

#[test]
fn with_auto_grow_off_the_filter_stays_as_it_was_sized() {
    let env = Env::with(&[SYNC_FAST, ("member.auto-grow", "no")]);
    let mut c = env.conn();
    ok(
        &mut c,
        &["MEMBER.CREATE", "f", "CAPACITY", "1000", "ERROR", "0.01"],
    );
    let bits = info_u64(&mut c, "f", "filter_bits");
    madd(&mut c, "f", &items("f", 3000));
    assert_eq!(set_info(&mut c, "f", "auto_grow").as_deref(), Ok("0"));
    // A negative window: housekeeping looks at the sets' fill once a second
    // (src/upkeep/grow.rs, CHECK_EVERY), so 2 s holds two of its checks, either of which would
    // have started a grow. A busy machine may run fewer, which can hide a wrong grow but not
    // invent one; the end of the test shows the same check does grow once it is on.
    std::thread::sleep(Duration::from_secs(2));
    assert!(info_f64(&mut c, "f", "filter_fpr_est") > 0.02);
    assert_eq!(
        set_info(&mut c, "f", "auto_grow_rebuilds").as_deref(),
        Ok("0")
    );
    assert_eq!(info_u64(&mut c, "f", "filter_bits"), bits);
    // Turned on, it grows.
    ok(&mut c, &["CONFIG", "SET", "member.auto-grow", "yes"]);
    wait_grown(&env.vk, &mut c, "f", 0.01);
}

#[test]
fn an_alter_during_a_running_rebuild_is_followed_by_a_build_with_the_new_settings() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "b", "CAPACITY", "1000"]);
    let members = items("b", 100);
    madd(&mut c, "b", &members);
    // Hold the table: a rebuild started now waits at its COPY, built for the old settings.
    let mut pg = env.pg();
    let mut tx = pg.transaction().unwrap();
    tx.batch_execute("LOCK TABLE member_b IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    ok(&mut c, &["MEMBER.REBUILD", "b"]);
    assert_eq!(
        set_info(&mut c, "b", "rebuild_state").as_deref(),
        Ok("running")
    );
    let mut a = env.conn();
    let alter =
        std::thread::spawn(move || ok(&mut a, &["MEMBER.ALTER", "b", "CAPACITY", "7000", "SYNC"]));
    // The ALTER has written the new definition; all it may still wait for is a build.
    assert!(
        wait_until(WITHIN, || set_info(&mut c, "b", "capacity").as_deref()
            == Ok("7000")),
        "the ALTER never took effect"
    );
    // A negative window: an ALTER SYNC that did not wait for the build would reply within
    // milliseconds of its definition (nothing else is left to do); 300 ms is ample for that
    // reply to arrive, and on a busy machine a late one is missed, never invented.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!alter.is_finished(), "ALTER SYNC replied before any build");
    tx.commit().unwrap();
    alter.join().unwrap();
    // SYNC answered after the build with the new settings, not the one already running.
    assert_eq!(built_for(&mut c, "b"), Some((7000, 0.01)));
    assert_eq!(
        set_info(&mut c, "b", "last_rebuild_reason").as_deref(),
        Ok("alter")
    );
    all_members(&mut c, "b", &members);
}

#[test]
fn a_node_that_was_down_during_an_alter_rebuilds_its_filter_from_disk() {
    let env = Env::with(&[SYNC_FAST]);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "z", "CAPACITY", "1000"]);
    let members = items("z", 100);
    madd(&mut c, "z", &members);
    let mut other = start_with(&env.db.url(), &[SYNC_FAST]);
    let mut o = other.conn();
    wait_built_for(&other, &mut o, "z", 1000, 0.01);
    other.shutdown(&["SAVE"]);
    ok(&mut c, &["MEMBER.ALTER", "z", "CAPACITY", "9000", "SYNC"]);
    // Back from its RDB with the filter built for CAPACITY 1000: the definition it learns
    // from the catalog is the altered one, and its filter follows.
    other.restart();
    let mut o = other.conn();
    wait_built_for(&other, &mut o, "z", 9000, 0.01);
    assert_eq!(
        set_info(&mut o, "z", "last_rebuild_reason").as_deref(),
        Ok("alter")
    );
    all_members(&mut o, "z", &members);
}
