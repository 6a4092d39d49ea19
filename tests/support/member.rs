//! Helpers for talking to libmember through a real client.

use std::path::Path;
use std::time::Duration;

use redis::{Connection, Value};

use super::{
    debug_module_path, fresh_db, fresh_db_owned_by_module_role, module_path, start_with,
    wait_until, TestDb, Valkey, MODULE_ROLE,
};

/// A fresh database and a Valkey with the module pointed at it, catalog loaded.
pub struct Env {
    pub db: TestDb,
    pub vk: Valkey,
}

impl Env {
    pub fn new() -> Env {
        Env::with(&[])
    }

    pub fn with(extra: &[(&str, &str)]) -> Env {
        Env::start(fresh_db(), None, extra)
    }

    /// An `Env` whose module connects as the least-privilege [`MODULE_ROLE`] (owner of the
    /// database, not superuser, not in `pg_read_all_stats`) instead of the superuser.
    pub fn least_privilege(extra: &[(&str, &str)]) -> Env {
        Env::start(fresh_db_owned_by_module_role(), Some(MODULE_ROLE), extra)
    }

    /// An `Env` whose server loads the debug build of the module (which has the test
    /// failpoints), whatever `MEMBER_MODULE` says.
    pub fn debug_build(extra: &[(&str, &str)]) -> Env {
        Env::start_module(fresh_db(), None, extra, &debug_module_path())
    }

    /// An `Env` whose module reaches its fresh database at `url(name)` (through a pooler in
    /// front of the shared cluster, say).
    pub fn through(url: impl FnOnce(&str) -> String, extra: &[(&str, &str)]) -> Env {
        let db = fresh_db();
        let url = url(&db.name);
        Env::start_at(db, &url, extra, &module_path())
    }

    fn start(db: TestDb, role: Option<&str>, extra: &[(&str, &str)]) -> Env {
        Env::start_module(db, role, extra, &module_path())
    }

    fn start_module(db: TestDb, role: Option<&str>, extra: &[(&str, &str)], module: &Path) -> Env {
        let url = role.map_or_else(|| db.url(), |r| db.url_as(r));
        Env::start_at(db, &url, extra, module)
    }

    fn start_at(db: TestDb, url: &str, extra: &[(&str, &str)], module: &Path) -> Env {
        let mut cfg = vec![("member.pg-url", url)];
        cfg.extend_from_slice(extra);
        let vk = Valkey::start_module(module, &cfg);
        let mut c = vk.conn();
        assert!(
            wait_until(Duration::from_secs(20), || info_field(
                &mut c,
                "catalog_loaded"
            )
            .as_deref()
                == Ok("1")),
            "catalog never loaded:\n{}",
            vk.log()
        );
        Env { db, vk }
    }

    pub fn conn(&self) -> Connection {
        self.vk.conn()
    }

    pub fn pg(&self) -> postgres::Client {
        self.db.client()
    }
}

/// Why a field of INFO or MEMBER.NODEINFO could not be read: the call failed, or the reply
/// has no such field. It equals nothing, itself included (like a NaN), so a comparison of two
/// reads that both failed never passes: `assert_eq!(a, b)` on two results fails when either is
/// an error. A caller that needs the value unwraps it (`.unwrap()` names the field and why); a
/// caller that waits for a value polls `.is_ok_and(|v| v == "1")`.
#[derive(Debug)]
pub struct FieldError(pub String);

impl PartialEq for FieldError {
    fn eq(&self, _: &FieldError) -> bool {
        false
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One field of `INFO member` (fields are printed as `member_<name>`).
pub fn info_field(c: &mut Connection, name: &str) -> Result<String, FieldError> {
    info_section(c, "member", &format!("member_{name}"))
}

/// Waits until the node's change-notification listener (`member.sync-notify`) is listening.
pub fn wait_listening(c: &mut Connection, timeout: Duration) -> bool {
    wait_until(timeout, || {
        info_field(c, "sync_notify").as_deref() == Ok("listening")
    })
}

/// `field` of INFO `section`; an error when INFO fails or does not show the field.
pub fn info_section(c: &mut Connection, section: &str, field: &str) -> Result<String, FieldError> {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query(c)
        .map_err(|e| FieldError(format!("INFO {section} (for {field}): {e}")))?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| FieldError(format!("no {field} in INFO {section}")))
}

/// A numeric field of any `INFO <section>` (panics, naming it, when it is missing).
pub fn info_number(c: &mut Connection, section: &str, name: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg(section).query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in INFO {section}"))
        .trim()
        .parse()
        .unwrap()
}

/// One field of `MEMBER.NODEINFO <set>`: the set as the node behind `c` serves it (the same
/// fields as MEMBER.INFO; in a cluster, that node's part).
/// An error when the call fails (no such set, server away) or the reply has no such field.
pub fn set_info(c: &mut Connection, set: &str, name: &str) -> Result<String, FieldError> {
    let v: Vec<String> = redis::cmd("MEMBER.NODEINFO")
        .arg(set)
        .query(c)
        .map_err(|e| FieldError(format!("MEMBER.NODEINFO {set} (for {name}): {e}")))?;
    v.chunks(2)
        .find(|p| p[0] == name)
        .map(|p| p[1].clone())
        .ok_or_else(|| FieldError(format!("no {name} in MEMBER.NODEINFO {set}")))
}

pub fn cmd(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    let mut k = redis::cmd(args[0]);
    for a in &args[1..] {
        k.arg(*a);
    }
    k.query(c)
}

pub fn int(c: &mut Connection, args: &[&str]) -> i64 {
    let mut k = redis::cmd(args[0]);
    for a in &args[1..] {
        k.arg(*a);
    }
    k.query::<i64>(c)
        .unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// The error text of a call that must fail.
pub fn err(c: &mut Connection, args: &[&str]) -> String {
    match cmd(c, args) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => {
            let code = e.code().unwrap_or("").to_string();
            let detail = e.detail().unwrap_or("").to_string();
            format!("{code} {detail}").trim().to_string()
        }
    }
}

/// Whether `MEMBER.EXPLAIN` answers 0 from the filter now. An `UNAVAILABLE` (the database did
/// not answer in time while the filter could not answer alone, on a busy machine) is a "not
/// yet" for a caller that waits, never a wrong answer.
pub fn bloom_negative_now(c: &mut Connection, set: &str, item: &str) -> bool {
    match redis::cmd("MEMBER.EXPLAIN")
        .arg(set)
        .arg(item)
        .query::<(i64, String)>(c)
    {
        Ok(v) => v == (0, "bloom-negative".to_string()),
        Err(e) if e.code() == Some("UNAVAILABLE") => false,
        Err(e) => panic!("EXPLAIN {set} {item}: {e}"),
    }
}

/// `MEMBER.EXPLAIN` as (answer, path).
pub fn explain(c: &mut Connection, set: &str, item: &str) -> (i64, String) {
    let v: (i64, String) = redis::cmd("MEMBER.EXPLAIN")
        .arg(set)
        .arg(item)
        .query(c)
        .unwrap_or_else(|e| panic!("EXPLAIN {set} {item}: {e}"));
    v
}

pub fn ok(c: &mut Connection, args: &[&str]) {
    let v = cmd(c, args).unwrap_or_else(|e| panic!("{args:?} failed: {e}"));
    assert!(
        matches!(&v, Value::Okay) || matches!(&v, Value::SimpleString(s) if s == "OK"),
        "{args:?} -> {v:?}"
    );
}

/// Waits until the filter of `set` is trusted on the node behind `c` (`filter_caught_up`);
/// `what` names it in the failure.
pub fn wait_trusted(c: &mut Connection, set: &str, what: &str) {
    assert!(
        wait_until(Duration::from_secs(20), || {
            set_info(c, set, "filter_caught_up").as_deref() == Ok("1")
        }),
        "{what}"
    );
}

/// Creates `set` (with the options `extra`) and waits until its filter is trusted and its
/// first sync pass, which starts at once, is over: none other is due until the interval.
pub fn create_synced(c: &mut Connection, set: &str, extra: &[&str]) {
    let mut args = vec!["MEMBER.CREATE", set];
    args.extend_from_slice(extra);
    ok(c, &args);
    wait_trusted(c, set, &format!("the filter of {set} never caught up"));
    assert!(
        wait_until(Duration::from_secs(20), || set_info(c, set, "sync_age_ms")
            .is_ok_and(|a| a != "never")),
        "no sync pass for {set}"
    );
}

/// Waits up to `timeout` until `INFO member` reports the set catalog loaded.
pub fn wait_catalog_loaded(c: &mut Connection, timeout: Duration) -> bool {
    wait_until(timeout, || {
        info_field(c, "catalog_loaded").as_deref() == Ok("1")
    })
}

/// A Valkey with the module pointed at `pg_url` (any cluster, e.g. an `OwnPg`), catalog
/// loaded. For fault tests; `Env` always uses the shared cluster.
pub fn start_loaded(pg_url: &str, extra: &[(&str, &str)]) -> Valkey {
    let vk = start_with(pg_url, extra);
    let mut c = vk.conn();
    assert!(
        wait_catalog_loaded(&mut c, Duration::from_secs(20)),
        "catalog never loaded:\n{}",
        vk.log()
    );
    vk
}

/// The exact-match cache key of `item` (scope `scope`) in `set`, as the module writes it.
pub fn cache_key(set: &str, item: &str, scope: &str) -> Vec<u8> {
    let mut k = format!("member:{set}:hit:{item}").into_bytes();
    k.push(0);
    k.extend_from_slice(scope.as_bytes());
    k
}

/// `peak.allocated` of `MEMORY STATS`.
pub fn peak_allocated(c: &mut Connection) -> i64 {
    let stats: Vec<Value> = redis::cmd("MEMORY").arg("STATS").query(c).unwrap();
    stats
        .chunks(2)
        .find_map(|p| match (&p[0], &p[1]) {
            (Value::BulkString(k), Value::Int(v)) if k == b"peak.allocated" => Some(*v),
            (Value::SimpleString(k), Value::Int(v)) if k == "peak.allocated" => Some(*v),
            _ => None,
        })
        .expect("MEMORY STATS has peak.allocated")
}

/// Every command the module registered, as `COMMAND LIST FILTERBY MODULE member` names them,
/// sorted.
pub fn module_commands(c: &mut Connection) -> Vec<String> {
    let mut listed: Vec<String> = redis::cmd("COMMAND")
        .arg("LIST")
        .arg("FILTERBY")
        .arg("MODULE")
        .arg("member")
        .query(c)
        .unwrap();
    listed.sort();
    listed
}
