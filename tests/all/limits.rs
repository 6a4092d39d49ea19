//! Bounded resources (issue 9): each limit refuses with an error that names it, changes
//! nothing, and shows its use in `INFO member`.
use crate::support;

use std::thread;
use std::time::Duration;

use redis::Value;
use support::member::*;
use support::wait_until;
use support::OwnPg;

fn config_set(c: &mut redis::Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(c)
        .unwrap();
}

#[test]
fn clients_waiting_on_the_database_are_bounded() {
    let env = Env::with(&[
        ("member.max-blocked-clients", "1"),
        ("member.db-timeout-ms", "5000"),
    ]);
    let mut c = env.conn();
    assert_eq!(cmd(&mut c, &["MEMBER.CREATE", "s"]).unwrap(), Value::Okay);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "a"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "b"]), 1);
    // Hold the table so that a lookup needing the database waits.
    let mut pg = env.pg();
    let mut tx = pg.transaction().unwrap();
    tx.batch_execute("LOCK TABLE member_s IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let waiter = {
        let mut w = env.conn();
        thread::spawn(move || int(&mut w, &["MEMBER.EXISTS", "s", "a"]))
    };
    assert!(
        wait_until(Duration::from_secs(5), || info_field(
            &mut c,
            "blocked_clients"
        )
        .as_deref()
            == Ok("1")),
        "the first lookup never waited"
    );
    let e = err(&mut c, &["MEMBER.EXISTS", "s", "b"]);
    assert_eq!(
        e,
        "UNAVAILABLE 1 clients already wait on the database (member.max-blocked-clients)"
    );
    // Answers that need no database are not limited.
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "never-added"]), 0);
    tx.rollback().unwrap();
    assert_eq!(waiter.join().unwrap(), 1);
    assert_eq!(info_field(&mut c, "blocked_clients").as_deref(), Ok("0"));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "b"]), 1);
}

#[test]
fn sets_created_on_a_node_are_bounded() {
    let env = Env::new();
    let mut c = env.conn();
    config_set(&mut c, "member.max-sets", "2");
    assert_eq!(info_field(&mut c, "max_sets").as_deref(), Ok("2"));
    assert_eq!(cmd(&mut c, &["MEMBER.CREATE", "a"]).unwrap(), Value::Okay);
    assert_eq!(cmd(&mut c, &["MEMBER.CREATE", "b"]).unwrap(), Value::Okay);
    assert_eq!(
        err(&mut c, &["MEMBER.CREATE", "c"]),
        "ERR this node already holds 2 sets (member.max-sets 2)"
    );
    // An existing set is not a new one.
    assert_eq!(cmd(&mut c, &["MEMBER.CREATE", "a"]).unwrap(), Value::Okay);
    let rows: i64 = env
        .pg()
        .query_one("SELECT count(*) FROM member_catalog WHERE name = 'c'", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
}

#[test]
fn a_filter_that_would_pass_maxmemory_is_refused_before_anything_is_written() {
    let env = Env::new();
    let mut c = env.conn();
    config_set(&mut c, "maxmemory", "64mb");
    // 100 000 000 members at 1 %: 120 MB.
    let e = err(&mut c, &["MEMBER.CREATE", "big", "CAPACITY", "100000000"]);
    assert!(
        e.starts_with("ERR the filter would need 119813") && e.contains("left under maxmemory"),
        "{e}"
    );
    assert!(err(&mut c, &["MEMBER.INFO", "big"]).contains("no such set"));
    let tables: i64 = env
        .pg()
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'member_big'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(tables, 0);
    let budget: u64 = info_field(&mut c, "memory_budget")
        .unwrap()
        .parse()
        .unwrap();
    assert!(budget < 64 << 20, "memory_budget {budget}");
    // A small set still fits.
    assert_eq!(
        cmd(&mut c, &["MEMBER.CREATE", "small", "CAPACITY", "1000"]).unwrap(),
        Value::Okay
    );
    // Repeating the CREATE of a set that exists (an application's start-up) allocates
    // nothing, so it is not refused, even when the defaults it does not override would not
    // fit; a new set with those defaults is.
    config_set(&mut c, "member.default-capacity", "100000000");
    let again = cmd(&mut c, &["MEMBER.CREATE", "small"]).unwrap();
    assert_eq!(again, Value::Okay);
    let e = err(&mut c, &["MEMBER.CREATE", "other"]);
    assert!(e.contains("left under maxmemory"), "{e}");
    // A set this node still knows but the catalog no longer has (dropped elsewhere, not yet
    // re-read here) is a new row: checked like any new set, nothing written.
    let mut pg = env.pg();
    pg.execute("DELETE FROM member_catalog WHERE name = 'small'", &[])
        .unwrap();
    let e = err(&mut c, &["MEMBER.CREATE", "small"]);
    assert!(e.contains("left under maxmemory"), "{e}");
    let rows: i64 = pg
        .query_one(
            "SELECT count(*) FROM member_catalog WHERE name = 'small'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
}

/// The advisory lock under which a rebuild gives a set table what it lacks of its slot column
/// and index (`db::keyslot::ensure_slot_column`), held by `pg`'s session.
fn hold_slot_column_lock(pg: &mut postgres::Client, set: &str, hold: bool) {
    let f = if hold {
        "pg_advisory_lock"
    } else {
        "pg_advisory_unlock"
    };
    pg.execute(
        &format!("SELECT {f}(hashtextextended('libmember slot column ' || $1, 0))"),
        &[&format!("member_{set}")],
    )
    .unwrap();
}

#[test]
fn a_rebuild_whose_journal_overflows_is_abandoned_and_the_old_filter_serves() {
    // A PostgreSQL of its own: the advisory lock held below and the rows stay out of the
    // other tests' way.
    let own = OwnPg::start_new();
    // A generous database timeout: the ADDs share a busy machine with the rebuild.
    let vk = start_loaded(
        &own.url(),
        &[
            ("member.max-journal", "10"),
            ("member.db-timeout-ms", "20000"),
        ],
    );
    let mut c = vk.conn();
    let mut pg = own.client();
    assert_eq!(
        cmd(
            &mut c,
            &["MEMBER.CREATE", "s", "RECENT-TTL", "1", "CACHE-TTL", "1"]
        )
        .unwrap(),
        Value::Okay
    );
    pg.execute(
        "INSERT INTO member_s (entity_id) SELECT 'bulk-'||g FROM generate_series(1, 10000) g",
        &[],
    )
    .unwrap();
    // The rebuild is held where it starts, deterministically: its table lacks the slot index,
    // which the rebuild first makes under a per-table advisory lock that this test holds
    // while the 50 ADDs commit (the table itself is not locked: they go through).
    pg.batch_execute("DROP INDEX member_s_slot").unwrap();
    let mut holder = own.client();
    hold_slot_column_lock(&mut holder, "s", true);
    ok(&mut c, &["MEMBER.REBUILD", "s"]);
    assert!(
        wait_until(Duration::from_secs(60), || pg
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 1),
        "the rebuild never waited for the slot column's lock"
    );
    let items: Vec<String> = (0..50).map(|i| format!("raced-{i}")).collect();
    for i in &items {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", i]), 1, "{i}");
    }
    hold_slot_column_lock(&mut holder, "s", false);
    assert!(
        wait_until(Duration::from_secs(180), || set_info(
            &mut c,
            "s",
            "rebuild_state"
        )
        .as_deref()
            == Ok("idle")),
        "the rebuild never ended"
    );
    let why = set_info(&mut c, "s", "last_rebuild_error").unwrap();
    assert!(why.contains("member.max-journal (10)"), "{why}");
    thread::sleep(Duration::from_millis(1500));
    for i in &items {
        let (answer, path) = explain(&mut c, "s", i);
        assert_eq!(answer, 1, "{i}: {path}");
    }
}

#[test]
fn a_rebuild_whose_payload_would_pass_maxmemory_fails_and_the_old_filter_serves() {
    let env = Env::with(&[("member.auto-grow", "no")]);
    let mut c = env.conn();
    // A filter of about 2.4 MB, and two members in it.
    assert_eq!(
        cmd(&mut c, &["MEMBER.CREATE", "p", "CAPACITY", "2000000"]).unwrap(),
        Value::Okay
    );
    assert_eq!(int(&mut c, &["MEMBER.ADD", "p", "kept-1"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "p", "kept-2"]), 1);
    let bytes: i64 = set_info(&mut c, "p", "filter_bytes")
        .unwrap()
        .parse()
        .unwrap();
    let waits = info_number(&mut c, "member", "member_memory_waits");
    // Room for the new filter (checked before it is allocated), not for its payload as well
    // (the serialized form and its copy: twice the filter).
    config_set(&mut c, "maxmemory-policy", "volatile-lru");
    let used = info_number(&mut c, "memory", "used_memory");
    config_set(&mut c, "maxmemory", &(used + bytes * 3 / 2).to_string());
    assert!(
        wait_until(Duration::from_secs(10), || info_field(
            &mut c,
            "memory_budget"
        )
        .is_ok_and(|b| b.parse::<i64>().is_ok_and(|b| b < 2 * bytes))),
        "the module never measured the new headroom"
    );
    let e = err(&mut c, &["MEMBER.REBUILD", "p", "SYNC"]);
    assert!(
        e.starts_with("ERR not enough memory left under maxmemory"),
        "{e}"
    );
    assert_eq!(
        set_info(&mut c, "p", "last_rebuild").as_deref(),
        Ok("failed")
    );
    let why = set_info(&mut c, "p", "last_rebuild_error").unwrap();
    assert!(why.contains("maxmemory"), "{why}");
    assert!(info_number(&mut c, "member", "member_memory_waits") > waits);
    // The old filter still answers from memory: its members, and "absent" for the rest.
    for i in ["kept-1", "kept-2"] {
        assert_eq!(explain(&mut c, "p", i).0, 1, "{i}");
    }
    assert_eq!(
        explain(&mut c, "p", "never-added"),
        (0, "bloom-negative".into())
    );
    assert_eq!(info_number(&mut c, "stats", "evicted_keys"), 0);
    // With room again the same rebuild succeeds, and gives its payload's bytes back.
    config_set(&mut c, "maxmemory", "0");
    assert!(wait_until(Duration::from_secs(10), || info_field(
        &mut c,
        "memory_budget"
    )
    .as_deref()
        == Ok("unlimited")));
    assert_eq!(int(&mut c, &["MEMBER.REBUILD", "p", "SYNC"]), 2);
    assert!(
        wait_until(Duration::from_secs(10), || set_info(
            &mut c,
            "p",
            "transient_bytes"
        )
        .as_deref()
            == Ok("0")),
        "the payload's bytes were never given back"
    );
    // The new filter and its payload were counted at once (the payload is the filter's bits
    // and a header of a few hundred bytes; `filter_bytes` also counts the value's struct).
    assert!(info_number(&mut c, "member", "member_transient_peak_bytes") >= 2 * bytes - 4096);
}

/// Each client that waits on the database has a timeout timer of `member.db-timeout-ms`. Once
/// the client is answered its timer is stopped: left to fire a timeout later, such timers pile
/// up at the rate of the calls (each firing costs the server a context, and while one is due
/// the server's next timer tick is not brought forward for a timer meant to fire at once).
#[test]
fn timeouts_of_answered_clients_are_stopped_not_left_to_fire() {
    let env = Env::with(&[("member.db-timeout-ms", "60000")]);
    let mut c = env.conn();
    assert_eq!(cmd(&mut c, &["MEMBER.CREATE", "s"]).unwrap(), Value::Okay);
    for i in 0..200 {
        // Each ADD waits on the database for its insert.
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", &format!("item-{i}")]), 1);
    }
    // A few lookups that wait too (never added: the filter says so without waiting; added
    // ones past their recent mark go to the cache, or the database if not yet cached).
    for i in 0..20 {
        assert_eq!(
            int(&mut c, &["MEMBER.EXISTS", "s", &format!("item-{i}")]),
            1
        );
    }
    assert_eq!(info_field(&mut c, "blocked_clients").as_deref(), Ok("0"));
    // Every one of those clients got its reply after its timer was stopped.
    assert_eq!(info_field(&mut c, "timers_waiting").as_deref(), Ok("0"));
}
