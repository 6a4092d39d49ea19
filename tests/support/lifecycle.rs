//! Helpers of the filter-lifecycle tests (`tests/all/lifecycle.rs`, `tests/all/lifecycle_rebuild.rs`):
//! servers with a fast or a silent sync loop, sets with RECENT-TTL 1, and assertions that an
//! item is a member, in the filter itself, or rejected, with the server log on failure.

use std::time::Duration;

use redis::{Connection, Value};

use super::member::*;
use super::{wait_until, Valkey};

/// Sync loop interval for most servers here: outside writes and catch-up within ~200 ms.
pub const SYNC_FAST: (&str, &str) = ("member.sync-interval-ms", "200");

/// Sync loop interval of one hour: after its first pass the loop stays quiet for the whole
/// test, so it cannot repair a filter that the path under test (rebuild journal, replicated
/// MEMBER._ADD) failed to update. A promotion still triggers a pass at once.
pub const SYNC_OFF: (&str, &str) = ("member.sync-interval-ms", "3600000");

/// Longer than RECENT-TTL 1 s: from then on no recent-writes mark covers an earlier ADD.
pub const PAST_RECENT: Duration = Duration::from_millis(1200);

/// How long the module may take to catch up or rebuild by itself in these small tests.
pub const SETTLE: Duration = Duration::from_secs(10);

/// How long a rebuild of ~310k rows may take (a debug build on a busy machine).
pub const REBUILD_TIMEOUT: Duration = Duration::from_secs(180);

/// A fresh database and a Valkey with `extra` configs, and the fast sync loop unless `extra`
/// sets the interval.
pub fn env(extra: &[(&str, &str)]) -> Env {
    let mut cfg = extra.to_vec();
    if !extra.iter().any(|(k, _)| *k == SYNC_FAST.0) {
        cfg.push(SYNC_FAST);
    }
    Env::with(&cfg)
}

/// Last 60 lines of the server log, for assertion messages.
pub fn log_tail(vk: &Valkey) -> String {
    let log = vk.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// `MEMBER.CREATE <set> RECENT-TTL 1 <opts>`.
pub fn create(c: &mut Connection, set: &str, opts: &[&str]) {
    let mut args = vec!["MEMBER.CREATE", set, "RECENT-TTL", "1"];
    args.extend_from_slice(opts);
    ok(c, &args);
}

pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// ADDs every item, pipelined; each must be new (1).
pub fn add_all(vk: &Valkey, c: &mut Connection, set: &str, items: &[String]) {
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
pub fn assert_members(vk: &Valkey, c: &mut Connection, set: &str, items: &[String], when: &str) {
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
pub fn explain_all(c: &mut Connection, set: &str, items: &[String]) -> Vec<(i64, String)> {
    let mut p = redis::pipe();
    for it in items {
        p.cmd("MEMBER.EXPLAIN").arg(set).arg(it);
    }
    p.query(c)
        .unwrap_or_else(|e| panic!("EXPLAIN on {set}: {e}"))
}

/// Every item answers 1 and none is rejected by the filter (call it past RECENT-TTL, so the
/// filter and not a recent-writes mark is what lets them through).
pub fn assert_in_filter(vk: &Valkey, c: &mut Connection, set: &str, items: &[String], when: &str) {
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
pub fn assert_rejected(vk: &Valkey, c: &mut Connection, set: &str, item: &str, when: &str) {
    let got = explain(c, set, item);
    assert_eq!(
        got,
        (0, "bloom-negative".to_string()),
        "{when}: EXPLAIN {set} {item} (never added)\nMEMBER.INFO: {:?}\nvalkey log:\n{}",
        info_all(c, set),
        log_tail(vk)
    );
}

/// The whole MEMBER.NODEINFO reply (the node's MEMBER.INFO) as a flat field/value list (empty
/// on error).
pub fn info_all(c: &mut Connection, set: &str) -> Vec<String> {
    redis::cmd("MEMBER.NODEINFO")
        .arg(set)
        .query(c)
        .unwrap_or_default()
}

/// One field of an [`info_all`] reply.
pub fn field(info: &[String], name: &str) -> Option<String> {
    info.chunks(2)
        .find(|p| p[0] == name)
        .and_then(|p| p.get(1).cloned())
}

/// Waits until MEMBER.INFO `<set>` shows `field` = `want`.
pub fn wait_info(vk: &Valkey, c: &mut Connection, set: &str, field: &str, want: &str, t: Duration) {
    let mut last = set_info(c, set, field);
    let reached = wait_until(t, || {
        last = set_info(c, set, field);
        last.as_deref() == Ok(want)
    });
    assert!(
        reached,
        "MEMBER.INFO {set}: {field} never became {want} within {t:?} (last {last:?})\nMEMBER.INFO: {:?}\nvalkey log:\n{}",
        info_all(c, set),
        log_tail(vk)
    );
}

/// After a restart: the set catalog is read again before any set is known.
pub fn reconnect_loaded(vk: &Valkey) -> Connection {
    let mut c = vk.conn();
    assert!(
        wait_catalog_loaded(&mut c, Duration::from_secs(20)),
        "catalog never loaded after restart\n{}",
        log_tail(vk)
    );
    c
}

/// One reply of a command that may fail (e.g. on a replica before the set reached it).
pub fn reply(c: &mut Connection, args: &[&str]) -> Option<i64> {
    match cmd(c, args) {
        Ok(Value::Int(n)) => Some(n),
        _ => None,
    }
}

/// The exact-match cache key of an unscoped item.
pub fn hit_key(set: &str, item: &str) -> Vec<u8> {
    cache_key(set, item, "")
}

/// Sends `cmds` in one write on a raw connection (so the server runs them back to back) and
/// returns the simple-string / error / integer reply lines.
pub fn raw_pipeline(vk: &Valkey, cmds: &[&[&str]]) -> Vec<String> {
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
pub fn start_quiet_replica(env: &Env) -> (Valkey, Connection) {
    let primary = format!("127.0.0.1 {}", env.vk.port());
    let replica = start_loaded(&env.db.url(), &[SYNC_OFF, ("replicaof", primary.as_str())]);
    let mut r = replica.conn();
    wait_linked(&replica, &mut r, Duration::from_secs(20));
    wait_serves_absent(&replica, &mut r);
    (replica, r)
}

/// Waits until `vk`'s filters may answer "absent" (a replica: its link up, the grace after a
/// new primary passed, every set caught up since; docs/replicas.md).
pub fn wait_serves_absent(vk: &Valkey, c: &mut Connection) {
    assert!(
        wait_until(Duration::from_secs(30), || info_field(c, "serves_absent")
            .as_deref()
            == Ok("1")),
        "the node never served \"absent\" again: {:?}\n{}",
        info_field(c, "serves_absent_withheld"),
        log_tail(vk)
    );
}

/// Waits up to `within` for `replica`'s link to its primary to be up (`r`: a connection to
/// it); panics with the replica's log tail otherwise.
pub fn wait_linked(replica: &Valkey, r: &mut Connection, within: Duration) {
    assert!(
        wait_until(within, || info_section(
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

/// The filter came from disk (RDB/AOF) rather than from a rebuild in this process.
pub fn assert_not_rebuilt(vk: &Valkey, c: &mut Connection, set: &str, when: &str) {
    assert_eq!(
        set_info(c, set, "last_rebuild").as_deref(),
        Ok("none"),
        "{when}: the filter should have been loaded, not rebuilt\nvalkey log:\n{}",
        log_tail(vk)
    );
}
