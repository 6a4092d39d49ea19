//! A filter value is trusted only where it was made: a DUMP of a set's filter from a node of
//! another database (of the same PostgreSQL cluster, so of the same transaction-id counter),
//! RESTOREd over the same set's filter key, never answers "absent" there; it is replaced by a
//! rebuild from this node's own database.
mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use support::member::*;
use support::wait_until;

/// Longer than RECENT-TTL 1 s: from then on no recent-writes mark covers an earlier ADD.
const PAST_RECENT: Duration = Duration::from_millis(1200);

/// How long a sync pass or the rebuild of a tiny set may take on a busy machine.
const SETTLE: Duration = Duration::from_secs(30);

/// Long enough for several sync passes to have adopted the restored value (they start at
/// once, at most one a second, for a value no set trusts), had it been trusted.
const WATCH: Duration = Duration::from_secs(4);

fn wait_info(env: &Env, set: &str, field: &str, ok: impl Fn(&str) -> bool) {
    let mut c = env.conn();
    let mut last = None;
    let reached = wait_until(SETTLE, || {
        last = set_info(&mut c, set, field);
        last.as_deref().is_some_and(&ok)
    });
    assert!(
        reached,
        "MEMBER.INFO {set}: {field} stuck at {last:?}\n{}",
        env.vk.log()
    );
}

/// MEMBER.INFO as field/value pairs.
fn info_pairs(v: &Value) -> Vec<(String, String)> {
    let v: Vec<String> = redis::from_redis_value(v).expect("MEMBER.INFO reply");
    v.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect()
}

fn field<'a>(pairs: &'a [(String, String)], name: &str) -> &'a str {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

fn members() -> Vec<String> {
    (0..50).map(|i| format!("member_{i}")).collect()
}

/// Every acknowledged member answers 1, and MEMBER.INFO never shows the restored value as
/// trusted while it is there.
fn check_all(env: &Env, c: &mut Connection) {
    let mut p = redis::pipe();
    for m in members() {
        p.cmd("MEMBER.EXPLAIN").arg("s").arg(m);
    }
    p.cmd("MEMBER.INFO").arg("s");
    let replies: Vec<Value> = p.query(c).expect("lookups");
    let (info, answers) = replies.split_last().unwrap();
    let info = info_pairs(info);
    for (m, a) in members().iter().zip(answers) {
        let (answer, path): (i64, String) = redis::from_redis_value(a).unwrap();
        assert_eq!(
            answer,
            1,
            "{m}, acknowledged on this node, answered 0 ({path}) from another database's \
             filter\nMEMBER.INFO: {info:?}\n{}",
            env.vk.log()
        );
    }
    if field(&info, "filter_origin") != "here" {
        assert_eq!(field(&info, "filter_caught_up"), "0", "{info:?}");
        assert_eq!(field(&info, "filter_serves_absent"), "0", "{info:?}");
    }
}

#[test]
fn a_filter_dumped_from_another_database_is_never_trusted() {
    // Two nodes, two databases of the one test cluster, the same set name in each.
    let a = Env::new();
    let b = Env::new();
    let (mut ca, mut cb) = (a.conn(), b.conn());
    ok(
        &mut ca,
        &["MEMBER.CREATE", "s", "RECENT-TTL", "1", "CACHE-TTL", "1"],
    );
    wait_info(&a, "s", "filter_caught_up", |v| v == "1");
    wait_info(&a, "s", "filter_origin", |v| v == "here");
    for m in members() {
        assert_eq!(int(&mut ca, &["MEMBER.ADD", "s", &m]), 1);
    }
    // B's filter is built after A's members committed: its watermark, a transaction id of
    // the counter both databases share, lies past every one of them.
    ok(&mut cb, &["MEMBER.CREATE", "s", "RECENT-TTL", "1"]);
    assert_eq!(int(&mut cb, &["MEMBER.ADD", "s", "only_in_b"]), 1);
    wait_info(&b, "s", "filter_caught_up", |v| v == "1");
    let dump: Vec<u8> = redis::cmd("DUMP")
        .arg("member:s:bloom")
        .query(&mut cb)
        .unwrap();
    let rebuilds = |c: &mut Connection| info_number(c, "member", "member_rebuilds_done");
    let rebuilds_before = rebuilds(&mut ca);
    thread::sleep(PAST_RECENT);

    // The RESTORE and the first look travel in one write: no timer of the module runs between.
    let mut p = redis::pipe();
    p.cmd("RESTORE")
        .arg("member:s:bloom")
        .arg(0)
        .arg(&dump)
        .arg("REPLACE");
    p.cmd("MEMBER.INFO").arg("s");
    let replies: Vec<Value> = p.query(&mut ca).expect("RESTORE");
    let info = info_pairs(&replies[1]);
    assert_eq!(field(&info, "filter_origin"), "foreign", "{info:?}");
    assert_eq!(field(&info, "filter_caught_up"), "0", "{info:?}");
    assert_eq!(field(&info, "filter_serves_absent"), "0", "{info:?}");

    // Held back for as long as it is there, then replaced by a rebuild of A's own rows.
    let until = Instant::now() + WATCH;
    while Instant::now() < until {
        check_all(&a, &mut ca);
        thread::sleep(Duration::from_millis(200));
    }
    wait_info(&a, "s", "filter_origin", |v| v == "here");
    wait_info(&a, "s", "filter_caught_up", |v| v == "1");
    assert!(
        wait_until(SETTLE, || rebuilds(&mut ca) > rebuilds_before),
        "the foreign filter was not replaced by a rebuild\n{}",
        a.vk.log()
    );
    check_all(&a, &mut ca);
    // The rebuilt filter serves: absent items end in memory again.
    assert!(
        wait_until(SETTLE, || bloom_negative_now(&mut ca, "s", "never_added")),
        "{:?}",
        cmd(&mut ca, &["MEMBER.INFO", "s"])
    );
    // B's own filter is untouched by all this.
    assert_eq!(int(&mut cb, &["MEMBER.EXISTS", "s", "only_in_b"]), 1);
}
