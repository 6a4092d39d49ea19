//! Change notification (`member.sync-notify`, docs/sync.md): with a sync interval of a minute,
//! an outside write is answered within a couple of seconds only because the listener woke the
//! loop; without it, the interval decides. The listener survives a PostgreSQL restart, and
//! exists only while the config asks for it.
use crate::support;

use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;
use support::member::*;
use support::{wait_until, OwnPg};

/// Far longer than any wait below: only a notification can make a pass happen in time.
const LONG_INTERVAL: [(&str, &str); 1] = [("member.sync-interval-ms", "60000")];
/// How soon after its commit a notified write must be answered 1 (it takes milliseconds; the
/// rest is slack for a busy test machine).
const NOTIFIED: Duration = Duration::from_secs(2);

fn with_notify(on: bool) -> Vec<(&'static str, &'static str)> {
    let mut v = LONG_INTERVAL.to_vec();
    v.push(("member.sync-notify", if on { "yes" } else { "no" }));
    v
}

/// Polls EXISTS until it answers `want` or `timeout` passes; the time it took.
fn until_answer(
    c: &mut Connection,
    set: &str,
    item: &str,
    want: i64,
    timeout: Duration,
) -> Option<Duration> {
    let t = Instant::now();
    wait_until(timeout, || int(c, &["MEMBER.EXISTS", set, item]) == want).then(|| t.elapsed())
}

fn outside(pg: &mut postgres::Client, sql: &str) {
    pg.batch_execute(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Backends holding the listener's connection in the current database.
fn listeners(pg: &mut postgres::Client) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_stat_activity
          WHERE application_name = 'libmember-listen' AND datname = current_database()",
        &[],
    )
    .unwrap()
    .get(0)
}

/// A session of the test's own LISTENing on the module's channel: it sees every notification
/// the module's listener can, in commit order.
struct Watch(postgres::Client);

impl Watch {
    fn new(env: &Env) -> Watch {
        let mut client = env.pg();
        client.batch_execute("LISTEN member_changes").unwrap();
        Watch(client)
    }

    /// Sends a fence notification from `pg` (a transaction of its own, so it is delivered after
    /// everything committed before it) and returns how many notifications arrived before it.
    fn count_until_fence(&mut self, pg: &mut postgres::Client) -> usize {
        use postgres::fallible_iterator::FallibleIterator;
        pg.batch_execute("NOTIFY member_changes, 'fence'").unwrap();
        let mut notifications = self.0.notifications();
        let mut arrived = notifications.timeout_iter(Duration::from_secs(10));
        let mut before = 0;
        loop {
            match arrived.next() {
                Ok(Some(n)) if n.payload() == "fence" => return before,
                Ok(Some(_)) => before += 1,
                Ok(None) => panic!("the fence notification never arrived"),
                Err(e) => panic!("LISTEN member_changes: {e}"),
            }
        }
    }
}

/// Waits until the module's listener has counted `want` notifications (the fence's own
/// among them, delivered last), and checks it is not more.
fn received_exactly(c: &mut Connection, want: i64) {
    let mut got = 0;
    assert!(
        wait_until(Duration::from_secs(10), || {
            got = number(c, "sync_notify_received");
            got >= want
        }),
        "the module's listener counted {got} notifications, not {want}"
    );
    assert_eq!(got, want, "notifications counted by the module");
}

fn number(c: &mut Connection, field: &str) -> i64 {
    let v = info_field(c, field).unwrap();
    v.parse()
        .unwrap_or_else(|e| panic!("INFO member {field} {v:?}: {e}"))
}

#[test]
fn an_outside_insert_is_answered_within_milliseconds() {
    let env = Env::with(&with_notify(true));
    let mut c = env.conn();
    create_synced(&mut c, "fast", &[]);
    assert!(
        wait_listening(&mut c, Duration::from_secs(10)),
        "listener state {:?}, error {:?}",
        info_field(&mut c, "sync_notify"),
        info_field(&mut c, "sync_notify_error")
    );
    let mut pg = env.pg();
    let mut watch = Watch::new(&env);
    let (received, woken) = (
        number(&mut c, "sync_notify_received"),
        number(&mut c, "sync_notify_passes"),
    );
    outside(
        &mut pg,
        "INSERT INTO member_fast (entity_id) VALUES ('outsider')",
    );
    let took = until_answer(&mut c, "fast", "outsider", 1, Duration::from_secs(10));
    assert!(
        took.is_some_and(|t| t <= NOTIFIED),
        "an outside insert was answered 1 after {took:?} (bound {NOTIFIED:?}); INFO: {:?} {:?}",
        info_field(&mut c, "sync_notify"),
        info_field(&mut c, "sync_notify_error"),
    );
    assert!(number(&mut c, "sync_notify_received") > received);
    assert!(number(&mut c, "sync_notify_passes") > woken);
    // The filter holds it (the pass applied it), and the set is not blind: the extra trigger
    // does not confuse the count of log triggers.
    assert_ne!(explain(&mut c, "fast", "outsider").1, "bloom-negative");
    assert_eq!(
        set_info(&mut c, "fast", "sync_horizon").as_deref(),
        Ok("visible")
    );

    // That INSERT sent one notification, and the module counted it (and the fence behind it).
    assert_eq!(
        watch.count_until_fence(&mut pg),
        1,
        "notifications of one INSERT"
    );
    received_exactly(&mut c, received + 2);

    // A bulk insert of many rows in one transaction of several statements: one notification.
    let before = received + 2;
    outside(
        &mut pg,
        "BEGIN;
         INSERT INTO member_fast (entity_id) SELECT 'bulk-' || i FROM generate_series(1, 500) i;
         INSERT INTO member_fast (entity_id) VALUES ('bulk-last');
         COMMIT",
    );
    assert!(until_answer(&mut c, "fast", "bulk-last", 1, NOTIFIED).is_some());
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "fast", "bulk-250"]), 1);
    assert_eq!(
        watch.count_until_fence(&mut pg),
        1,
        "notifications of the bulk insert"
    );
    received_exactly(&mut c, before + 2);

    // Writes through the module notify nobody: they are in this node's filter already.
    let before = before + 2;
    for i in 0..5 {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "fast", &format!("own-{i}")]), 1);
    }
    assert_eq!(
        watch.count_until_fence(&mut pg),
        0,
        "notifications of the module's ADDs"
    );
    received_exactly(&mut c, before + 1);
}

#[test]
fn without_notify_the_interval_decides_and_no_one_listens() {
    let env = Env::with(&with_notify(false));
    let mut c = env.conn();
    create_synced(&mut c, "slow", &[]);
    let mut pg = env.pg();
    assert_eq!(info_field(&mut c, "sync_notify").as_deref(), Ok("off"));
    assert_eq!(listeners(&mut pg), 0, "a listener without sync-notify");
    outside(
        &mut pg,
        "INSERT INTO member_slow (entity_id) VALUES ('outsider')",
    );
    // The proof that the other test measures the notification: here nothing wakes the loop.
    assert_eq!(
        until_answer(&mut c, "slow", "outsider", 1, Duration::from_secs(3)),
        None,
        "answered 1 with notification off and a 60 s interval"
    );

    // Turned on at run time: the listener connects, installs its trigger on the existing
    // table, and its first pass catches the write up.
    ok(&mut c, &["CONFIG", "SET", "member.sync-notify", "yes"]);
    assert!(wait_listening(&mut c, Duration::from_secs(10)));
    assert_eq!(listeners(&mut pg), 1);
    assert!(until_answer(&mut c, "slow", "outsider", 1, NOTIFIED).is_some());
    outside(
        &mut pg,
        "INSERT INTO member_slow (entity_id) VALUES ('second')",
    );
    assert!(until_answer(&mut c, "slow", "second", 1, NOTIFIED).is_some());

    // Off again: the connection goes away.
    ok(&mut c, &["CONFIG", "SET", "member.sync-notify", "no"]);
    assert!(
        wait_until(Duration::from_secs(5), || listeners(&mut pg) == 0),
        "the listener stayed connected after sync-notify no"
    );
    // The thread says so once its connection is closed.
    assert!(
        wait_until(Duration::from_secs(5), || info_field(&mut c, "sync_notify")
            .as_deref()
            == Ok("off")),
        "sync_notify: {:?}",
        info_field(&mut c, "sync_notify")
    );
}

/// An outside DELETE: EXISTS answers 0 once no exact-match key says 1 — at once for an item
/// never looked up, after the set's CACHE-TTL for one a lookup cached (the sync loop applies
/// only keys left alive; see docs/sync.md).
#[test]
fn an_outside_delete_is_answered_0_after_the_cache_ttl() {
    let env = Env::with(&with_notify(true));
    let mut c = env.conn();
    create_synced(&mut c, "gone", &["CACHE-TTL", "1"]);
    assert!(wait_listening(&mut c, Duration::from_secs(10)));
    let mut pg = env.pg();
    outside(
        &mut pg,
        "INSERT INTO member_gone (entity_id) VALUES ('cached'), ('uncached')",
    );
    assert!(until_answer(&mut c, "gone", "cached", 1, NOTIFIED).is_some());
    assert_eq!(explain(&mut c, "gone", "cached"), (1, "cache-hit".into()));
    outside(
        &mut pg,
        "DELETE FROM member_gone WHERE entity_id IN ('cached', 'uncached')",
    );
    assert_eq!(explain(&mut c, "gone", "uncached"), (0, "db-miss".into()));
    let took = until_answer(&mut c, "gone", "cached", 0, Duration::from_secs(5));
    assert!(
        took.is_some_and(|t| t <= Duration::from_millis(2500)),
        "a deleted, cached member was answered 0 after {took:?} (CACHE-TTL 1 s)"
    );
}

#[test]
fn the_listener_reconnects_after_a_postgres_restart() {
    let mut own = OwnPg::start_new();
    let vk = start_loaded(&own.url(), &with_notify(true));
    let mut c = vk.conn();
    create_synced(&mut c, "again", &[]);
    assert!(wait_listening(&mut c, Duration::from_secs(10)));
    let connects = number(&mut c, "sync_notify_connects");

    own.stop();
    assert!(
        wait_until(Duration::from_secs(10), || info_field(
            &mut c,
            "sync_notify"
        )
        .as_deref()
            == Ok("reconnecting")),
        "the listener did not notice the restart: {:?}",
        info_field(&mut c, "sync_notify")
    );
    thread::sleep(Duration::from_secs(1));
    own.start();
    assert!(
        wait_listening(&mut c, Duration::from_secs(20)),
        "no reconnection: {:?} {:?}\n{}",
        info_field(&mut c, "sync_notify"),
        info_field(&mut c, "sync_notify_error"),
        vk.log()
    );
    assert!(number(&mut c, "sync_notify_connects") > connects);

    // Notifications work again (not only the pass the reconnection itself wakes).
    thread::sleep(Duration::from_millis(300));
    let received = number(&mut c, "sync_notify_received");
    let mut pg = own.client();
    outside(
        &mut pg,
        "INSERT INTO member_again (entity_id) VALUES ('after-restart')",
    );
    let took = until_answer(&mut c, "again", "after-restart", 1, Duration::from_secs(10));
    assert!(
        took.is_some_and(|t| t <= NOTIFIED),
        "answered after {took:?} (bound {NOTIFIED:?})"
    );
    assert!(number(&mut c, "sync_notify_received") > received);
}

/// An attached `SYNC log` set is notified too: its source table gets a notification trigger of
/// its own (`member_<set>$ntf`), so an outside INSERT into the application's table is answered
/// 1 within milliseconds although the interval is a minute. MEMBER.DROP removes the trigger
/// with the set's change-log triggers.
#[test]
fn an_outside_insert_into_an_attached_table_is_answered_within_milliseconds() {
    let mut cfg = with_notify(true);
    cfg.push(("member.attach-allow", "public.signups"));
    let env = Env::with(&cfg);
    let mut pg = env.pg();
    outside(
        &mut pg,
        "CREATE TABLE public.signups (name text PRIMARY KEY);
         INSERT INTO public.signups VALUES ('first')",
    );
    let mut c = env.conn();
    create_synced(
        &mut c,
        "signups",
        &["SOURCE", "public.signups", "COLUMN", "name", "SYNC", "log"],
    );
    assert!(
        wait_listening(&mut c, Duration::from_secs(10)),
        "listener state {:?}, error {:?}",
        info_field(&mut c, "sync_notify"),
        info_field(&mut c, "sync_notify_error")
    );
    let triggers = |pg: &mut postgres::Client| -> i64 {
        pg.query_one(
            "SELECT count(*) FROM pg_trigger
              WHERE tgrelid = 'public.signups'::regclass AND tgname = 'member_signups$ntf'",
            &[],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(
        triggers(&mut pg),
        1,
        "no notification trigger on the source"
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "signups", "first"]), 1);

    // From each INSERT's commit to EXISTS answering 1 (polled every 20 ms).
    let mut took = Vec::new();
    for i in 0..15 {
        let name = format!("outsider-{i}");
        outside(
            &mut pg,
            &format!("INSERT INTO public.signups VALUES ('{name}')"),
        );
        let t = until_answer(&mut c, "signups", &name, 1, Duration::from_secs(10));
        assert!(
            t.is_some_and(|t| t <= NOTIFIED),
            "an outside insert into the source was answered 1 after {t:?} (bound {NOTIFIED:?}); \
             INFO: {:?} {:?}",
            info_field(&mut c, "sync_notify"),
            info_field(&mut c, "sync_notify_error"),
        );
        took.extend(t);
    }
    took.sort();
    eprintln!(
        "attached set, outside INSERT commit to EXISTS 1: median {:?}, max {:?}",
        took[took.len() / 2],
        took[took.len() - 1]
    );
    // The filter holds them (the pass applied them), and the source is still a source: its
    // new trigger does not make it look like one of the module's own tables.
    assert_ne!(explain(&mut c, "signups", "outsider-3").1, "bloom-negative");
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "signups", "SYNC"]), 16);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "signups", "outsider-3"]), 1);

    ok(&mut c, &["MEMBER.DROP", "signups"]);
    assert_eq!(
        triggers(&mut pg),
        0,
        "the notification trigger outlived its set"
    );
}

/// An attached set made while no node asked for notification gets its source's trigger from the
/// listener once one does (the listener installs what is missing when it connects).
#[test]
fn the_listener_gives_an_attached_set_made_before_it_its_trigger() {
    let mut cfg = with_notify(false);
    cfg.push(("member.attach-allow", "public.later"));
    let env = Env::with(&cfg);
    let mut pg = env.pg();
    outside(&mut pg, "CREATE TABLE public.later (name text PRIMARY KEY)");
    let mut c = env.conn();
    create_synced(
        &mut c,
        "later",
        &["SOURCE", "public.later", "COLUMN", "name", "SYNC", "log"],
    );
    let has_trigger = |pg: &mut postgres::Client| -> bool {
        pg.query_one(
            "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'public.later'::regclass
                              AND tgname = 'member_later$ntf')",
            &[],
        )
        .unwrap()
        .get(0)
    };
    assert!(
        !has_trigger(&mut pg),
        "a notification trigger nobody asked for"
    );
    ok(&mut c, &["CONFIG", "SET", "member.sync-notify", "yes"]);
    assert!(
        wait_listening(&mut c, Duration::from_secs(10)),
        "listener state {:?}, error {:?}",
        info_field(&mut c, "sync_notify"),
        info_field(&mut c, "sync_notify_error")
    );
    assert!(has_trigger(&mut pg));
    outside(&mut pg, "INSERT INTO public.later VALUES ('late')");
    assert!(until_answer(&mut c, "later", "late", 1, NOTIFIED).is_some());
}
