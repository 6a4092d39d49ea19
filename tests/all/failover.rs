//! A PostgreSQL failover to an asynchronous standby that was behind (docs/failover.md): the
//! standby is stopped so that it misses transactions (members the module acknowledged, outside
//! rows, and enough transactions to put the old history's ids well past the standby's), the
//! primary is killed, and the standby is promoted. `member.pg-url` names both hosts with
//! `target_session_attrs=read-write`, the libpq way to follow a failover. A checker runs
//! through it all: members of both histories never answer 0; rows committed on the new
//! primary answer 1 once the node has learned the new history, and from then on never 0;
//! members lost in the promotion stop answering 1 within a few seconds of it.
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use support::cluster::Cluster;
use support::failover::PgPair;
use support::member::*;
use support::wait_until;

/// The sync interval the node runs with: the bounds below are stated in it.
pub(crate) const SYNC_MS: u64 = 200;

pub(crate) fn insert(pg: &mut postgres::Client, set: &str, item: &str) {
    pg.execute(
        &format!("INSERT INTO member_{set} (entity_id) VALUES ($1)"),
        &[&item],
    )
    .unwrap_or_else(|e| panic!("INSERT {item}: {e}"));
}

/// EXISTS as Some(answer), or None for an `UNAVAILABLE` (the database away during the
/// failover: an error is always allowed, a wrong 0 or 1 never).
pub(crate) fn exists(c: &mut impl redis::ConnectionLike, set: &str, item: &str) -> Option<i64> {
    match redis::cmd("MEMBER.EXISTS").arg(set).arg(item).query(c) {
        Ok(Value::Int(n)) => Some(n),
        Ok(v) => panic!("EXISTS {item} answered {v:?}"),
        Err(e) if e.code() == Some("UNAVAILABLE") => None,
        Err(e) => panic!("EXISTS {item}: {e}"),
    }
}

/// Every item of `items` answers `want` now; `when` says at which point of the test.
pub(crate) fn all_answer<'a>(
    c: &mut impl redis::ConnectionLike,
    items: impl IntoIterator<Item = &'a String>,
    want: i64,
    when: &str,
) {
    for item in items {
        assert_eq!(exists(c, "s", item), Some(want), "{item} {when}");
    }
}

/// Half of `items` (even positions) added through the module, the other half inserted by an
/// outside writer on `pg`, each its own transaction.
pub(crate) fn add_or_insert(
    c: &mut impl redis::ConnectionLike,
    pg: &mut postgres::Client,
    items: &[String],
) {
    for (i, item) in items.iter().enumerate() {
        if i % 2 == 0 {
            let added: i64 = redis::cmd("MEMBER.ADD")
                .arg("s")
                .arg(item)
                .query(c)
                .unwrap_or_else(|e| panic!("ADD {item}: {e}"));
            assert_eq!(added, 1, "ADD {item}");
        } else {
            insert(pg, "s", item);
        }
    }
}

/// A thread asking EXISTS of `items` on `c`, over and over, until [`NeverZero::finish`],
/// keeping every answer of 0 (an `UNAVAILABLE` is allowed).
pub(crate) struct NeverZero {
    stop: Arc<AtomicBool>,
    wrong: Arc<Mutex<Vec<String>>>,
    thread: thread::JoinHandle<u64>,
}

impl NeverZero {
    pub(crate) fn start(mut c: redis::Connection, items: &[String]) -> NeverZero {
        let stop = Arc::new(AtomicBool::new(false));
        let wrong = Arc::new(Mutex::new(Vec::new()));
        let (s, w, items) = (stop.clone(), wrong.clone(), items.to_vec());
        let thread = thread::spawn(move || {
            let mut asked = 0u64;
            while !s.load(Ordering::Relaxed) {
                for item in &items {
                    asked += 1;
                    if exists(&mut c, "s", item) == Some(0) {
                        w.lock().unwrap().push(item.clone());
                    }
                }
            }
            asked
        });
        NeverZero {
            stop,
            wrong,
            thread,
        }
    }

    /// Stops the thread; fails if it never asked or saw a 0. Returns how many times it asked.
    pub(crate) fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let asked = self.thread.join().unwrap();
        let mut wrong = self.wrong.lock().unwrap().clone();
        assert!(asked > 0, "the checker never asked");
        let count = wrong.len();
        wrong.sort();
        wrong.dedup();
        assert!(
            wrong.is_empty(),
            "{count} of {asked} lookups of members of both histories answered 0, of these \
             items: {wrong:?}"
        );
        asked
    }
}

/// The module runs as a least-privilege role (it logs in and owns its database, nothing
/// more): what it reads to tell histories apart needs no privilege.
#[test]
fn a_failover_to_a_standby_that_was_behind_hides_no_member_and_forgets_lost_ones() {
    let mut pair = PgPair::start();
    let url = pair.least_privilege("app");
    let sync = SYNC_MS.to_string();
    let vk = start_loaded(&url, &[("member.sync-interval-ms", &sync)]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    let history = info_field(&mut c, "db_history").expect("INFO member db_history");
    assert!(history.starts_with("timeline 1 "), "db_history {history}");
    let mut p = pair.primary_db("app");

    // On both histories: acknowledged ADDs and outside rows, replayed by the standby.
    let both: Vec<String> = (0..40).map(|i| format!("both-{i}")).collect();
    add_or_insert(&mut c, &mut p, &both);
    pair.wait_caught_up();
    pair.stop_standby();

    // On the old history only: 20 acknowledged ADDs, 100 outside rows, each its own
    // transaction, and the node has seen them all (exact-match keys, marks, filter bits).
    let lost_adds: Vec<String> = (0..20).map(|i| format!("lost-add-{i}")).collect();
    let lost_rows: Vec<String> = (0..100).map(|i| format!("lost-row-{i}")).collect();
    for item in &lost_adds {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", item]), 1);
    }
    for item in &lost_rows {
        insert(&mut p, "s", item);
    }
    for item in lost_adds.iter().chain(&lost_rows) {
        assert!(
            wait_until(Duration::from_secs(20), || exists(&mut c, "s", item)
                == Some(1)),
            "{item} never answered 1 before the failover"
        );
        // Twice: the second is a cache hit, an exact-match key of the old history.
        assert_eq!(exists(&mut c, "s", item), Some(1));
    }
    let old_watermark = set_info(&mut c, "s", "sync_watermark_xid").unwrap();
    drop(p);

    // The checker: members of both histories, over and over, all through the failover.
    let checker = NeverZero::start(vk.conn(), &both);

    pair.fail_over();
    let promoted = Instant::now();
    let mut s = pair.standby_db("app");
    // New rows on the new primary, each its own transaction: their ids are ids the old
    // history had already used (below the node's old watermark).
    let fresh: Vec<String> = (0..30).map(|i| format!("new-row-{i}")).collect();
    for item in &fresh {
        insert(&mut s, "s", item);
    }

    // The node learns the new history within a sync interval of reaching the new primary.
    assert!(
        wait_until(Duration::from_secs(30), || {
            info_field(&mut c, "db_history_changes").as_deref() == Ok("1")
        }),
        "the node never saw the failover: db_history {:?}\n{}",
        info_field(&mut c, "db_history"),
        vk.log()
    );
    let learned = promoted.elapsed();
    let history = info_field(&mut c, "db_history").unwrap();
    assert!(history.starts_with("timeline 2 "), "db_history {history}");
    assert_ne!(info_field(&mut c, "db_history_changed_at").unwrap(), "0");
    assert!(
        vk.log().contains("another history"),
        "the log does not say what happened:\n{}",
        vk.log()
    );

    // Rows of the new primary: their transaction ids are ids the old history had already
    // used, below the watermark the node had; they answer 1 within the usual sync bound (the
    // node rebuilds from the new primary and follows it from there), and then never 0.
    let fresh_xid: i64 = s
        .query_one(
            "SELECT max(xmin::text::int8) FROM member_s WHERE entity_id LIKE 'new-row-%'",
            &[],
        )
        .unwrap()
        .get(0);
    let old: i64 = old_watermark.parse().unwrap();
    assert!(
        fresh_xid < old,
        "the test did not reuse the old history's ids (new rows up to xid {fresh_xid}, old \
         watermark {old}): it would not show the failover's hazard"
    );
    for item in &fresh {
        assert!(
            wait_until(Duration::from_secs(10), || exists(&mut c, "s", item)
                == Some(1)),
            "{item}, committed on the new primary, never answered 1 (explain {:?}, \
             filter_complete {:?})\n{}",
            explain(&mut c, "s", item),
            set_info(&mut c, "s", "filter_complete"),
            vk.log()
        );
    }
    // Lost members stop answering 1 within a few seconds of the node learning the new
    // history (at once, in fact: its next command or 100 ms tick; 5 s for a busy machine),
    // and stay 0.
    for item in lost_adds.iter().chain(&lost_rows) {
        assert!(
            wait_until(Duration::from_secs(5), || exists(&mut c, "s", item)
                == Some(0)),
            "{item}, lost in the promotion, still answers 1 (explain {:?})",
            explain(&mut c, "s", item)
        );
    }

    // Filters rebuild from the new primary and serve "absent" again, on the new history.
    assert!(
        wait_until(Duration::from_secs(30), || {
            set_info(&mut c, "s", "filter_serves_absent").as_deref() == Ok("1")
        }),
        "the filter was never rebuilt from the new primary"
    );
    assert_eq!(set_info(&mut c, "s", "filter_origin").unwrap(), "here");
    assert_ne!(
        set_info(&mut c, "s", "sync_watermark_xid").unwrap(),
        old_watermark,
        "the watermark is still the old history's"
    );
    all_answer(
        &mut c,
        lost_adds.iter().chain(&lost_rows),
        0,
        "after the rebuild",
    );
    for item in &fresh {
        if exists(&mut c, "s", item) != Some(1) {
            // What the next stop needs to find the cause (issue 49's note): how it was
            // decided, the row's id against the watermark, and whether a pass brings it back.
            let how = explain(&mut c, "s", item);
            let watermark = set_info(&mut c, "s", "sync_watermark_xid");
            let xid: i64 = s
                .query_one(
                    "SELECT xmin::text::int8 FROM member_s WHERE entity_id = $1",
                    &[item],
                )
                .unwrap()
                .get(0);
            thread::sleep(Duration::from_secs(2));
            panic!(
                "{item} (xid {xid}) answered {how:?} after the rebuild, watermark {watermark:?}; \
                 2 s later {:?}, watermark {:?}\n{}",
                exists(&mut c, "s", item),
                set_info(&mut c, "s", "sync_watermark_xid"),
                vk.log()
            );
        }
    }
    // An outside row written now reaches the rebuilt filter through the sync loop.
    insert(&mut s, "s", "after-rebuild");
    assert!(
        wait_until(Duration::from_secs(10), || {
            explain(&mut c, "s", "after-rebuild") == (1, "recent".into())
                || explain(&mut c, "s", "after-rebuild").0 == 1
        }),
        "an outside row of the new history never answered 1"
    );
    // And an ADD through the module lands on the new primary.
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "added-after"]), 1);
    assert_eq!(exists(&mut c, "s", "added-after"), Some(1));

    let asked = checker.finish();
    eprintln!(
        "failover: the node learned the new history {learned:?} after the promotion; the \
         checker asked {asked} times, none wrong"
    );
}

/// The same failover under a cluster of three primaries: every node reads the history on its
/// own connections and answers the change on its own (a cluster of the test's own, on the
/// pair: the shared clusters' database is the shared PostgreSQL, which no test fails over).
#[test]
fn in_a_cluster_every_node_sees_the_failover_on_its_own() {
    let mut pair = PgPair::start();
    let sync = SYNC_MS.to_string();
    let cl = Cluster::start_primaries_on(&pair.url(), &[("member.sync-interval-ms", &sync)]);
    cl.create_everywhere("s");
    cl.wait_ready("s");
    let mut c = cl.client();
    let mut p = pair.primary();
    let both: Vec<String> = (0..30).map(|i| format!("both-{i}")).collect();
    add_or_insert(&mut c, &mut p, &both);
    pair.wait_caught_up();
    pair.stop_standby();
    let lost: Vec<String> = (0..30).map(|i| format!("lost-{i}")).collect();
    add_or_insert(&mut c, &mut p, &lost);
    for item in &lost {
        assert!(
            wait_until(Duration::from_secs(20), || exists(&mut c, "s", item)
                == Some(1)),
            "{item} never answered 1 before the failover"
        );
        assert_eq!(exists(&mut c, "s", item), Some(1));
    }
    drop(p);

    pair.fail_over();
    let mut s = pair.standby();
    let fresh: Vec<String> = (0..30).map(|i| format!("new-{i}")).collect();
    for item in &fresh {
        insert(&mut s, "s", item);
    }
    // Every node learns the new history by itself: each runs its own sync passes.
    for n in cl.primaries() {
        let mut nc = n.conn();
        assert!(
            wait_until(Duration::from_secs(30), || {
                info_field(&mut nc, "db_history_changes").as_deref() == Ok("1")
            }),
            "{} never saw the failover: db_history {:?}",
            n.addr(),
            info_field(&mut nc, "db_history")
        );
        let history = info_field(&mut nc, "db_history").unwrap();
        assert!(
            history.starts_with("timeline 2 "),
            "{}: {history}",
            n.addr()
        );
    }
    all_answer(&mut c, &both, 1, "on both histories");
    for item in &lost {
        assert!(
            wait_until(Duration::from_secs(5), || exists(&mut c, "s", item)
                == Some(0)),
            "{item}, lost in the promotion, still answers 1"
        );
    }
    for item in &fresh {
        assert!(
            wait_until(Duration::from_secs(10), || exists(&mut c, "s", item)
                == Some(1)),
            "{item}, committed on the new primary, never answered 1"
        );
    }
    cl.wait_ready("s");
    all_answer(&mut c, &fresh, 1, "after the rebuilds");
    all_answer(&mut c, &lost, 0, "after the rebuilds");
}

/// A rebuild source (`member.pg-rebuild-url`) that follows another history than the primary
/// is refused: here a second standby of the old primary, which nobody re-pointed at the
/// promoted one. It never replays the new primary's history row, so the rebuild waits its
/// bound (10 s) for it and fails, saying why; the set keeps answering from the database.
#[test]
fn a_rebuild_source_on_another_history_is_refused() {
    let mut pair = PgPair::start();
    let other = pair.other_standby();
    let sync = SYNC_MS.to_string();
    let vk = start_loaded(&pair.url(), &[("member.sync-interval-ms", &sync)]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "a"]), 1);
    ok(
        &mut c,
        &["CONFIG", "SET", "member.pg-rebuild-url", &other.url()],
    );
    // Before the failover the second standby follows the primary's history: it serves.
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]), 1);
    assert_eq!(set_info(&mut c, "s", "last_rebuild").unwrap(), "ok");

    // `a` must survive the failover for the answer below to be 1: the clusters commit
    // asynchronously, so the standby promoted may not have it yet.
    pair.wait_caught_up();
    pair.fail_over();
    assert!(
        wait_until(Duration::from_secs(30), || {
            info_field(&mut c, "db_history_changes").as_deref() == Ok("1")
        }),
        "the node never saw the failover"
    );
    // The node rebuilds every filter after the change by itself (the sweep's "incomplete"
    // rebuild): that one fails, saying why.
    let mut last = String::new();
    assert!(
        wait_until(Duration::from_secs(40), || {
            last = set_info(&mut c, "s", "last_rebuild_error").unwrap_or_default();
            last.contains("another history")
        }),
        "a standby of the old history was not refused as such: last_rebuild_error {last:?}"
    );
    // The database answers meanwhile, and the primary rebuilds once the URL is emptied.
    assert_eq!(exists(&mut c, "s", "a"), Some(1));
    assert_eq!(exists(&mut c, "s", "never-added"), Some(0));
    ok(&mut c, &["CONFIG", "SET", "member.pg-rebuild-url", ""]);
    assert!(
        wait_until(Duration::from_secs(40), || {
            set_info(&mut c, "s", "filter_serves_absent").as_deref() == Ok("1")
        }),
        "never rebuilt from the primary: last_rebuild_error {:?}",
        set_info(&mut c, "s", "last_rebuild_error")
    );
}
