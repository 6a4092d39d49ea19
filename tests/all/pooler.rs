//! Behind pgbouncer with its stock configuration (docs/pooler.md), in session and in transaction
//! pooling: every command (from several clients at once, so every worker and several server
//! connections take part), the sync of an outside INSERT, change notification (heard through
//! session pooling; through transaction pooling it says it hears nothing and the interval
//! serves), a lookup stuck behind a lock answering within `member.db-timeout-ms` and its
//! statement cancelled in the database while the lock is still held, and statement pooling
//! refused with its reason.
use crate::support;

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use support::member::*;
use support::pgbouncer::{Mode, Pgbouncer};
use support::{module_path, wait_until, Valkey};

fn env(mode: Mode, extra: &[(&str, &str)]) -> Env {
    env_at(Pgbouncer::get(mode), extra)
}

fn env_at(pb: &Pgbouncer, extra: &[(&str, &str)]) -> Env {
    Env::through(|db| pb.url(db), extra)
}

/// The module's and the pooler's logs, for a failure message.
fn logs(e: &Env, mode: Mode) -> String {
    format!(
        "module:\n{}\npgbouncer:\n{}",
        e.vk.log(),
        Pgbouncer::get(mode).log()
    )
}

fn ints(c: &mut Connection, args: &[&str]) -> Vec<i64> {
    match cmd(c, args).unwrap_or_else(|e| panic!("{args:?}: {e}")) {
        Value::Array(v) => v
            .into_iter()
            .map(|x| match x {
                Value::Int(i) => i,
                other => panic!("{args:?}: {other:?}"),
            })
            .collect(),
        other => panic!("{args:?}: {other:?}"),
    }
}

fn every_command(mode: Mode) {
    let e = env(mode, &[("member.attach-allow", "public.app_users")]);
    every_command_on(&e, || Pgbouncer::get(mode).log());
    // Whatever the pooling mode, a stock pgbouncer refuses the startup options: the pooled way.
    assert_eq!(
        info_field(&mut e.conn(), "db_session").as_deref(),
        Ok("pooled")
    );
}

/// `every_command` on the node of `e`; `more` says more on a failure.
fn every_command_on(e: &Env, more: impl Fn() -> String) {
    let mut c = e.conn();
    let mut pg = e.pg();
    create_synced(&mut c, "s", &[]);
    // ADDs from four clients at once: every worker, several server connections.
    std::thread::scope(|s| {
        for t in 0..4 {
            let mut c = e.conn();
            s.spawn(move || {
                for i in 0..75 {
                    let item = format!("u{t}_{i}");
                    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", &item]), 1, "ADD {item}");
                }
            });
        }
    });
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "u0_1"]), 0);
    // With an expiry, written in as a timestamp behind a pooler.
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "t1", "TTL", "600"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "t1"]), 0);
    let left: f64 = pg
        .query_one(
            "SELECT EXTRACT(EPOCH FROM expires_at - now())::float8 FROM member_s
              WHERE entity_id = 't1'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!((590.0..=600.0).contains(&left), "{left}");
    let madd: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
    let mut args = vec!["MEMBER.MADD", "s", "ITEMS"];
    args.extend(madd.iter().map(String::as_str));
    assert_eq!(ints(&mut c, &args), vec![1; 100]);
    assert_eq!(
        ints(
            &mut c,
            &["MEMBER.MEXISTS", "s", "ITEMS", "u1_3", "m7", "nope"]
        ),
        vec![1, 1, 0]
    );
    assert_eq!(int(&mut c, &["MEMBER.DEL", "s", "u0_0"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "u0_0"]), 0);
    // Rows written outside, then a rebuild that counts every row: their lookups go to the
    // database (nothing cached, no recent-writes mark), from four clients at once.
    pg.batch_execute(
        "INSERT INTO member_s (entity_id) SELECT 'o' || g FROM generate_series(1, 100) g;
         INSERT INTO member_s (entity_id, scope) VALUES ('o1', 'sc'), ('o''2', 'sc')",
    )
    .unwrap();
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]), 502);
    // Scoped, and with a quote in the item.
    for item in ["o1", "o'2"] {
        let got: (i64, String) = redis::cmd("MEMBER.EXPLAIN")
            .arg("s")
            .arg(item)
            .arg("SCOPE")
            .arg("sc")
            .query(&mut c)
            .unwrap();
        assert_eq!(got, (1, "db-hit".into()), "{item}");
    }
    std::thread::scope(|s| {
        for t in 0..4 {
            let mut c = e.conn();
            s.spawn(move || {
                for i in (1 + t..=100).step_by(4) {
                    let item = format!("o{i}");
                    assert_eq!(explain(&mut c, "s", &item), (1, "db-hit".into()), "{item}");
                }
            });
        }
    });
    set_info(&mut c, "s", "filter_items").unwrap();
    ok(&mut c, &["MEMBER.ALTER", "s", "CACHE-TTL", "60"]);
    assert_eq!(set_info(&mut c, "s", "cache_ttl").unwrap(), "60");
    // An attached table.
    pg.batch_execute(
        "CREATE TABLE app_users (name text PRIMARY KEY);
         INSERT INTO app_users SELECT 'a' || g FROM generate_series(1, 50) g",
    )
    .unwrap();
    create_synced(
        &mut c,
        "att",
        &[
            "SOURCE",
            "public.app_users",
            "COLUMN",
            "name",
            "SYNC",
            "log",
        ],
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "att", "a7"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "att", "b7"]), 0);
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "att", "SYNC"]), 50);
    ok(&mut c, &["MEMBER.DROP", "att"]);
    ok(&mut c, &["MEMBER.DROP", "s", "DELETE-DATA"]);
    assert!(err(&mut c, &["MEMBER.EXISTS", "s", "u1_1"]).contains("no such set"));
    // Nothing of it failed on a statement another transaction had prepared.
    assert!(
        !e.vk.log().contains("does not exist"),
        "{}\n{}",
        e.vk.log(),
        more()
    );
}

#[test]
fn session_every_command() {
    every_command(Mode::Session);
}

#[test]
fn transaction_every_command() {
    every_command(Mode::Transaction);
}

fn outside_insert_is_synced(mode: Mode) {
    let e = env(mode, &[("member.sync-interval-ms", "200")]);
    let mut c = e.conn();
    create_synced(&mut c, "s", &[]);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "late"]), 0);
    e.pg()
        .batch_execute("INSERT INTO member_s (entity_id) VALUES ('late')")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || int(
            &mut c,
            &["MEMBER.EXISTS", "s", "late"]
        ) == 1),
        "the outside row never reached the filter:\n{}",
        logs(&e, mode)
    );
}

#[test]
fn session_outside_insert_is_synced() {
    outside_insert_is_synced(Mode::Session);
}

#[test]
fn transaction_outside_insert_is_synced() {
    outside_insert_is_synced(Mode::Transaction);
}

/// Through session pooling the listener hears, and an outside write is answered long before
/// the interval (a minute) would have found it.
#[test]
fn session_notify_is_heard() {
    let e = env(
        Mode::Session,
        &[
            ("member.sync-notify", "yes"),
            ("member.sync-interval-ms", "60000"),
        ],
    );
    let mut c = e.conn();
    assert!(
        wait_until(Duration::from_secs(20), || info_field(
            &mut c,
            "sync_notify"
        )
        .as_deref()
            == Ok("listening")),
        "the listener never listened: {:?}",
        info_field(&mut c, "sync_notify_error")
    );
    create_synced(&mut c, "s", &[]);
    e.pg()
        .batch_execute("INSERT INTO member_s (entity_id) VALUES ('told')")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || int(
            &mut c,
            &["MEMBER.EXISTS", "s", "told"]
        ) == 1),
        "a notified write was not answered within 5 s"
    );
}

/// Through transaction pooling the listener finds it hears nothing, says so, and the interval
/// brings outside writes.
#[test]
fn transaction_notify_falls_back_to_the_interval() {
    let e = env(
        Mode::Transaction,
        &[
            ("member.sync-notify", "yes"),
            ("member.sync-interval-ms", "300"),
        ],
    );
    let mut c = e.conn();
    assert!(
        wait_until(Duration::from_secs(20), || info_field(
            &mut c,
            "sync_notify"
        )
        .as_deref()
            == Ok("unheard")),
        "the listener never found it hears nothing: {:?}",
        info_field(&mut c, "sync_notify")
    );
    let why = info_field(&mut c, "sync_notify_error").unwrap_or_default();
    assert!(why.contains("never reached the listener"), "{why}");
    assert!(
        wait_until(Duration::from_secs(5), || e
            .vk
            .log()
            .contains("never reached the listener")),
        "not logged:\n{}",
        e.vk.log()
    );
    create_synced(&mut c, "s", &[]);
    e.pg()
        .batch_execute("INSERT INTO member_s (entity_id) VALUES ('polled')")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || int(
            &mut c,
            &["MEMBER.EXISTS", "s", "polled"]
        ) == 1),
        "the interval never brought the outside write"
    );
}

/// Backends of this database running the lookup statement.
fn lookups_running(pg: &mut postgres::Client) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()
            AND state = 'active' AND query LIKE '%FROM member_s m%'",
        &[],
    )
    .unwrap()
    .get(0)
}

fn stuck_lookup(mode: Mode) {
    stuck_lookup_at(Pgbouncer::get(mode));
}

fn stuck_lookup_at(pb: &Pgbouncer) {
    let e = env_at(pb, &[]);
    let mut c = e.conn();
    create_synced(&mut c, "s", &[]);
    let mut pg = e.pg();
    pg.batch_execute("INSERT INTO member_s (entity_id) VALUES ('k1'), ('k2')")
        .unwrap();
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "s", "SYNC"]), 2);
    // A lookup's statement timeout: the client's, 300 ms, set only now (timeouts follow
    // CONFIG SET): the CREATE above, through pgbouncer on a busy machine, may take longer.
    ok(&mut c, &["CONFIG", "SET", "member.db-timeout-ms", "300"]);
    let mut locker = e.pg();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_s IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let t = Instant::now();
    let answer = err(&mut c, &["MEMBER.EXISTS", "s", "k1"]);
    let took = t.elapsed();
    assert!(answer.starts_with("UNAVAILABLE"), "{answer}");
    assert!(
        took < Duration::from_millis(1500),
        "the stuck lookup answered after {took:?}"
    );
    // The statement waits in the database until its statement timeout, then is gone though
    // the lock is still held.
    let mut watcher = e.pg();
    assert!(
        wait_until(Duration::from_secs(5), || lookups_running(&mut watcher)
            == 0),
        "the stuck lookup's statement still waits in the database:\nmodule:\n{}\npgbouncer:\n{}",
        e.vk.log(),
        pb.log()
    );
    let held: i64 = watcher
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE mode = 'AccessExclusiveLock' AND granted
                AND relation = 'member_s'::regclass",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(held, 1, "the lock was let go before the statement went");
    locker.batch_execute("COMMIT").unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || cmd(
            &mut c,
            &["MEMBER.EXISTS", "s", "k2"]
        )
        .is_ok_and(|v| v == Value::Int(1))),
        "lookups did not come back after the lock"
    );
}

#[test]
fn session_stuck_lookup_is_bounded() {
    stuck_lookup(Mode::Session);
}

#[test]
fn transaction_stuck_lookup_is_bounded() {
    stuck_lookup(Mode::Transaction);
}

/// Statement pooling allows no transaction: the node says why it cannot use the link.
#[test]
fn statement_pooling_is_refused() {
    let db = support::fresh_db();
    let url = Pgbouncer::get(Mode::Statement).url(&db.name);
    let vk = Valkey::start_module(&module_path(), &[("member.pg-url", url.as_str())]);
    let mut c = vk.conn();
    assert!(
        wait_until(Duration::from_secs(20), || info_field(
            &mut c,
            "db_link_error"
        )
        .is_ok_and(|e| e.contains("statement pooling mode"))),
        "no refusal: {:?}\n{}",
        info_field(&mut c, "db_link_error"),
        vk.log()
    );
    let answer = err(&mut c, &["MEMBER.CREATE", "s"]);
    assert!(answer.starts_with("UNAVAILABLE"), "{answer}");
}

/// A pgbouncer that drops the startup options (the timeouts with them) is found out: the
/// node works the pooled way there, and its timeouts hold.
#[test]
fn dropped_startup_options_are_detected() {
    stuck_lookup_at(Pgbouncer::ignoring_options());
}

/// `member.pg-pooler yes` on a direct connection: the pooled way works there too.
#[test]
fn pooled_way_on_a_direct_connection() {
    let e = Env::with(&[
        ("member.pg-pooler", "yes"),
        ("member.attach-allow", "public.app_users"),
    ]);
    every_command_on(&e, String::new);
    assert_eq!(
        info_field(&mut e.conn(), "db_session").as_deref(),
        Ok("pooled")
    );
}

/// A direct connection says so, and a pooled one (above) says that.
#[test]
fn a_direct_connection_shows_as_direct() {
    let e = Env::with(&[]);
    let mut c = e.conn();
    create_synced(&mut c, "s", &[]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "x"]), 1);
    assert_eq!(info_field(&mut c, "db_session").as_deref(), Ok("direct"));
}

/// `member.pg-pooler no` through a stock pgbouncer: the startup options are refused, and
/// the node says so; back to `auto`, it works.
#[test]
fn direct_way_forced_through_a_pooler_is_refused() {
    let e = env(Mode::Transaction, &[]);
    let mut c = e.conn();
    // The catalog loaded through `auto` at start-up; from now on `no`.
    ok(&mut c, &["CONFIG", "SET", "member.pg-pooler", "no"]);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let _ = cmd(&mut c, &["MEMBER.CREATE", "s"]);
            info_field(&mut c, "db_link_error")
                .is_ok_and(|e| e.contains("unsupported startup parameter"))
        }),
        "{:?}",
        info_field(&mut c, "db_link_error")
    );
    ok(&mut c, &["CONFIG", "SET", "member.pg-pooler", "auto"]);
    create_synced(&mut c, "s", &[]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "x"]), 1);
}
