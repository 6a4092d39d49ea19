//! What differs between the PostgreSQL majors the module supports (15-18, docs/operations.md
//! "PostgreSQL versions"), where a test can show it. `make test` runs this file on every major
//! (docs/testing.md); a test of a setting a major lacks says so and checks what that major has.
//!
//! `transaction_timeout` (17 and later): a role's or a database's setting must not end a
//! build's long snapshot transaction and its COPY (a rebuild, a standby rebuild; a slot fill
//! runs the same two), while every short transaction of the module still honours it.
use crate::support;

use std::time::Duration;

use postgres::Client;
use redis::Connection;
use support::cluster::Cluster;
use support::failover::PgPair;
use support::member::*;
use support::{wait_until, OwnPg};

use crate::cluster_slots::{fills_done, move_slot};

/// Whether the server behind `pg` lacks `transaction_timeout` (before 17); says so, for the
/// test that then has nothing to check.
fn lacks_transaction_timeout(pg: &mut Client) -> bool {
    let v: String = pg
        .query_one("SELECT current_setting('server_version_num')", &[])
        .unwrap()
        .get(0);
    let major = v.parse::<i32>().unwrap() / 10000;
    if major < 17 {
        eprintln!("PostgreSQL {major} has no transaction_timeout (17 and later): nothing to check");
    }
    major < 17
}

/// Ends every session of the module in `pg`'s database (only there: other tests share the
/// cluster), so that its next ones start with the role's and the database's settings as they
/// are now.
fn reconnect_module(pg: &mut Client) {
    pg.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'libmember%' AND datname = current_database() \
           AND pid <> pg_backend_pid()",
    )
    .unwrap();
}

/// `n` rows `i1`..`in` in set `set`'s table, in one statement.
fn fill(pg: &mut Client, set: &str, n: i64) {
    pg.execute(
        &format!(
            "INSERT INTO member_{set} (entity_id) SELECT 'i' || g FROM generate_series(1, $1::int8) g"
        ),
        &[&n],
    )
    .unwrap();
}

/// A rebuild (SYNC) that must succeed: its reply, the rows it read.
fn rebuilt(c: &mut Connection, set: &str, log: impl Fn() -> String) -> i64 {
    match cmd(c, &["MEMBER.REBUILD", set, "SYNC"]) {
        Ok(redis::Value::Int(n)) => n,
        other => panic!("MEMBER.REBUILD {set} SYNC: {other:?}\n{}", log()),
    }
}

#[test]
fn a_database_transaction_timeout_ends_no_rebuild_and_still_bounds_lookups() {
    // A PostgreSQL of its own: loading 1 M rows holds an xid for seconds, which would hold
    // back the shared cluster's xmin that other tests wait on.
    let own = OwnPg::start_new();
    let mut pg = own.client();
    if lacks_transaction_timeout(&mut pg) {
        return;
    }
    // The module's own timeout well above the DBA's, so that what ends a stuck lookup below is
    // the database's transaction_timeout.
    let vk = start_loaded(&own.url(), &[("member.db-timeout-ms", "10000")]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s", "RECENT-TTL", "1"]);
    fill(&mut pg, "s", 1_000_000);
    pg.batch_execute("ALTER DATABASE postgres SET transaction_timeout = '100ms'")
        .unwrap();
    reconnect_module(&mut pg);
    // A COPY of 1 M rows in one snapshot takes far longer than 100 ms.
    assert_eq!(rebuilt(&mut c, "s", || vk.log()), 1_000_000);
    for item in ["i1", "i500000", "i1000000"] {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", item]), 1, "{item}");
    }
    assert_eq!(set_info(&mut c, "s", "filter_complete").as_deref(), Ok("1"));
    // A lookup's transaction is short: the DBA's bound still ends it when it waits on a lock.
    let mut locker = own.client();
    locker
        .batch_execute(
            "SET transaction_timeout = 0; BEGIN; LOCK TABLE member_s IN ACCESS EXCLUSIVE MODE",
        )
        .unwrap();
    // PostgreSQL ends the whole session: the client gets UNAVAILABLE (the database did not
    // answer in time) with the reason, or a closed connection, never the module's own timeout
    // of 10 s and never a plain ERR.
    let e = err(&mut c, &["MEMBER.EXISTS", "s", "i42"]);
    assert!(
        e.starts_with("UNAVAILABLE")
            && (e.contains("transaction timeout") || e.contains("connection closed")),
        "a lookup behind a lock under transaction_timeout = 100ms: {e}"
    );
    locker.batch_execute("ROLLBACK").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || cmd(
            &mut c,
            &["MEMBER.EXISTS", "s", "i42"]
        )
        .is_ok_and(|v| v == redis::Value::Int(1))),
        "the lookup never answered once the lock was gone"
    );
}

#[test]
fn a_role_transaction_timeout_ends_no_standby_rebuild() {
    let pair = PgPair::start();
    let mut primary = pair.primary();
    if lacks_transaction_timeout(&mut primary) {
        return;
    }
    let (p, s) = pair.ports();
    let url = |port: u16| format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    let vk = start_loaded(&url(p), &[("member.pg-rebuild-url", url(s).as_str())]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s", "RECENT-TTL", "1"]);
    fill(&mut primary, "s", 300_000);
    primary
        .batch_execute("ALTER ROLE postgres SET transaction_timeout = '100ms'")
        .unwrap();
    pair.wait_caught_up();
    reconnect_module(&mut primary);
    reconnect_module(&mut pair.standby());
    assert_eq!(rebuilt(&mut c, "s", || vk.log()), 300_000);
    assert_eq!(
        set_info(&mut c, "s", "rebuild_source").as_deref(),
        Ok("standby")
    );
    for item in ["i1", "i300000"] {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", item]), 1, "{item}");
    }
}

#[test]
fn a_database_transaction_timeout_ends_no_slot_fill() {
    if lacks_transaction_timeout(&mut support::Pg::get().client("postgres")) {
        return;
    }
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "pgv_fill";
    ok(
        &mut cl.set_owner(set).conn(),
        &["MEMBER.CREATE", set, "NORMALIZE", "none"],
    );
    cl.wait_ready(set);
    // 300 000 rows in one slot (one hash tag): its fill streams far longer than 100 ms.
    let slot = cl.keyslot("{pgv}");
    let mut pg = cl.db().client();
    pg.execute(
        &format!(
            "INSERT INTO member_{set} (entity_id) \
             SELECT '{{pgv}}' || g FROM generate_series(1, 300000) g"
        ),
        &[],
    )
    .unwrap();
    let db = cl.db().name.clone();
    pg.batch_execute(&format!(
        "ALTER DATABASE {db} SET transaction_timeout = '100ms'"
    ))
    .unwrap();
    reconnect_module(&mut pg);
    let src = cl.owner(slot);
    let dst = cl.primaries().find(|n| n.port() != src.port()).unwrap();
    let before = fills_done(dst);
    move_slot(cl, slot, src, dst);
    let mut d = dst.conn();
    let filled = wait_until(Duration::from_secs(60), || {
        fills_done(dst) > before
            && set_info(&mut d, set, "cluster_slots_covered")
                == set_info(&mut d, set, "cluster_slots_owned")
    });
    // Put everything back for the next test of this cluster, whatever happened.
    pg.batch_execute(&format!("ALTER DATABASE {db} RESET transaction_timeout"))
        .unwrap();
    reconnect_module(&mut pg);
    let failed = info_field(&mut d, "slot_fills_failed");
    let log = dst.vk.log();
    move_slot(cl, slot, dst, src);
    assert!(
        filled,
        "the slot's fill never completed (slot_fills_failed {failed:?})\n{log}"
    );
}
