//! Rebuilds read from a streaming standby (`member.pg-rebuild-url`, docs/sync.md "Rebuilding
//! from a standby"): a standby whose replay is paused misses rows the primary committed, and
//! the rebuilt filter must still answer 1 for every one of them (its watermark is the
//! standby snapshot's xmin, and the primary's change log covers the rest); a rebuild URL that
//! points at a primary, or at nothing, fails with a clear error and the old filter serves on.
use crate::support;

use std::time::{Duration, Instant};

use postgres::Client;
use redis::Connection;
use support::member::*;
use support::source::{app_sql, users};
use support::standby::Standby;
use support::{free_port, wait_until};

/// Every item must answer 1, and not because of its recent-writes mark.
fn assert_members(c: &mut Connection, set: &str, items: &[String], when: &str) {
    for item in items {
        let (answer, path) = explain(c, set, item);
        assert_eq!(answer, 1, "{when}: {item} answered 0 ({path})");
        assert_ne!(
            path, "recent",
            "{when}: {item} only held by its recent mark"
        );
    }
}

fn insert(pg: &mut Client, set: &str, items: &[String]) {
    for item in items {
        pg.execute(
            &format!("INSERT INTO member_{set} (entity_id) VALUES ($1)"),
            &[item],
        )
        .unwrap();
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn rows_on(c: &mut Client, set: &str, items: &[String]) -> i64 {
    c.query_one(
        &format!("SELECT count(*) FROM member_{set} WHERE entity_id = ANY($1)"),
        &[&items],
    )
    .unwrap()
    .get(0)
}

/// One scenario in phases: the standby is shared by the whole file and its replay is paused
/// in the middle, so nothing else here may use it meanwhile.
#[test]
fn a_rebuild_from_a_lagging_standby_loses_no_committed_row() {
    let sb = Standby::get();
    let env = Env::new();
    let set = "s";
    let mut c = env.conn();
    let mut pg = env.pg();
    // RECENT-TTL 1: an ADD's mark is gone long before the rebuild, only the filter holds it.
    ok(&mut c, &["MEMBER.CREATE", set, "RECENT-TTL", "1"]);
    let before = names("before", 50);
    insert(&mut pg, set, &before);
    assert!(sb.wait_caught_up(Duration::from_secs(20)), "standby lags");
    ok(
        &mut c,
        &[
            "CONFIG",
            "SET",
            "member.pg-rebuild-url",
            &sb.url(&env.db.name),
        ],
    );
    assert_eq!(
        set_info(&mut c, set, "rebuild_source").as_deref(),
        Ok("standby")
    );
    assert_eq!(
        info_field(&mut c, "rebuild_source").as_deref(),
        Ok("standby")
    );
    // A rebuild from the standby that is up to date: every row, the filter serves "absent".
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", set, "SYNC"]), 50);
    assert!(
        env.vk.log().contains("(manual, from the standby)"),
        "{}",
        env.vk.log()
    );
    assert_members(&mut c, set, &before, "after the first rebuild");
    // CREATE's first build reads the standby too, once it has replayed the new table.
    ok(&mut c, &["MEMBER.CREATE", "fresh"]);
    assert!(
        env.vk.log().contains("'fresh' (create, from the standby)"),
        "{}",
        env.vk.log()
    );
    assert!(wait_until(Duration::from_secs(10), || set_info(
        &mut c,
        "fresh",
        "filter_serves_absent"
    )
    .as_deref()
        == Ok("1")));

    // A transaction the standby sees start (its insert is replayed) but not commit.
    let mut slow = env.pg();
    let open = vec!["open-0".to_string()];
    slow.batch_execute("BEGIN").unwrap();
    insert(&mut slow, set, &open);
    assert!(sb.wait_caught_up(Duration::from_secs(20)), "standby lags");
    sb.pause();
    slow.batch_execute("COMMIT").unwrap();
    // Writes the standby never hears of: acknowledged ADDs and committed outside inserts.
    let added = names("added", 5);
    for item in &added {
        assert_eq!(int(&mut c, &["MEMBER.ADD", set, item]), 1);
    }
    let outside = names("outside", 5);
    insert(&mut pg, set, &outside);
    let new: Vec<String> = [open, added, outside].concat();
    // The old filter answers 1 for all of them once a pass has run (and the marks expired).
    assert!(
        wait_until(Duration::from_secs(10), || new.iter().all(|i| {
            explain(&mut c, set, i).1 != "recent" && int(&mut c, &["MEMBER.EXISTS", set, i]) == 1
        })),
        "the old filter never caught up"
    );
    let mut on_standby = sb.client(&env.db.name);
    assert_eq!(
        rows_on(&mut on_standby, set, &new),
        0,
        "the standby must lag"
    );

    // The rebuild reads the paused standby: its COPY lacks every new row.
    let loaded = int(&mut c, &["MEMBER.REBUILD", set, "SYNC"]);
    assert_eq!(set_info(&mut c, set, "last_rebuild").as_deref(), Ok("ok"));
    assert_eq!(
        rows_on(&mut on_standby, set, &new),
        0,
        "the standby must still lag"
    );
    // From the swap on, and through the sync passes that follow, no committed row answers 0.
    // (A watermark taken from the primary would skip them for good: they answer 0 here.)
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert_members(
            &mut c,
            set,
            &new,
            "after the rebuild from the lagging standby",
        );
        assert_members(
            &mut c,
            set,
            &before,
            "after the rebuild from the lagging standby",
        );
    }
    // The COPY's rows, and the catch-up's: the rows the standby lacked, read on the primary.
    assert_eq!(loaded, (before.len() + new.len()) as i64);
    assert_eq!(
        set_info(&mut c, set, "filter_serves_absent").as_deref(),
        Ok("1")
    );
    let absent: Vec<(i64, String)> = (0..20)
        .map(|i| explain(&mut c, set, &format!("nobody-{i}")))
        .collect();
    assert!(absent.iter().all(|(a, _)| *a == 0), "{absent:?}");
    assert!(
        absent.iter().any(|(_, p)| p == "bloom-negative"),
        "{absent:?}"
    );

    // The standby lags past the change log's retention: its snapshot's xmin is below the
    // floor (as if the rows it has not replayed had been pruned). Refused, the filter serves on.
    let standby_xmin: i64 = on_standby
        .query_one(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8",
            &[],
        )
        .unwrap()
        .get(0);
    let floor: String = pg
        .query_one("SELECT floor::text FROM member_changes_floor", &[])
        .unwrap()
        .get(0);
    pg.execute(
        "UPDATE member_changes_floor SET floor = $1::text::xid8",
        &[&(standby_xmin + 1).to_string()],
    )
    .unwrap();
    let e = err(&mut c, &["MEMBER.REBUILD", set, "SYNC"]);
    assert!(e.contains("member.change-retention-s"), "{e}");
    assert_eq!(
        set_info(&mut c, set, "last_rebuild").as_deref(),
        Ok("failed")
    );
    let why = set_info(&mut c, set, "last_rebuild_error").unwrap();
    assert!(why.contains("older than the change log's floor"), "{why}");
    assert_eq!(
        set_info(&mut c, set, "filter_serves_absent").as_deref(),
        Ok("1")
    );
    assert_members(&mut c, set, &new, "after the refused rebuild");
    pg.execute(
        "UPDATE member_changes_floor SET floor = $1::text::xid8",
        &[&floor],
    )
    .unwrap();

    // Replay resumes: the next rebuild from the standby reads every row itself.
    sb.resume();
    assert!(sb.wait_caught_up(Duration::from_secs(20)), "standby lags");
    assert_eq!(rows_on(&mut on_standby, set, &new), new.len() as i64);
    assert_eq!(
        int(&mut c, &["MEMBER.REBUILD", set, "SYNC"]),
        (before.len() + new.len()) as i64
    );
    assert_members(&mut c, set, &new, "after replay resumed");
}

/// A set with members, a complete filter, and the rebuild URL not set yet.
fn serving_set(env: &Env, set: &str) -> Vec<String> {
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", set, "RECENT-TTL", "1"]);
    let items = names("m", 10);
    for item in &items {
        assert_eq!(int(&mut c, &["MEMBER.ADD", set, item]), 1);
    }
    assert!(wait_until(Duration::from_secs(10), || set_info(
        &mut c,
        set,
        "filter_serves_absent"
    )
    .as_deref()
        == Ok("1")));
    items
}

/// After a refused rebuild the old filter serves: members 1, absent items 0 without the
/// database (some of them, at least: any may be a false positive).
fn old_filter_serves(c: &mut Connection, set: &str, items: &[String]) {
    assert_eq!(set_info(c, set, "last_rebuild").as_deref(), Ok("failed"));
    assert_eq!(set_info(c, set, "filter_serves_absent").as_deref(), Ok("1"));
    for item in items {
        assert_eq!(int(c, &["MEMBER.EXISTS", set, item]), 1, "{item}");
    }
    let absent: Vec<(i64, String)> = (0..20)
        .map(|i| explain(c, set, &format!("nobody-{i}")))
        .collect();
    assert!(absent.iter().all(|(a, _)| *a == 0), "{absent:?}");
    assert!(
        absent.iter().any(|(_, p)| p == "bloom-negative"),
        "{absent:?}"
    );
}

#[test]
fn a_rebuild_url_that_points_at_a_primary_is_refused_and_never_shown_with_its_password() {
    let env = Env::with(&[("slowlog-log-slower-than", "0")]);
    let set = "p";
    let items = serving_set(&env, set);
    let mut c = env.conn();
    let secret = "sekrit-rebuild-pw";
    let url = format!("{} password={secret}", env.db.url());
    ok(&mut c, &["CONFIG", "SET", "member.pg-rebuild-url", &url]);
    let shown: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.pg-rebuild-url")
        .query(&mut c)
        .unwrap();
    assert_eq!(shown[1], format!("{} password=***", env.db.url()));
    let e = err(&mut c, &["MEMBER.REBUILD", set, "SYNC"]);
    assert!(
        e.contains("not a standby (pg_is_in_recovery() is false)"),
        "{e}"
    );
    let why = set_info(&mut c, set, "last_rebuild_error").unwrap();
    assert!(why.contains("member.pg-rebuild-url"), "{why}");
    let link = info_field(&mut c, "rebuild_link_error").unwrap();
    assert!(link.contains("not a standby"), "{link}");
    assert_eq!(info_field(&mut c, "db_link_error").as_deref(), Ok("none"));
    old_filter_serves(&mut c, set, &items);
    // The password is nowhere: CONFIG GET, INFO, MEMBER.INFO, SLOWLOG, the server log.
    let info: String = redis::cmd("INFO").arg("member").query(&mut c).unwrap();
    let set_all: Vec<String> = redis::cmd("MEMBER.INFO").arg(set).query(&mut c).unwrap();
    let slowlog = format!(
        "{:?}",
        redis::cmd("SLOWLOG")
            .arg("GET")
            .arg("1000")
            .query::<redis::Value>(&mut c)
            .unwrap()
    );
    for (what, text) in [
        ("INFO", info),
        ("MEMBER.INFO", set_all.join(" ")),
        ("SLOWLOG", slowlog),
        ("log", env.vk.log()),
    ] {
        assert!(!text.contains(secret), "{what} shows the password:\n{text}");
    }
    // Emptied: rebuilds read the primary again.
    ok(&mut c, &["CONFIG", "SET", "member.pg-rebuild-url", ""]);
    assert_eq!(
        set_info(&mut c, set, "rebuild_source").as_deref(),
        Ok("primary")
    );
    assert_eq!(
        int(&mut c, &["MEMBER.REBUILD", set, "SYNC"]),
        items.len() as i64
    );
    assert_eq!(
        info_field(&mut c, "rebuild_link_error").as_deref(),
        Ok("none")
    );
}

#[test]
fn an_unreachable_rebuild_url_is_a_clear_error_and_the_old_filter_serves() {
    // The sets are made under the default timeout (a CREATE on a busy machine can take longer
    // than 500 ms); the failing rebuild below runs under a short one.
    let env = Env::with(&[("member.attach-allow", "app.users")]);
    let set = "u";
    let items = serving_set(&env, set);
    let mut c = env.conn();
    // An attached set (its table the application's) never builds from the standby.
    users(&env.db, "app", true);
    app_sql(
        &env.db,
        "INSERT INTO app.users (username) VALUES ('zoe'), ('yann')",
    );
    let attach = [
        "MEMBER.CREATE",
        "att",
        "SOURCE",
        "app.users",
        "COLUMN",
        "username",
        "SYNC",
        "log",
    ];
    ok(&mut c, &attach);
    let url = format!("host=127.0.0.1 port={} user=postgres dbname=x", free_port());
    ok(&mut c, &["CONFIG", "SET", "member.pg-rebuild-url", &url]);
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "att", "SYNC"]), 2);
    assert_eq!(
        set_info(&mut c, "att", "rebuild_source").as_deref(),
        Ok("primary")
    );
    assert_eq!(
        set_info(&mut c, set, "rebuild_source").as_deref(),
        Ok("standby")
    );
    let was: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.db-timeout-ms")
        .query(&mut c)
        .unwrap();
    ok(&mut c, &["CONFIG", "SET", "member.db-timeout-ms", "500"]);
    let e = err(&mut c, &["MEMBER.REBUILD", set, "SYNC"]);
    assert!(e.starts_with("UNAVAILABLE"), "{e}");
    assert!(e.contains("member.pg-rebuild-url"), "{e}");
    // The lookups below may reach the database: a busy machine took longer than 500 ms once.
    ok(&mut c, &["CONFIG", "SET", "member.db-timeout-ms", &was[1]]);
    let why = set_info(&mut c, set, "last_rebuild_error").unwrap();
    assert!(why.contains(&url), "{why}");
    assert!(info_field(&mut c, "rebuild_link_error").is_ok_and(|l| l != "none"));
    assert_eq!(info_field(&mut c, "db_link_error").as_deref(), Ok("none"));
    old_filter_serves(&mut c, set, &items);
}
