//! The funnel end to end: each EXPLAIN path, cache-aside behaviour, concurrency, expiry,
//! scopes, normalization, MULTI/Lua, and a filter built from rows already in PostgreSQL.
//! False positives (resolved, remembered, counted): `tests/all/false_positives.rs`.
use crate::support;

use std::thread;
use std::time::Duration;

use support::member::*;
use support::wait_until;

#[test]
fn explain_names_every_deciding_tier() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    int(&mut c, &["MEMBER.ADD", "s", "alice"]);
    assert_eq!(explain(&mut c, "s", "bob"), (0, "bloom-negative".into()));
    // First lookup of a member goes to the database and fills the cache...
    assert_eq!(explain(&mut c, "s", "alice"), (1, "db-hit".into()));
    // ...so the second is answered by the exact-match key.
    assert_eq!(explain(&mut c, "s", "alice"), (1, "cache-hit".into()));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(cache_key("s", "alice", ""))
        .query(&mut c)
        .unwrap();
    assert!(ttl > 0 && ttl <= 300_000, "cache TTL {ttl}");
}

#[test]
fn del_drops_the_cache_entry_and_the_membership() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    int(&mut c, &["MEMBER.ADD", "s", "x"]);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "x"]), 1);
    assert_eq!(explain(&mut c, "s", "x").1, "cache-hit");
    assert_eq!(int(&mut c, &["MEMBER.DEL", "s", "x"]), 1);
    // The filter still holds the bits; the database now says no.
    assert_eq!(explain(&mut c, "s", "x"), (0, "db-miss".into()));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "x"]), 0);
    // And it can come back.
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "x"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "x"]), 1);
}

#[test]
fn concurrent_adds_of_one_item_exactly_one_wins() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "race"]);
    for round in 0..3 {
        let item = format!("item-{round}");
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(50));
        let handles: Vec<_> = (0..50)
            .map(|_| {
                let mut conn = env.conn();
                let item = item.clone();
                let barrier = barrier.clone();
                thread::spawn(move || {
                    barrier.wait();
                    int(&mut conn, &["MEMBER.ADD", "race", &item])
                })
            })
            .collect();
        let results: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(
            results.iter().filter(|&&r| r == 1).count(),
            1,
            "{results:?}"
        );
        assert_eq!(results.iter().filter(|&&r| r == 0).count(), 49);
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "race", &item]), 1);
    }
    let n: i64 = env
        .pg()
        .query_one("SELECT count(*) FROM member_race", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 3);
}

#[test]
fn memberships_expire_and_the_cache_never_outlives_them() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "tmp", "CACHE-TTL", "300"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "tmp", "short", "TTL", "2"]), 1);
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    assert_eq!(
        int(
            &mut c,
            &["MEMBER.ADD", "tmp", "long", "EXPIREAT", &at.to_string()]
        ),
        1
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "tmp", "short"]), 1);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(cache_key("tmp", "short", ""))
        .query(&mut c)
        .unwrap();
    assert!(
        ttl > 0 && ttl <= 2000,
        "cache entry outlives expiry: {ttl} ms"
    );
    assert!(wait_until(Duration::from_secs(5), || {
        int(&mut c, &["MEMBER.EXISTS", "tmp", "short"]) == 0
    }));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "tmp", "long"]), 1);
    // An expired membership can be added again.
    assert_eq!(int(&mut c, &["MEMBER.ADD", "tmp", "short"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "tmp", "short"]), 1);
    let expires: Option<f64> = env
        .pg()
        .query_one(
            "SELECT EXTRACT(EPOCH FROM expires_at)::float8 FROM member_tmp WHERE entity_id = 'long'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(expires, Some(at as f64));
}

#[test]
fn scopes_are_separate_memberships() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "blocked"]);
    let card = "card-9f2b7c4a1d8e";
    assert_eq!(
        int(
            &mut c,
            &["MEMBER.ADD", "blocked", card, "SCOPE", "merchant:MID_A"]
        ),
        1
    );
    assert_eq!(
        int(
            &mut c,
            &["MEMBER.EXISTS", "blocked", card, "SCOPE", "merchant:MID_A"]
        ),
        1
    );
    assert_eq!(
        int(
            &mut c,
            &["MEMBER.EXISTS", "blocked", card, "SCOPE", "merchant:MID_B"]
        ),
        0
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "blocked", card]), 0);
    assert_eq!(
        int(
            &mut c,
            &["MEMBER.DEL", "blocked", card, "SCOPE", "merchant:MID_B"]
        ),
        0
    );
    let rows: Vec<(String, String)> = env
        .pg()
        .query("SELECT entity_id, scope FROM member_blocked", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, vec![(card.to_string(), "merchant:MID_A".to_string())]);
}

#[test]
fn username_normalization_makes_one_name() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "users", "NORMALIZE", "username"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "users", "Alice "]), 1);
    for v in ["alice", "ALICE", " alice", "ａｌｉｃｅ"] {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "users", v]), 0, "{v:?}");
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "users", v]), 1, "{v:?}");
    }
    let stored: String = env
        .pg()
        .query_one("SELECT entity_id FROM member_users", &[])
        .unwrap()
        .get(0);
    assert_eq!(stored, "alice");
    ok(&mut c, &["MEMBER.CREATE", "raw"]);
    int(&mut c, &["MEMBER.ADD", "raw", "Alice "]);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "raw", "alice"]), 0);
    ok(&mut c, &["MEMBER.CREATE", "low", "NORMALIZE", "lower"]);
    int(&mut c, &["MEMBER.ADD", "low", " Bob"]);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "low", "BOB"]), 1);
}

#[test]
fn create_loads_rows_already_in_the_table() {
    let env = Env::new();
    let mut pg = env.pg();
    pg.batch_execute(
        "CREATE TABLE member_legacy (
            entity_id text NOT NULL, scope text NOT NULL DEFAULT '',
            status smallint NOT NULL DEFAULT 1,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz, PRIMARY KEY (entity_id, scope));
         INSERT INTO member_legacy (entity_id) SELECT 'user-' || g FROM generate_series(1, 5000) g;
         INSERT INTO member_legacy (entity_id, status) VALUES ('inactive', 0);",
    )
    .unwrap();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "legacy"]);
    assert_eq!(
        set_info(&mut c, "legacy", "filter_complete").as_deref(),
        Ok("1")
    );
    for i in [1, 777, 5000] {
        let (answer, path) = explain(&mut c, "legacy", &format!("user-{i}"));
        assert_eq!(answer, 1);
        assert_ne!(path, "bloom-negative");
    }
    assert_eq!(explain(&mut c, "legacy", "inactive").0, 0);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "legacy", "user-1"]), 0);
}

#[test]
fn transactions_and_scripts_answer_without_blocking() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    int(&mut c, &["MEMBER.ADD", "s", "cached"]);
    int(&mut c, &["MEMBER.ADD", "s", "uncached"]);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "cached"]), 1);
    // The I/O-free tiers answer inside MULTI/EXEC...
    let (neg, hit): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("MEMBER.EXISTS")
        .arg("s")
        .arg("nobody")
        .cmd("MEMBER.EXISTS")
        .arg("s")
        .arg("cached")
        .query(&mut c)
        .unwrap();
    assert_eq!((neg, hit), (0, 1));
    // ...and whatever needs the database is refused with a clear error, not a 0.
    for args in [
        ["MEMBER.EXISTS", "s", "uncached"],
        ["MEMBER.ADD", "s", "new"],
    ] {
        let e = redis::pipe()
            .atomic()
            .cmd(args[0])
            .arg(args[1])
            .arg(args[2])
            .query::<(i64,)>(&mut c)
            .unwrap_err();
        assert!(e.to_string().contains("cannot block"), "{args:?}: {e}");
    }
    let lua = "return redis.call('MEMBER.EXISTS', 's', ARGV[1])";
    let r: i64 = redis::cmd("EVAL")
        .arg(lua)
        .arg(0)
        .arg("nobody")
        .query(&mut c)
        .unwrap();
    assert_eq!(r, 0);
    let e = err(&mut c, &["EVAL", lua, "0", "uncached"]);
    assert!(e.contains("cannot block"), "{e}");
    // Nothing was written by the refused ADD.
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "new"]), 0);
}

#[test]
fn keys_live_in_db0_whatever_the_client_selected() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    redis::cmd("SELECT").arg(3).query::<()>(&mut c).unwrap();
    int(&mut c, &["MEMBER.ADD", "s", "x"]);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "x"]), 1);
    assert_eq!(explain(&mut c, "s", "x").1, "cache-hit");
    let here: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(here, 0);
    redis::cmd("SELECT").arg(0).query::<()>(&mut c).unwrap();
    let db0: i64 = redis::cmd("EXISTS")
        .arg("member:s:bloom")
        .query(&mut c)
        .unwrap();
    assert_eq!(db0, 1);
}

#[test]
fn a_lost_filter_falls_through_and_rebuilds_itself() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    for i in 0..100 {
        int(&mut c, &["MEMBER.ADD", "s", &format!("m{i}")]);
    }
    redis::cmd("FLUSHALL").query::<()>(&mut c).unwrap();
    // No filter: never "absent" for a member, whatever the timing of the rebuild.
    for i in 0..100 {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", &format!("m{i}")]), 1);
    }
    assert!(wait_until(Duration::from_secs(10), || {
        set_info(&mut c, "s", "filter_complete").as_deref() == Ok("1")
    }));
    assert_eq!(explain(&mut c, "s", "nobody"), (0, "bloom-negative".into()));
    assert_ne!(explain(&mut c, "s", "m5").1, "bloom-negative");
}

/// With no filter at all (flushed, its rebuild held up by a lock on the table), MEMBER.INFO
/// still carries the fields operators alert on, saying the set serves no "absent".
#[test]
fn info_without_a_filter_says_it_serves_no_absent() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    int(&mut c, &["MEMBER.ADD", "s", "m"]);
    assert!(wait_until(Duration::from_secs(10), || {
        set_info(&mut c, "s", "filter_serves_absent").as_deref() == Ok("1")
    }));
    let mut locker = env.pg();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_s IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    redis::cmd("FLUSHALL").query::<()>(&mut c).unwrap();
    for (field, want) in [
        ("filter_present", "0"),
        ("filter_complete", "0"),
        ("filter_caught_up", "0"),
        ("filter_serves_absent", "0"),
    ] {
        assert_eq!(set_info(&mut c, "s", field).as_deref(), Ok(want), "{field}");
    }
    locker.batch_execute("COMMIT").unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        set_info(&mut c, "s", "filter_serves_absent").as_deref() == Ok("1")
    }));
}

#[test]
fn info_reports_paths_and_rates() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    int(&mut c, &["MEMBER.ADD", "s", "a"]);
    for _ in 0..3 {
        int(&mut c, &["MEMBER.EXISTS", "s", "a"]);
    }
    for i in 0..6 {
        int(&mut c, &["MEMBER.EXISTS", "s", &format!("absent{i}")]);
    }
    let get = |c: &mut redis::Connection, f: &str| set_info(c, "s", f).unwrap();
    assert_eq!(get(&mut c, "exists_calls"), "9");
    assert_eq!(get(&mut c, "path_db_hit"), "1");
    assert_eq!(get(&mut c, "path_cache_hit"), "2");
    let neg: u64 = get(&mut c, "path_bloom_negative").parse().unwrap();
    let miss: u64 = get(&mut c, "path_db_miss").parse().unwrap();
    assert_eq!(neg + miss, 6);
    assert_eq!(get(&mut c, "adds"), "1");
    assert_eq!(get(&mut c, "filter_items"), "1");
    assert!(
        info_field(&mut c, "exists_calls")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 9
    );
    for f in [
        "bloom_exists_true_rate",
        "db_fallback_rate",
        "false_positive_rate_est",
    ] {
        assert!(info_field(&mut c, f).is_ok(), "INFO member lacks {f}");
    }
    // The latency percentiles of EXISTS answered from memory, in order.
    let p: Vec<u64> = [
        "exists_p50_us",
        "exists_p95_us",
        "exists_p99_us",
        "exists_p999_us",
    ]
    .iter()
    .map(|f| {
        info_field(&mut c, f)
            .unwrap_or_else(|e| panic!("{e}"))
            .parse()
            .unwrap()
    })
    .collect();
    assert!(
        p.windows(2).all(|w| w[0] <= w[1]),
        "percentiles out of order: {p:?}"
    );
}

#[test]
fn batched_database_work_answers_each_caller_correctly() {
    // One worker, so concurrent lookups and ADDs pile up and are resolved in shared statements.
    let env = Env::with(&[("member.workers", "1"), ("member.batch-size", "64")]);
    let mut c = env.conn();
    ok(
        &mut c,
        &["MEMBER.CREATE", "b", "ERROR", "0.5", "CAPACITY", "1"],
    );
    // A lossy filter: most absent items pass it and need the database too.
    let handles: Vec<_> = (0..32)
        .map(|t| {
            let mut conn = env.conn();
            thread::spawn(move || {
                let mut wins = Vec::new();
                for i in 0..20 {
                    // Every thread adds the shared items and its own ones, with and without scope.
                    let shared = format!("shared-{i}");
                    let own = format!("own-{t}-{i}");
                    wins.push((
                        shared.clone(),
                        int(&mut conn, &["MEMBER.ADD", "b", &shared]),
                    ));
                    assert_eq!(int(&mut conn, &["MEMBER.ADD", "b", &own, "SCOPE", "x"]), 1);
                }
                wins
            })
        })
        .collect();
    let mut won = std::collections::HashMap::new();
    for h in handles {
        for (item, r) in h.join().unwrap() {
            *won.entry(item).or_insert(0) += r;
        }
    }
    assert!(won.values().all(|&n| n == 1), "{won:?}");
    let handles: Vec<_> = (0..32)
        .map(|t| {
            let mut conn = env.conn();
            thread::spawn(move || {
                for i in 0..20 {
                    let own = format!("own-{t}-{i}");
                    assert_eq!(
                        int(&mut conn, &["MEMBER.EXISTS", "b", &own, "SCOPE", "x"]),
                        1
                    );
                    assert_eq!(int(&mut conn, &["MEMBER.EXISTS", "b", &own]), 0);
                    assert_eq!(
                        int(&mut conn, &["MEMBER.EXISTS", "b", &format!("no-{t}-{i}")]),
                        0
                    );
                    assert_eq!(
                        int(&mut conn, &["MEMBER.EXISTS", "b", &format!("shared-{i}")]),
                        1
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // The work really was shared: fewer statements than points.
    let batches: u64 = info_field(&mut c, "db_batches").unwrap().parse().unwrap();
    let points: u64 = info_field(&mut c, "db_batched_points")
        .unwrap()
        .parse()
        .unwrap();
    assert!(points > batches, "{points} points in {batches} statements");
}

#[test]
fn a_build_sizes_the_filter_for_the_rows_found_not_just_capacity() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "grow", "CAPACITY", "100"]);
    // Rows arrive outside the module (a migration), far beyond the declared capacity; the
    // table has never been analyzed, so the planner's estimate is no help either.
    env.pg()
        .batch_execute(
            "INSERT INTO member_grow (entity_id) SELECT 'row-' || g FROM generate_series(1, 20000) g",
        )
        .unwrap();
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "grow", "SYNC"]), 20000);
    let bits: u64 = set_info(&mut c, "grow", "filter_bits")
        .unwrap()
        .parse()
        .unwrap();
    assert!(bits >= 20000 * 9, "filter of {bits} bits for 20000 members");
    let fpr: f64 = set_info(&mut c, "grow", "filter_fpr_est")
        .unwrap()
        .parse()
        .unwrap();
    assert!(fpr < 0.015, "estimated FPR {fpr} after the build");
    assert_eq!(explain(&mut c, "grow", "row-12345").0, 1);
}
