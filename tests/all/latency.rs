//! Slow database resolutions reach the server's LATENCY monitor as event `member-db`, only
//! when the monitor is on (`latency-monitor-threshold` > 0) and the wait exceeded it.
use crate::support;

use std::thread;
use std::time::Duration;

use redis::{Connection, Value};
use support::member::*;
use support::wait_until;

/// Event names `LATENCY LATEST` lists.
fn latest_events(c: &mut Connection) -> Vec<String> {
    let v: Value = redis::cmd("LATENCY").arg("LATEST").query(c).unwrap();
    let Value::Array(rows) = v else {
        panic!("LATENCY LATEST: {v:?}")
    };
    rows.into_iter()
        .filter_map(|r| match r {
            Value::Array(f) => match f.into_iter().next() {
                Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                Some(Value::SimpleString(s)) => Some(s),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// How many times `CONFIG GET` ran on the server (`INFO commandstats`; none yet is 0).
fn config_get_calls(c: &mut Connection) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_config|get:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Sets `latency-monitor-threshold` and waits until the module has read it: it reads the
/// setting with a `CONFIG GET` of its own (once a second, on the main thread), so the first
/// such call counted after the SET has seen the new value. The test itself sends no CONFIG GET.
fn set_threshold(c: &mut Connection, ms: &str) {
    ok(c, &["CONFIG", "SET", "latency-monitor-threshold", ms]);
    let before = config_get_calls(c);
    assert!(
        wait_until(Duration::from_secs(10), || config_get_calls(c) > before),
        "the module never read latency-monitor-threshold {ms}"
    );
}

/// A lookup of `item` that waits about `hold` for PostgreSQL: a test client holds an ACCESS
/// EXCLUSIVE lock on the set's table (even reads wait for it) while the lookup is in flight.
fn slow_lookup(env: &Env, set: &str, item: &str, hold: Duration) -> i64 {
    let mut locker = env.pg();
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE member_{set} IN ACCESS EXCLUSIVE MODE"
        ))
        .unwrap();
    let port = env.vk.port();
    let set_name = set;
    let (set, item) = (set.to_string(), item.to_string());
    let lookup = thread::spawn(move || {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        int(&mut c, &["MEMBER.EXISTS", &set, &item])
    });
    // The hold counts from when the lookup waits for the lock, however late its thread runs.
    let mut watcher = env.pg();
    let table = format!("member_{set_name}");
    let waiting = support::wait_until(Duration::from_secs(20), || {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::text::regclass",
                &[&table],
            )
            .unwrap()
            .get(0);
        n > 0
    });
    assert!(waiting, "the lookup never waited for the table lock");
    thread::sleep(hold);
    locker.batch_execute("COMMIT").unwrap();
    lookup.join().unwrap()
}

#[test]
fn slow_resolutions_feed_the_latency_monitor() {
    // A long database timeout: the held lookups must end in an answer, however late.
    let env = Env::with(&[("member.db-timeout-ms", "10000")]);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "lat"]);
    for item in ["a", "b", "c"] {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "lat", item]), 1);
    }

    // Monitor off (the default threshold 0): nothing is recorded, however slow.
    set_threshold(&mut c, "0");
    assert_eq!(slow_lookup(&env, "lat", "a", Duration::from_millis(300)), 1);
    assert!(
        !latest_events(&mut c).contains(&"member-db".to_string()),
        "recorded with the monitor off: {:?}",
        latest_events(&mut c)
    );

    // On: a 1000 ms wait is over a 400 ms threshold (the margins are wide so that a loaded
    // machine's fast lookup stays under it).
    set_threshold(&mut c, "400");
    // A fast resolution stays under the threshold and is not an event.
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "lat", "b"]), 1);
    assert!(!latest_events(&mut c).contains(&"member-db".to_string()));
    // (Another item: "a" is cached now and would not reach the database.)
    assert_eq!(
        slow_lookup(&env, "lat", "c", Duration::from_millis(1000)),
        1
    );
    assert!(
        latest_events(&mut c).contains(&"member-db".to_string()),
        "LATENCY LATEST: {:?}",
        latest_events(&mut c)
    );
    let history: Vec<(i64, i64)> = redis::cmd("LATENCY")
        .arg("HISTORY")
        .arg("member-db")
        .query(&mut c)
        .unwrap();
    assert!(
        history.iter().any(|(_, ms)| *ms >= 1000),
        "history {history:?}"
    );
}

/// The Lua script for redis_exporter's `--script` option, contrib/prometheus/libmember.lua
/// (the file docs/monitoring.md points at), run by the server itself: INFO member's numeric
/// fields as `member_<field>` and each set's as `member_set:<set>:<field>`, all numbers.
#[test]
fn the_contrib_exporter_script_returns_info_member_fields() {
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/prometheus/libmember.lua"
    ))
    .expect("contrib/prometheus/libmember.lua");
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "exp"]);
    let pairs: Vec<String> = redis::cmd("EVAL")
        .arg(script)
        .arg(0)
        .query(&mut c)
        .expect("EVAL of the contrib script");
    let fields: std::collections::HashMap<&str, &str> = pairs
        .chunks(2)
        .map(|p| (p[0].as_str(), p[1].as_str()))
        .collect();
    assert_eq!(fields.get("member_sets"), Some(&"1"), "{fields:?}");
    assert_eq!(fields.get("member_set:exp:filter_present"), Some(&"1"));
    for name in [
        "member_db_timeouts",
        "member_sync_passes",
        "member_sync_notify_received",
        "member_exists_p99_us",
        "member_set:exp:filter_fill",
    ] {
        assert!(fields.contains_key(name), "{name} missing: {fields:?}");
    }
    for (name, value) in &fields {
        assert!(
            value.parse::<f64>().is_ok(),
            "{name} is not a number: {value}"
        );
    }
}
