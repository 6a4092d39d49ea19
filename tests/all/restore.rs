//! A database restored from a storage snapshot keeps its system identifier and its timeline,
//! yet it is another history: the commits after the snapshot are gone, and it hands out
//! transaction ids again from where the snapshot stopped, below the node's sync watermarks
//! (docs/failover.md, "A database that went back in time"). Here the snapshot is a cold copy
//! of the data directory put back in place on the same address while a node follows it.
use crate::support;

use std::time::Duration;

use support::cluster::Cluster;
use support::lifecycle::log_tail;
use support::member::*;
use support::{wait_until, ColdCopy, OwnPg};

use super::failover::{add_or_insert, exists, insert};

const WITHIN: Duration = Duration::from_secs(30);

fn next_xid(pg: &mut postgres::Client) -> i64 {
    pg.query_one(
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Whether `c`'s filter of set `s` has caught up past transaction id `past`.
fn watermark_past(c: &mut redis::Connection, past: i64) -> bool {
    set_info(c, "s", "sync_watermark_xid")
        .ok()
        .and_then(|w| w.parse::<i64>().ok())
        .is_some_and(|w| w > past)
}

/// Puts `copy` back in place of `pg`'s data directory and writes 30 rows (`fresh0` …) on the
/// restored database, outside the module: their transaction ids start where the copy stopped.
fn restore_and_write(pg: &mut OwnPg, copy: &ColdCopy) -> (postgres::Client, Vec<String>) {
    pg.restore(copy);
    let mut db = pg.client();
    let fresh: Vec<String> = (0..30).map(|i| format!("fresh{i}")).collect();
    for item in &fresh {
        insert(&mut db, "s", item);
    }
    (db, fresh)
}

/// Rows written on the restored database answer 1, members lost with the rollback stop
/// answering 1, and the node says it saw the database go back in time. Against a build that
/// does not compare what it reads with what it read before, the restored database's rows
/// answer 0 for good: their transaction ids lie below the watermark, so no pass reads them.
#[test]
fn a_database_restored_from_a_cold_copy_is_a_new_history() {
    let mut pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &[("member.sync-interval-ms", "200")]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    let kept: Vec<String> = (0..10).map(|i| format!("kept{i}")).collect();
    for item in &kept {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", item]), 1);
    }
    let copy = pg.cold_copy();
    let mut db = pg.client();
    let at_copy = next_xid(&mut db);

    // Members the restore will lose, then enough transactions for the watermark to pass
    // well beyond the copy's ids.
    let lost: Vec<String> = (0..10).map(|i| format!("lost{i}")).collect();
    assert!(
        wait_until(WITHIN, || exists(&mut c, "s", "kept0") == Some(1)),
        "the node never came back after the copy\n{}",
        log_tail(&vk)
    );
    for item in &lost {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", item]), 1);
        assert_eq!(exists(&mut c, "s", item), Some(1));
    }
    for _ in 0..300 {
        db.batch_execute("SELECT pg_current_xact_id()").unwrap();
    }
    assert!(
        wait_until(WITHIN, || watermark_past(&mut c, at_copy + 250)),
        "the watermark never passed the copy's ids: {:?} (copy at {at_copy})\n{}",
        set_info(&mut c, "s", "sync_watermark_xid"),
        log_tail(&vk)
    );
    assert_eq!(set_info(&mut c, "s", "filter_serves_absent").unwrap(), "1");
    drop(db);

    let (mut db, fresh) = restore_and_write(&mut pg, &copy);
    assert!(
        next_xid(&mut db) < at_copy + 250,
        "the restored database should hand out ids below the watermark"
    );
    assert!(
        wait_until(WITHIN, || fresh
            .iter()
            .all(|item| exists(&mut c, "s", item) == Some(1))),
        "rows written on the restored database do not all answer 1: {:?}\nINFO: \
         db_history_changes {:?}, db_history_rollbacks {:?}; the set: {}\nthe database: {}\n{}",
        fresh
            .iter()
            .map(|i| (i, explain(&mut c, "s", i)))
            .filter(|(_, (a, _))| *a != 1)
            .collect::<Vec<_>>(),
        info_field(&mut c, "db_history_changes"),
        info_field(&mut c, "db_history_rollbacks"),
        [
            "filter_complete",
            "filter_serves_absent",
            "sync_watermark_xid",
            "sync_last_error",
            "last_rebuild"
        ]
        .map(|f| format!("{f} {:?}", set_info(&mut c, "s", f)))
        .join(", "),
        {
            let rows: i64 = db
                .query_one(
                    "SELECT count(*) FROM member_s WHERE entity_id LIKE 'fresh%'",
                    &[],
                )
                .map(|r| r.get(0))
                .unwrap_or(-1);
            let next = next_xid(&mut db);
            format!("{rows} fresh rows, next xid {next}")
        },
        log_tail(&vk)
    );
    assert!(
        wait_until(WITHIN, || lost
            .iter()
            .all(|item| exists(&mut c, "s", item) == Some(0))),
        "members lost with the restore still answer 1: {:?}",
        lost.iter()
            .map(|i| (i, exists(&mut c, "s", i)))
            .collect::<Vec<_>>()
    );
    for item in kept.iter().chain(&fresh) {
        assert_eq!(exists(&mut c, "s", item), Some(1), "{item}");
    }
    assert_eq!(info_field(&mut c, "db_history_rollbacks").unwrap(), "1");
    assert_eq!(info_field(&mut c, "db_history_changes").unwrap(), "1");
    assert!(
        info_field(&mut c, "db_history")
            .unwrap()
            .contains("token restored-"),
        "{:?}",
        info_field(&mut c, "db_history")
    );
    // The node serves "absent" again from a filter rebuilt from the restored history.
    assert!(
        wait_until(WITHIN, || set_info(&mut c, "s", "filter_serves_absent")
            .as_deref()
            == Ok("1")),
        "the filter was never rebuilt\n{}",
        log_tail(&vk)
    );
    assert_eq!(
        explain(&mut c, "s", "never-added"),
        (0, "bloom-negative".to_string())
    );
}

/// The same restore under a cluster of three primaries (a cluster of the test's own, on a
/// PostgreSQL of its own: the shared clusters' database is the shared PostgreSQL, which no test
/// may put back in time). The first node to read the restored database behind what it read
/// writes the new history token; every other node follows it at its next pass.
#[test]
fn in_a_cluster_every_node_leaves_a_restored_history() {
    let mut pg = OwnPg::start_new();
    let cl = Cluster::start_primaries_on(&pg.url(), &[("member.sync-interval-ms", "200")]);
    cl.create_everywhere("s");
    cl.wait_ready("s");
    let mut c = cl.client();
    let kept: Vec<String> = (0..30).map(|i| format!("kept{i}")).collect();
    let mut db = pg.client();
    add_or_insert(&mut c, &mut db, &kept);
    drop(db);
    let copy = pg.cold_copy();
    let mut db = pg.client();
    let at_copy = next_xid(&mut db);
    assert!(
        wait_until(WITHIN, || kept
            .iter()
            .all(|i| exists(&mut c, "s", i) == Some(1))),
        "the cluster never came back after the copy"
    );
    let lost: Vec<String> = (0..30).map(|i| format!("lost{i}")).collect();
    add_or_insert(&mut c, &mut db, &lost);
    for _ in 0..300 {
        db.batch_execute("SELECT pg_current_xact_id()").unwrap();
    }
    for n in cl.primaries() {
        let mut nc = n.conn();
        assert!(
            wait_until(WITHIN, || watermark_past(&mut nc, at_copy + 250)),
            "{}: the watermark never passed the copy's ids",
            n.addr()
        );
    }
    drop(db);

    let (_db, fresh) = restore_and_write(&mut pg, &copy);
    let mut rollbacks = 0;
    for n in cl.primaries() {
        let mut nc = n.conn();
        assert!(
            wait_until(WITHIN, || info_field(&mut nc, "db_history")
                .is_ok_and(|h| h.contains("token restored-"))),
            "{} never left the restored history: {:?}",
            n.addr(),
            info_field(&mut nc, "db_history")
        );
        assert_eq!(info_field(&mut nc, "db_history_changes").unwrap(), "1");
        rollbacks += info_field(&mut nc, "db_history_rollbacks")
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    assert!(rollbacks >= 1, "no node says it saw the database go back");
    for item in &fresh {
        assert!(
            wait_until(WITHIN, || exists(&mut c, "s", item) == Some(1)),
            "{item}, written on the restored database, never answered 1"
        );
    }
    for item in &lost {
        assert!(
            wait_until(WITHIN, || exists(&mut c, "s", item) == Some(0)),
            "{item}, lost with the restore, still answers 1"
        );
    }
    for item in &kept {
        assert_eq!(exists(&mut c, "s", item), Some(1), "{item}");
    }
}
