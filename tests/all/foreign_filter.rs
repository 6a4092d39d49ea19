//! A filter value is trusted only where it was made: a DUMP of a set's filter from a node of
//! another database (of the same PostgreSQL cluster, so of the same transaction-id counter),
//! RESTOREd over the same set's filter key, never answers "absent" there; it is replaced by a
//! rebuild from this node's own database. A filter saved by the previous version, which
//! cannot say where it was made, still loads and is rebuilt, never trusted; a replica's filter,
//! made by its primary from the same database, stays trusted.
use crate::support;

use std::thread;
use std::time::Duration;

use redis::{Connection, Value};
use support::lifecycle::{add_all, assert_members, names, reconnect_loaded, wait_linked, SYNC_OFF};
use support::member::*;
use support::wait_until;

/// Longer than RECENT-TTL 1 s: from then on no recent-writes mark covers an earlier ADD.
const PAST_RECENT: Duration = Duration::from_millis(1200);

/// How long a sync pass or the rebuild of a tiny set may take on a busy machine.
const SETTLE: Duration = Duration::from_secs(30);

fn wait_info(env: &Env, set: &str, field: &str, ok: impl Fn(&str) -> bool) {
    wait_on(&env.vk, set, field, ok)
}

fn wait_on(vk: &support::Valkey, set: &str, field: &str, ok: impl Fn(&str) -> bool) {
    let mut c = vk.conn();
    let mut last = set_info(&mut c, set, field);
    let reached = wait_until(SETTLE, || {
        last = set_info(&mut c, set, field);
        last.as_deref().is_ok_and(&ok)
    });
    assert!(
        reached,
        "MEMBER.INFO {set}: {field} stuck at {last:?}\n{}",
        vk.log()
    );
}

/// MEMBER.INFO as field/value pairs.
fn info_pairs(v: &Value) -> Vec<(String, String)> {
    let v: Vec<String> = redis::from_redis_value(v).expect("MEMBER.INFO reply");
    v.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect()
}

/// A field of an [`info_pairs`] reply (panics when it is missing: "" would pass a check that
/// it is not some value).
fn field<'a>(pairs: &'a [(String, String)], name: &str) -> &'a str {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in MEMBER.INFO: {pairs:?}"))
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
    let restored = info_pairs(&replies[1]);

    // Held back for as long as it is there (checked until the moment it is replaced, not
    // for a fixed time), then replaced by a rebuild of A's own rows.
    let mut probe = a.conn();
    assert!(
        wait_until(SETTLE, || {
            check_all(&a, &mut ca);
            set_info(&mut probe, "s", "filter_origin").as_deref() == Ok("here")
        }),
        "the foreign filter was never replaced\n{}",
        a.vk.log()
    );
    // As it was seen the moment it arrived: another database's, not trusted.
    assert_eq!(field(&restored, "filter_origin"), "foreign", "{restored:?}");
    assert_eq!(field(&restored, "filter_caught_up"), "0", "{restored:?}");
    assert_eq!(
        field(&restored, "filter_serves_absent"),
        "0",
        "{restored:?}"
    );
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

/// The payload of the `MEMBER._LOAD` in a RESP-encoded AOF, with its origin envelope cut off:
/// what the previous version wrote (set name, slots, Bloom payload).
fn strip_envelope(aof: &[u8]) -> Vec<u8> {
    let at = aof
        .windows(12)
        .position(|w| w == b"MEMBER._LOAD")
        .expect("the rewritten base AOF carries the filter as MEMBER._LOAD");
    // MEMBER._LOAD\r\n $<key len>\r\n <key>\r\n $<payload len>\r\n <payload>\r\n
    let line_end = |from: usize| from + aof[from..].windows(2).position(|w| w == b"\r\n").unwrap();
    let key_hdr = line_end(at) + 2;
    let key_len: usize = std::str::from_utf8(&aof[key_hdr + 1..line_end(key_hdr)])
        .unwrap()
        .parse()
        .unwrap();
    let payload_hdr = line_end(key_hdr) + 2 + key_len + 2;
    let hdr_end = line_end(payload_hdr);
    let len: usize = std::str::from_utf8(&aof[payload_hdr + 1..hdr_end])
        .unwrap()
        .parse()
        .unwrap();
    let payload = &aof[hdr_end + 2..hdr_end + 2 + len];
    assert_eq!(
        &payload[..4],
        b"LMFV",
        "this version writes the envelope first"
    );
    // Tag, version (2 bytes), flags; the database identity and the catalog row when flagged.
    let flags = payload[6];
    assert_eq!(
        flags, 3,
        "a filter built here names its database and catalog row"
    );
    let old = &payload[7 + 16 + 8..];
    let mut out = aof[..payload_hdr].to_vec();
    out.extend_from_slice(format!("${}\r\n", old.len()).as_bytes());
    out.extend_from_slice(old);
    out.extend_from_slice(&aof[hdr_end + 2 + len..]);
    out
}

#[test]
fn a_filter_saved_by_the_previous_version_is_rebuilt_not_trusted() {
    let mut env = Env::with(&[("appendonly", "yes"), ("aof-use-rdb-preamble", "no")]);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s", "RECENT-TTL", "1"]);
    let items = names("kept", 20);
    add_all(&env.vk, &mut c, "s", &items);
    let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    assert!(
        wait_until(SETTLE, || {
            info_section(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Ok("0")
                && info_section(&mut c, "persistence", "aof_rewrite_scheduled").as_deref()
                    == Ok("0")
        }),
        "AOF rewrite never finished\n{}",
        env.vk.log()
    );
    env.vk.shutdown(&["NOSAVE"]);
    let base = std::fs::read_dir(env.vk.dir().join("appendonlydir"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".base.aof"))
        .expect("no base AOF file after the rewrite")
        .path();
    let old = strip_envelope(&std::fs::read(&base).unwrap());
    std::fs::write(&base, old).unwrap();

    env.vk.restart();
    let mut c = reconnect_loaded(&env.vk);
    // The old payload loaded (the server started from it), but is never trusted: every
    // member answers 1 (no recent-writes mark survives a restart) until a rebuild replaces it.
    assert_eq!(set_info(&mut c, "s", "filter_present").as_deref(), Ok("1"));
    // Checked until the moment a rebuild replaces it, not for a fixed time.
    assert!(
        wait_until(SETTLE, || {
            assert_members(&env.vk, &mut c, "s", &items, "loaded from the old payload");
            let info = info_pairs(&cmd(&mut c, &["MEMBER.INFO", "s"]).unwrap());
            if field(&info, "filter_origin") == "here" {
                return true;
            }
            assert_eq!(field(&info, "filter_caught_up"), "0", "{info:?}");
            // No rebuild has finished yet (a failed one, on a busy machine, is retried).
            assert_ne!(field(&info, "last_rebuild"), "ok", "{info:?}");
            false
        }),
        "the old payload was never replaced\n{}",
        env.vk.log()
    );
    // Rebuilt from the database (not caught up from the old watermark), then it serves.
    wait_info(&env, "s", "filter_origin", |v| v == "here");
    wait_info(&env, "s", "last_rebuild", |v| v == "ok");
    assert_eq!(
        set_info(&mut c, "s", "last_rebuild_reason").as_deref(),
        Ok("incomplete"),
        "the old payload was not the reason for the rebuild"
    );
    wait_info(&env, "s", "filter_caught_up", |v| v == "1");
    assert_members(&env.vk, &mut c, "s", &items, "after the rebuild");
    assert!(
        wait_until(SETTLE, || bloom_negative_now(&mut c, "s", "never_added")),
        "{:?}",
        cmd(&mut c, &["MEMBER.INFO", "s"])
    );
}

/// The filter a replica holds was made by its primary from the same database: it stays
/// trusted through a live MEMBER._LOAD and a reload of the replica's own snapshot, and the
/// replica never rebuilds it.
#[test]
fn a_replicas_filter_from_its_primary_stays_trusted() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s", "RECENT-TTL", "1"]);
    let items = names("kept", 20);
    add_all(&env.vk, &mut c, "s", &items);
    let primary = format!("127.0.0.1 {}", env.vk.port());
    let replica = start_loaded(
        &env.db.url(),
        &[
            SYNC_OFF,
            ("replicaof", primary.as_str()),
            ("enable-debug-command", "yes"),
        ],
    );
    let mut r = replica.conn();
    wait_linked(&replica, &mut r, SETTLE);
    wait_on(&replica, "s", "filter_origin", |v| v == "here");
    wait_on(&replica, "s", "filter_caught_up", |v| v == "1");
    wait_on(&replica, "s", "rebuild_state", |v| v == "idle");
    let rebuilds = |r: &mut Connection| info_number(r, "member", "member_rebuilds_done");
    let before = rebuilds(&mut r);

    // A rebuild on the primary reaches the replica as MEMBER._LOAD, trusted at once there.
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]), 20);
    thread::sleep(PAST_RECENT);
    for round in [
        "after the primary's rebuild",
        "after DEBUG RELOAD on the replica",
    ] {
        wait_on(&replica, "s", "filter_origin", |v| v == "here");
        wait_on(&replica, "s", "filter_caught_up", |v| v == "1");
        assert_members(&replica, &mut r, "s", &items, round);
        assert!(
            wait_until(SETTLE, || bloom_negative_now(&mut r, "s", "never_added")),
            "{round}: {:?}",
            cmd(&mut r, &["MEMBER.INFO", "s"])
        );
        assert_eq!(rebuilds(&mut r), before, "{round}: the replica rebuilt");
        if round.starts_with("after the primary") {
            ok(&mut r, &["DEBUG", "RELOAD"]);
        }
    }
}

/// A role refused `pg_control_system()` cannot show where a loaded filter was made, but the
/// filters its own process builds serve: once built, a set's filter is caught up and answers
/// "absent" from memory, and is not rebuilt again at every sync pass (an earlier cut stamped
/// such filters with no origin and judged them foreign at the next pass, for ever). After a
/// restart the loaded filter is foreign: rebuilt once, then it serves.
#[test]
fn a_role_that_may_not_read_the_identity_still_serves_its_own_filters() {
    let mut env = Env::least_privilege(&[]);
    env.pg()
        .batch_execute("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
        .unwrap();
    // A new process, whose workers first connect after the revocation.
    env.vk.kill9_and_restart();
    let mut c = reconnect_loaded(&env.vk);
    ok(&mut c, &["MEMBER.CREATE", "s", "RECENT-TTL", "1"]);
    let items = members();
    for i in &items {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", i]), 1);
    }
    wait_info(&env, "s", "filter_caught_up", |v| v == "1");
    assert!(
        wait_until(SETTLE, || bloom_negative_now(&mut c, "s", "never_added")),
        "{:?}",
        cmd(&mut c, &["MEMBER.INFO", "s"])
    );
    let rebuilds = info_field(&mut c, "rebuilds_done").unwrap();
    // Three sync passes (one a second) judge the filter; none condemns it. The window is
    // those passes, however long they take, not a fixed time.
    let passes = |c: &mut Connection| info_number(c, "member", "member_sync_passes");
    let until = passes(&mut c) + 3;
    assert!(
        wait_until(SETTLE, || passes(&mut c) >= until),
        "the sync loop did not run"
    );
    assert_eq!(info_field(&mut c, "rebuilds_done").unwrap(), rebuilds);
    assert_eq!(
        set_info(&mut c, "s", "filter_origin").as_deref(),
        Ok("here")
    );
    assert!(bloom_negative_now(&mut c, "s", "never_added"));
    // Saved and loaded by a new process: not this process's, rebuilt once, then it serves.
    ok(&mut c, &["SAVE"]);
    env.vk.kill9_and_restart();
    let mut c = reconnect_loaded(&env.vk);
    wait_info(&env, "s", "filter_origin", |v| v == "here");
    wait_info(&env, "s", "filter_caught_up", |v| v == "1");
    assert_members(&env.vk, &mut c, "s", &items, "after the restart");
}
