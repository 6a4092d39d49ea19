//! The funnel end to end: each EXPLAIN path, cache-aside behaviour, concurrency, expiry,
//! scopes, normalization, MULTI/Lua, and a filter built from rows already in PostgreSQL.
mod support;

use std::thread;
use std::time::Duration;

use redis::Connection;
use support::member::*;
use support::wait_until;

fn hit_key(set: &str, item: &str, scope: &str) -> Vec<u8> {
    let mut k = format!("member:{set}:hit:{item}").into_bytes();
    k.push(0);
    k.extend_from_slice(scope.as_bytes());
    k
}

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
        .arg(hit_key("s", "alice", ""))
        .query(&mut c)
        .unwrap();
    assert!(ttl > 0 && ttl <= 300_000, "cache TTL {ttl}");
}

/// A set with a deliberately tiny, lossy filter (false positives are easy to find), 20
/// members, and one of its false positives: an absent item the filter lets through.
fn lossy_set_and_false_positive(c: &mut Connection, set: &str) -> String {
    ok(
        c,
        &[
            "MEMBER.CREATE",
            set,
            "ERROR",
            "0.5",
            "CAPACITY",
            "1",
            "RECENT-TTL",
            "1",
        ],
    );
    for i in 0..20 {
        int(c, &["MEMBER.ADD", set, &format!("member-{i}")]);
    }
    let fp = (0..1000)
        .map(|i| format!("absent-{i}"))
        .find(|item| {
            let (answer, path) = explain(c, set, item);
            assert_eq!(answer, 0, "{item}: {path}");
            path != "bloom-negative"
        })
        .expect("no false positive in 1000 probes of a 50% filter");
    fp
}

/// Writes `item` into the set's table directly, as another service would.
fn insert_outside(env: &Env, set: &str, item: &str) {
    env.pg()
        .execute(
            &format!("INSERT INTO member_{set} (entity_id) VALUES ($1)"),
            &[&item],
        )
        .unwrap();
}

fn info_num(c: &mut Connection, set: &str, field: &str) -> u64 {
    set_info(c, set, field)
        .unwrap_or_else(|| panic!("no {field} in MEMBER.INFO"))
        .parse()
        .unwrap()
}

/// A false positive of a trusted filter that the database resolves counts in
/// false_positive_rate_est (the misses of a missing filter do not: below).
#[test]
fn a_false_positive_resolved_by_the_database_counts_in_the_estimate() {
    let env = Env::new();
    let mut c = env.conn();
    lossy_set_and_false_positive(&mut c, "fq");
    assert!(wait_until(Duration::from_secs(10), || {
        set_info(&mut c, "fq", "filter_serves_absent").as_deref() == Some("1")
    }));
    let reached_db = (0..1000).any(|i| {
        int(&mut c, &["MEMBER.EXISTS", "fq", &format!("other-{i}")]);
        info_num(&mut c, "fq", "path_db_miss") > 0
    });
    assert!(
        reached_db,
        "no false positive in 1000 lookups of a 50% filter"
    );
    let rate: f64 = set_info(&mut c, "fq", "false_positive_rate_est")
        .unwrap()
        .parse()
        .unwrap();
    assert!(rate > 0.0, "false_positive_rate_est {rate}");
}

#[test]
fn filter_false_positive_is_resolved_by_the_database_then_remembered() {
    let env = Env::new();
    let mut c = env.conn();
    let fp = lossy_set_and_false_positive(&mut c, "fp");
    // The probe that found it went to the database (db-miss); from then on the database's
    // answer is remembered against this filter.
    assert_eq!(
        info_num(&mut c, "fp", "path_db_miss"),
        0,
        "EXPLAIN is not counted"
    );
    assert_eq!(info_num(&mut c, "fp", "fp_cache_entries"), 1);
    assert_eq!(explain(&mut c, "fp", &fp), (0, "fp-cache".into()));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "fp", &fp]), 0);
    assert_eq!(info_num(&mut c, "fp", "path_fp_cache"), 1);
    // A miss never creates an exact-match key.
    let exists: i64 = redis::cmd("EXISTS")
        .arg(hit_key("fp", &fp, ""))
        .query(&mut c)
        .unwrap();
    assert_eq!(exists, 0);
    // A remembered false positive is still a false positive in the estimate.
    let rate: f64 = set_info(&mut c, "fp", "false_positive_rate_est")
        .unwrap()
        .parse()
        .unwrap();
    assert!(rate > 0.0, "false_positive_rate_est {rate}");
    // The members themselves are unaffected.
    for i in 0..20 {
        assert_eq!(
            int(&mut c, &["MEMBER.EXISTS", "fp", &format!("member-{i}")]),
            1
        );
    }
}

#[test]
fn a_remembered_false_positive_is_forgotten_when_added() {
    let env = Env::new();
    let mut c = env.conn();
    let fp = lossy_set_and_false_positive(&mut c, "fp");
    assert_eq!(explain(&mut c, "fp", &fp), (0, "fp-cache".into()));
    assert_eq!(int(&mut c, &["MEMBER.ADD", "fp", &fp]), 1);
    assert_eq!(info_num(&mut c, "fp", "fp_cache_entries"), 0);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "fp", &fp]), 1);
    // Deleted again: the database decides. While the ADD is recent (RECENT-TTL 1 s) it
    // keeps deciding; after that the absence is remembered again.
    assert_eq!(int(&mut c, &["MEMBER.DEL", "fp", &fp]), 1);
    assert_eq!(explain(&mut c, "fp", &fp), (0, "db-miss".into()));
    assert_eq!(explain(&mut c, "fp", &fp), (0, "db-miss".into()));
    thread::sleep(Duration::from_millis(1200));
    assert_eq!(explain(&mut c, "fp", &fp), (0, "fp-cache".into()));
    // An ADD that finds it already a member (0) forgets it too: another writer put it back.
    insert_outside(&env, "fp", &fp);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "fp", &fp]), 0);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "fp", &fp]), 1);
}

#[test]
fn an_outside_write_of_a_remembered_false_positive_reaches_exists() {
    let env = Env::with(&[("member.sync-interval-ms", "200")]);
    let mut c = env.conn();
    let fp = lossy_set_and_false_positive(&mut c, "fp");
    assert_eq!(explain(&mut c, "fp", &fp), (0, "fp-cache".into()));
    insert_outside(&env, "fp", &fp);
    // Within the sync loop's bound, as for any outside write.
    assert!(
        wait_until(Duration::from_secs(10), || int(
            &mut c,
            &["MEMBER.EXISTS", "fp", &fp]
        ) == 1),
        "an outside insert of a remembered false positive never reached EXISTS: {:?}",
        explain(&mut c, "fp", &fp)
    );
    assert_eq!(info_num(&mut c, "fp", "fp_cache_entries"), 0);
}

#[test]
fn a_rebuild_forgets_remembered_false_positives() {
    let env = Env::new();
    let mut c = env.conn();
    let fp = lossy_set_and_false_positive(&mut c, "fp");
    assert_eq!(explain(&mut c, "fp", &fp), (0, "fp-cache".into()));
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "fp", "SYNC"]), 20);
    assert_eq!(info_num(&mut c, "fp", "fp_cache_entries"), 0);
    // The rebuilt filter is sized for its 20 rows and may no longer let it through at all.
    let path = explain(&mut c, "fp", &fp).1;
    assert!(path == "db-miss" || path == "bloom-negative", "{path}");
}

#[test]
fn fp_cache_size_zero_turns_the_tier_off() {
    let env = Env::with(&[("member.fp-cache-size", "0")]);
    let mut c = env.conn();
    let fp = lossy_set_and_false_positive(&mut c, "fp");
    for _ in 0..3 {
        assert_eq!(explain(&mut c, "fp", &fp), (0, "db-miss".into()));
    }
    assert_eq!(info_num(&mut c, "fp", "fp_cache_entries"), 0);
    // Turned off while it holds entries: they stop answering at once and are freed.
    ok(&mut c, &["CONFIG", "SET", "member.fp-cache-size", "10"]);
    assert_eq!(explain(&mut c, "fp", &fp), (0, "db-miss".into()));
    assert_eq!(explain(&mut c, "fp", &fp), (0, "fp-cache".into()));
    ok(&mut c, &["CONFIG", "SET", "member.fp-cache-size", "0"]);
    assert_eq!(explain(&mut c, "fp", &fp), (0, "db-miss".into()));
    assert_eq!(info_num(&mut c, "fp", "fp_cache_entries"), 0);
    // Out of range is refused and changes nothing; turning it on works at once.
    for bad in ["-1", "100000001", "many"] {
        let e = err(&mut c, &["CONFIG", "SET", "member.fp-cache-size", bad]);
        assert!(e.starts_with("ERR"), "{bad}: {e}");
    }
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.fp-cache-size")
        .query(&mut c)
        .unwrap();
    assert_eq!(v[1], "0");
    ok(&mut c, &["CONFIG", "SET", "member.fp-cache-size", "10"]);
    assert_eq!(explain(&mut c, "fp", &fp), (0, "db-miss".into()));
    assert_eq!(explain(&mut c, "fp", &fp), (0, "fp-cache".into()));
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
        .arg(hit_key("tmp", "short", ""))
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
        Some("1")
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
        set_info(&mut c, "s", "filter_complete").as_deref() == Some("1")
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
        set_info(&mut c, "s", "filter_serves_absent").as_deref() == Some("1")
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
        assert_eq!(
            set_info(&mut c, "s", field).as_deref(),
            Some(want),
            "{field}"
        );
    }
    locker.batch_execute("COMMIT").unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        set_info(&mut c, "s", "filter_serves_absent").as_deref() == Some("1")
    }));
}

/// Lookups past a missing filter all go to the database; their misses are not the filter's
/// false positives, so false_positive_rate_est does not count them (it read 1.0 after every
/// FLUSHALL, restart or promotion, a false alarm).
#[test]
fn misses_past_a_missing_filter_are_not_false_positives() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s", "CAPACITY", "1000000"]);
    int(&mut c, &["MEMBER.ADD", "s", "m"]);
    // The filter cannot come back: its rebuild is refused under the new ceiling.
    ok(&mut c, &["CONFIG", "SET", "member.max-filter-bytes", "1mb"]);
    redis::cmd("FLUSHALL").query::<()>(&mut c).unwrap();
    for i in 0..10 {
        assert_eq!(
            int(&mut c, &["MEMBER.EXISTS", "s", &format!("absent{i}")]),
            0
        );
    }
    assert_eq!(
        set_info(&mut c, "s", "filter_present").as_deref(),
        Some("0")
    );
    assert_eq!(set_info(&mut c, "s", "path_db_miss").as_deref(), Some("10"));
    let field = "false_positive_rate_est";
    assert_eq!(set_info(&mut c, "s", field).as_deref(), Some("0.000000"));
    assert_eq!(info_field(&mut c, field).as_deref(), Some("0.000000"));
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
        assert!(info_field(&mut c, f).is_some(), "INFO member lacks {f}");
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
            .unwrap_or_else(|| panic!("INFO member lacks {f}"))
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
