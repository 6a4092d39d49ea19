//! Fault injection against a real PostgreSQL: the database stopped, slowed down by a lock held
//! from another session, down at start-up, or configured wrong. The contract under test
//! (README "The correctness contract"): items the filter rejects are still answered; every other
//! lookup and every write gets an error starting with `UNAVAILABLE` within the timeout — never a
//! 0 or 1 in its place, never a hang — the module recovers by itself, and a write that commits
//! after its client gave up still reaches the filter.
mod support;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use support::member::*;
use support::{free_port, start_with, wait_until, OwnPg, Valkey};

/// `member.db-timeout-ms` for every test here. The module's statement timeout is then
/// 4 × 500 ms = 2 s: a write stuck on a lock still lands if the lock goes within 2 s.
const DB_TIMEOUT_MS: u64 = 500;
const FAST: [(&str, &str); 1] = [("member.db-timeout-ms", "500")];

/// Upper bound for any error reply: the timeout plus generous slack. Not a performance
/// assertion, only "no hang".
fn no_hang() -> Duration {
    Duration::from_millis(DB_TIMEOUT_MS) + Duration::from_secs(2)
}

/// The error text ("CODE detail") of a redis error.
fn error_text(e: &redis::RedisError) -> String {
    format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
        .trim()
        .to_string()
}

/// Runs a call that must fail with `UNAVAILABLE ...` within [`no_hang`]; returns the text.
fn unavailable(vk: &Valkey, c: &mut Connection, args: &[&str]) -> String {
    let t = Instant::now();
    let res = cmd(c, args);
    let took = t.elapsed();
    let text = match res {
        Ok(v) => panic!(
            "{args:?}: expected an UNAVAILABLE error, got the answer {v:?} after {took:?}\nvalkey log:\n{}",
            vk.log()
        ),
        Err(e) => error_text(&e),
    };
    assert!(
        text.starts_with("UNAVAILABLE"),
        "{args:?}: expected an UNAVAILABLE error, got {text:?}\nvalkey log:\n{}",
        vk.log()
    );
    assert!(
        took <= no_hang(),
        "{args:?}: the error took {took:?} (db-timeout {DB_TIMEOUT_MS} ms)\nvalkey log:\n{}",
        vk.log()
    );
    text
}

/// One EXISTS while the database may be unavailable: `Some(answer)` or `None` for an
/// `UNAVAILABLE` error. Any other error or reply type fails the test.
fn exists_or_unavailable(vk: &Valkey, c: &mut Connection, set: &str, item: &str) -> Option<i64> {
    match cmd(c, &["MEMBER.EXISTS", set, item]) {
        Ok(Value::Int(n)) => Some(n),
        Ok(v) => panic!("EXISTS {set} {item}: unexpected reply {v:?}"),
        Err(e) => {
            let text = error_text(&e);
            assert!(
                text.starts_with("UNAVAILABLE"),
                "EXISTS {set} {item}: expected 0/1 or UNAVAILABLE, got {text:?}\nvalkey log:\n{}",
                vk.log()
            );
            None
        }
    }
}

/// Waits until `vk` has logged a failed load of the set catalog (PostgreSQL unreachable).
fn wait_failed_catalog_load(vk: &Valkey) {
    assert!(
        wait_until(Duration::from_secs(10), || vk
            .log()
            .contains("cannot load the set catalog")),
        "no failed catalog load logged\nvalkey log:\n{}",
        vk.log()
    );
}

/// Runs a call that must answer (the database is up); an error fails with the server log.
fn must_answer(vk: &Valkey, c: &mut Connection, args: &[&str]) -> Value {
    cmd(c, args).unwrap_or_else(|e| {
        panic!(
            "{args:?} failed with {:?} while PostgreSQL is up\nvalkey log:\n{}",
            error_text(&e),
            vk.log()
        )
    })
}

/// Polls EXISTS until it answers; that first answer must be `want` (a wrong 0/1 on the way
/// fails at once). Errors (`UNAVAILABLE`) while waiting are fine.
fn wait_for_answer(
    vk: &Valkey,
    c: &mut Connection,
    set: &str,
    item: &str,
    want: i64,
    timeout: Duration,
) {
    let mut errors = 0;
    let answered = wait_until(timeout, || match exists_or_unavailable(vk, c, set, item) {
        Some(n) => {
            assert_eq!(
                n,
                want,
                "EXISTS {set} {item} answered {n}, PostgreSQL says {want}\nvalkey log:\n{}",
                vk.log()
            );
            true
        }
        None => {
            errors += 1;
            false
        }
    });
    assert!(
        answered,
        "EXISTS {set} {item} still UNAVAILABLE after {timeout:?} ({errors} UNAVAILABLE errors)\nvalkey log:\n{}",
        vk.log()
    );
}

/// An item whose lookup the filter of `set` rejects (EXPLAIN says bloom-negative).
fn bloom_negative_item(c: &mut Connection, set: &str, prefix: &str) -> String {
    (0..200)
        .map(|i| format!("{prefix}-{i}"))
        .find(|item| explain(c, set, item) == (0, "bloom-negative".to_string()))
        .unwrap_or_else(|| panic!("no bloom-negative item with prefix {prefix} in {set}"))
}

/// Active rows for `item` (unscoped) in PostgreSQL.
fn pg_active(pg: &mut postgres::Client, set: &str, item: &str) -> i64 {
    pg.query_one(
        &format!(
            "SELECT count(*) FROM member_{set} WHERE entity_id = $1 AND scope = '' AND status = 1
             AND (expires_at IS NULL OR expires_at > now())"
        ),
        &[&item],
    )
    .unwrap()
    .get(0)
}

/// Sessions of the module waiting on a lock (proof that a fault is really in place).
fn module_sessions_waiting_on_lock(pg: &mut postgres::Client) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = 'libmember' AND wait_event_type = 'Lock'",
        &[],
    )
    .unwrap()
    .get(0)
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        thread::sleep(t - now);
    }
}

/// Calls made right after recovery, each needing the database: more than the 4 workers.
const RECOVERY_CALLS: usize = 12;

/// Every call that needs the database answers: EXISTS of `e-<i>` (in the filter, never looked
/// up, so not cached) is 1 and ADD of `d-<i>` is 1 and lands in PostgreSQL, RECOVERY_CALLS
/// times, more than there are workers, so each worker's connection gets used.
fn every_call_answers(vk: &Valkey, c: &mut Connection, pgc: &mut postgres::Client, set: &str) {
    for i in 0..RECOVERY_CALLS {
        let e = format!("e-{i}");
        assert_eq!(
            must_answer(vk, c, &["MEMBER.EXISTS", set, &e]),
            Value::Int(1),
            "EXISTS {e}"
        );
        let d = format!("d-{i}");
        assert_eq!(
            must_answer(vk, c, &["MEMBER.ADD", set, &d]),
            Value::Int(1),
            "ADD {d}"
        );
        assert_eq!(pg_active(pgc, set, &d), 1);
    }
}

#[test]
fn postgres_down_gives_errors_not_answers_and_recovers() {
    let mut pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &FAST);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s1"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s1", "a"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s1", "b"]), 1);
    for i in 0..RECOVERY_CALLS {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s1", &format!("e-{i}")]), 1);
    }
    // The db-hit fills the cache for a; b is never looked up, so it is not cached.
    assert_eq!(explain(&mut c, "s1", "a"), (1, "db-hit".to_string()));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s1", "a"]), 1);
    assert_eq!(explain(&mut c, "s1", "a"), (1, "cache-hit".to_string()));
    let never = bloom_negative_item(&mut c, "s1", "zzz-never");

    pg.stop();

    // Filter negative: answered in memory, at full speed.
    let t = Instant::now();
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s1", &never]), 0);
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(DB_TIMEOUT_MS),
        "a filter negative waited {took:?} with PostgreSQL down"
    );
    assert_eq!(explain(&mut c, "s1", &never), (0, "bloom-negative".into()));
    // Cache hit: answered from the exact-match key.
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s1", "a"]), 1);
    assert_eq!(explain(&mut c, "s1", "a"), (1, "cache-hit".into()));
    // In the filter, not cached: only the database may answer, so an error, never 0/1.
    // Twice: once on the connections broken by the shutdown, once on reconnect attempts.
    unavailable(&vk, &mut c, &["MEMBER.EXISTS", "s1", "b"]);
    unavailable(&vk, &mut c, &["MEMBER.EXISTS", "s1", "b"]);
    unavailable(&vk, &mut c, &["MEMBER.EXPLAIN", "s1", "b"]);
    // Writes go to the database first.
    unavailable(&vk, &mut c, &["MEMBER.ADD", "s1", "c-new"]);
    unavailable(&vk, &mut c, &["MEMBER.DEL", "s1", "a"]);
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");

    pg.start();

    // Recovery by itself: no command or config needed.
    wait_for_answer(&vk, &mut c, "s1", "b", 1, Duration::from_secs(15));
    let mut pgc = pg.client();
    // The failed ADD and DEL never reached PostgreSQL (it was down).
    assert_eq!(pg_active(&mut pgc, "s1", "c-new"), 0);
    assert_eq!(pg_active(&mut pgc, "s1", "a"), 1);
    // Recovered means recovered: once the database answers again, so does every call that
    // needs it. More calls than workers (4), so each worker's connection gets used: every
    // e-<i> is in the filter and was never looked up (not cached), and every ADD writes.
    every_call_answers(&vk, &mut c, &mut pgc, "s1");
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s1", "a"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s1", "c-new"]), 0);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s1", "d-0"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s1", &never]), 0);
}

#[test]
fn slow_postgres_times_out_and_late_add_still_lands() {
    let pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &FAST);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s2", "RECENT-TTL", "1"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s2", "seed"]), 1);
    let item = bloom_negative_item(&mut c, "s2", "late");
    let timeouts_before: u64 = info_field(&mut c, "db_timeouts").unwrap().parse().unwrap();

    // EXCLUSIVE blocks INSERT (ROW EXCLUSIVE) but not SELECT (ACCESS SHARE).
    let mut locker = pg.client();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_s2 IN EXCLUSIVE MODE")
        .unwrap();
    let mut probe = pg.client();

    let started = Instant::now();
    let text = unavailable(&vk, &mut c, &["MEMBER.ADD", "s2", &item]);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(DB_TIMEOUT_MS * 9 / 10),
        "ADD failed after {took:?}, before the timeout, with {text:?}: the fault is not what this test means"
    );
    // The INSERT is still in flight, waiting on the lock.
    assert_eq!(
        module_sessions_waiting_on_lock(&mut probe),
        1,
        "the module's INSERT should be waiting on the lock"
    );
    let timeouts_after: u64 = info_field(&mut c, "db_timeouts").unwrap().parse().unwrap();
    assert!(
        timeouts_after > timeouts_before,
        "member_db_timeouts did not count it"
    );

    // The filter says absent, but a write is in flight: the database answers (not committed).
    assert_eq!(explain(&mut c, "s2", &item), (0, "recent".to_string()));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s2", &item]), 0);
    assert_eq!(pg_active(&mut probe, "s2", &item), 0);

    // Release the lock well within the module's 2 s statement timeout.
    sleep_until(started + Duration::from_millis(800));
    locker.batch_execute("COMMIT").unwrap();

    assert!(
        wait_until(Duration::from_secs(10), || {
            matches!(
                cmd(&mut c, &["MEMBER.EXISTS", "s2", &item]),
                Ok(Value::Int(1))
            )
        }),
        "the late ADD of {item} never became visible\nvalkey log:\n{}",
        vk.log()
    );
    assert_eq!(
        pg_active(&mut probe, "s2", &item),
        1,
        "the late INSERT did not commit"
    );
    // After RECENT-TTL (1 s) the mark is gone: only the filter bit set by the late completion
    // keeps the item from being answered 0 by the filter.
    thread::sleep(Duration::from_millis(2000));
    let (answer, path) = explain(&mut c, "s2", &item);
    assert!(
        answer == 1 && (path == "db-hit" || path == "cache-hit"),
        "after the recent mark expired EXPLAIN says ({answer}, {path}): the late completion did \
         not set the filter bit\nvalkey log:\n{}",
        vk.log()
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s2", &item]), 1);
    // A second ADD now finds it (the primary key decides).
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s2", &item]), 0);
}

#[test]
fn concurrent_timeouts_each_get_one_reply() {
    const N: usize = 20;
    let pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &FAST);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s3"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s3", "seed"]), 1);

    let mut locker = pg.client();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_s3 IN EXCLUSIVE MODE")
        .unwrap();

    let barrier = Arc::new(Barrier::new(N + 1));
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let mut con = vk.conn();
            let barrier = barrier.clone();
            thread::spawn(move || {
                let item = format!("item-{i}");
                barrier.wait();
                let t = Instant::now();
                let res = cmd(&mut con, &["MEMBER.ADD", "s3", &item]);
                let took = t.elapsed();
                let res = res.map_err(|e| error_text(&e));
                (item, res, took, con)
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // 4 workers are stuck on the lock, 16 jobs queued; the stuck INSERTs get 2 s.
    sleep_until(started + Duration::from_millis(1000));
    locker.batch_execute("COMMIT").unwrap();

    let mut cons = Vec::new();
    for (item, res, took, mut con) in results {
        match &res {
            Err(text) => assert!(
                text.starts_with("UNAVAILABLE"),
                "ADD {item}: expected UNAVAILABLE, got {text:?}"
            ),
            Ok(v) => panic!("ADD {item}: answered {v:?} while the table was locked"),
        }
        assert!(
            took <= no_hang(),
            "ADD {item}: the error took {took:?}\nvalkey log:\n{}",
            vk.log()
        );
        // The connection is in sync: the next reply is the PING's.
        let pong: String = redis::cmd("PING").query(&mut con).unwrap();
        assert_eq!(pong, "PONG", "ADD {item}: connection out of sync");
        cons.push((item, con));
    }

    let mut probe = pg.client();
    let mut landed = || -> i64 {
        probe
            .query_one(
                "SELECT count(*) FROM member_s3 WHERE entity_id LIKE 'item-%' AND status = 1",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let mut n = 0;
    assert!(
        wait_until(Duration::from_secs(15), || {
            n = landed();
            n == N as i64
        }),
        "only {n} of {N} late ADDs landed in PostgreSQL\nvalkey log:\n{}",
        vk.log()
    );
    for (item, _) in &cons {
        assert!(
            wait_until(Duration::from_secs(10), || {
                matches!(
                    cmd(&mut c, &["MEMBER.EXISTS", "s3", item]),
                    Ok(Value::Int(1))
                )
            }),
            "EXISTS {item} never became 1\nvalkey log:\n{}",
            vk.log()
        );
    }
    // No late second reply arrived on any connection after its error.
    for (item, mut con) in cons {
        let pong: String = redis::cmd("PING").query(&mut con).unwrap_or_else(|e| {
            panic!("PING on the connection of ADD {item}: {e}");
        });
        assert_eq!(pong, "PONG", "ADD {item}: a second reply arrived");
    }
}

/// Answers that arrive just as their client's timeout expires are never lost. Redis 7.0 drops
/// the reply of a client that a module unblocks in the same event-loop iteration in which the
/// server's own timeout for it fires: the client then waits for ever. The module times its
/// waits itself (src/block.rs); here a lock toggled at the timeout's own period makes lookups
/// end on both sides of it, many times, and every call must be answered.
#[test]
fn answers_at_the_timeout_boundary_are_never_lost() {
    const THREADS: usize = 6;
    const ITEMS: usize = 150;
    let pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &FAST);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "edge", "RECENT-TTL", "1"]);
    let mut add = redis::pipe();
    for i in 0..THREADS * ITEMS {
        add.cmd("MEMBER.ADD").arg("edge").arg(format!("u{i}"));
    }
    let _: Vec<i64> = add.query(&mut c).unwrap();
    let mut probe = pg.client();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let n: i64 = probe
                .query_one("SELECT count(*) FROM member_edge", &[])
                .unwrap()
                .get(0);
            n == (THREADS * ITEMS) as i64
        }),
        "the adds never all landed\n{}",
        vk.log()
    );
    // Past the recent-writes marks, every lookup of an added item asks the database.
    assert!(wait_until(Duration::from_secs(10), || {
        set_info(&mut c, "edge", "recent_marks").as_deref() == Some("0")
    }));

    ok(&mut c, &["CONFIG", "SET", "member.db-timeout-ms", "20"]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let locker = {
        let stop = stop.clone();
        let mut pgc = pg.client();
        thread::spawn(move || {
            let mut hold = 14u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                pgc.batch_execute("BEGIN; LOCK TABLE member_edge IN ACCESS EXCLUSIVE MODE")
                    .unwrap();
                thread::sleep(Duration::from_millis(hold));
                pgc.batch_execute("COMMIT").unwrap();
                thread::sleep(Duration::from_millis(1));
                hold = 14 + (hold * 7 + 3) % 13; // 14..26 ms around the 20 ms timeout
            }
        })
    };
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut con = vk.conn();
            con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            thread::spawn(move || {
                let (mut yes, mut timeouts) = (0, 0);
                for i in 0..ITEMS {
                    let item = format!("u{}", t * ITEMS + i);
                    match cmd(&mut con, &["MEMBER.EXISTS", "edge", &item]) {
                        Ok(Value::Int(1)) => yes += 1,
                        Err(e) if error_text(&e).starts_with("UNAVAILABLE") => timeouts += 1,
                        other => return Err(format!("EXISTS {item}: {other:?}")),
                    }
                }
                Ok((yes, timeouts))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    locker.join().unwrap();
    let (mut yes, mut timeouts) = (0, 0);
    for r in results {
        let (y, t) = r.unwrap_or_else(|e| panic!("{e}\nvalkey log:\n{}", vk.log()));
        yes += y;
        timeouts += t;
    }
    // Both outcomes happened, so answers did arrive on both sides of the timeout.
    assert!(
        yes > 0 && timeouts > 0,
        "answered {yes}, timed out {timeouts}"
    );
}

#[test]
fn start_while_postgres_is_down() {
    let mut pg = OwnPg::start_new();
    {
        let vk1 = start_loaded(&pg.url(), &FAST);
        let mut c = vk1.conn();
        ok(&mut c, &["MEMBER.CREATE", "s4"]);
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s4", "present"]), 1);
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s4", "also"]), 1);
    } // vk1 stops here
    pg.stop();

    let vk = start_with(&pg.url(), &FAST);
    let mut c = vk.conn();
    // Give the catalog load a chance to fail at least once.
    wait_failed_catalog_load(&vk);
    assert_eq!(info_field(&mut c, "catalog_loaded").as_deref(), Some("0"));
    unavailable(&vk, &mut c, &["MEMBER.EXISTS", "s4", "x"]);
    unavailable(&vk, &mut c, &["MEMBER.EXISTS", "s4", "present"]);
    unavailable(&vk, &mut c, &["MEMBER.ADD", "s4", "y"]);

    pg.start();

    // From the first answer on, answers match PostgreSQL: this node's filter is missing at
    // first, so "present" can only come from the database, never a false 0.
    wait_for_answer(&vk, &mut c, "s4", "present", 1, Duration::from_secs(20));
    assert_eq!(info_field(&mut c, "catalog_loaded").as_deref(), Some("1"));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s4", "also"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s4", "x"]), 0);
    // The filter is rebuilt in the background; then negatives are answered by it.
    assert!(
        wait_until(Duration::from_secs(20), || set_info(
            &mut c,
            "s4",
            "filter_complete"
        )
        .as_deref()
            == Some("1")),
        "filter never rebuilt\nvalkey log:\n{}",
        vk.log()
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s4", "present"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s4", "also"]), 1);
    let never = bloom_negative_item(&mut c, "s4", "never");
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s4", &never]), 0);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s4", "y"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s4", "y"]), 1);
}

#[test]
fn pg_url_change_via_config_set() {
    let pg = OwnPg::start_new();
    {
        let vk1 = start_loaded(&pg.url(), &FAST);
        let mut c = vk1.conn();
        ok(&mut c, &["MEMBER.CREATE", "s5"]);
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s5", "x"]), 1);
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s5", "z"]), 1);
    }
    // Nothing listens there.
    let wrong = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        free_port()
    );
    let vk = start_with(&wrong, &FAST);
    let mut c = vk.conn();
    wait_failed_catalog_load(&vk);
    assert_eq!(info_field(&mut c, "catalog_loaded").as_deref(), Some("0"));
    unavailable(&vk, &mut c, &["MEMBER.EXISTS", "s5", "x"]);

    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &pg.url()]);
    wait_for_answer(&vk, &mut c, "s5", "x", 1, Duration::from_secs(15));
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s5", "y"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s5", "y"]), 1);
    assert_eq!(pg_active(&mut pg.client(), "s5", "y"), 1);

    // And away again: every worker reconnects to the new (wrong) URL.
    assert!(
        wait_until(Duration::from_secs(20), || set_info(
            &mut c,
            "s5",
            "filter_complete"
        )
        .as_deref()
            == Some("1")),
        "filter never rebuilt\nvalkey log:\n{}",
        vk.log()
    );
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &wrong]);
    // z is in the filter and was never looked up here, so it is not cached.
    unavailable(&vk, &mut c, &["MEMBER.EXISTS", "s5", "z"]);
    unavailable(&vk, &mut c, &["MEMBER.ADD", "s5", "w"]);
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &pg.url()]);
    wait_for_answer(&vk, &mut c, "s5", "z", 1, Duration::from_secs(15));
}

/// Sessions the module holds open in PostgreSQL.
fn module_sessions(pg: &mut postgres::Client) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'libmember'",
        &[],
    )
    .unwrap()
    .get(0)
}

/// The quiet-hours version of the first test: PostgreSQL restarts while nobody asks, so every
/// worker still holds a connection from before. Once it is back, calls must simply work.
#[test]
fn quiet_postgres_restart_then_every_call_answers() {
    const WORKERS: usize = 4;
    let mut pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &FAST);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s6"]);
    for i in 0..RECOVERY_CALLS {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s6", &format!("e-{i}")]), 1);
    }
    // Warm up: concurrent writes until every worker has opened its connection.
    let mut probe = pg.client();
    let mut round = 0;
    let mut sessions = 0;
    let warmed = wait_until(Duration::from_secs(15), || {
        round += 1;
        let handles: Vec<_> = (0..2 * WORKERS)
            .map(|t| {
                let mut con = vk.conn();
                thread::spawn(move || {
                    for k in 0..5 {
                        let item = format!("w-{round}-{t}-{k}");
                        let _ = cmd(&mut con, &["MEMBER.ADD", "s6", &item]);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        sessions = module_sessions(&mut probe);
        sessions >= WORKERS as i64
    });
    assert!(warmed, "only {sessions} module sessions after warm-up");
    drop(probe);

    pg.stop();
    pg.start();
    // PostgreSQL has been back for a while (longer than any retry delay) before the first call.
    thread::sleep(Duration::from_secs(3));

    let mut pgc = pg.client();
    every_call_answers(&vk, &mut c, &mut pgc, "s6");
}

/// `CLIENT UNBLOCK <id> TIMEOUT` on a client waiting for the database (README "Limitations"):
/// it gets `UNAVAILABLE` at once and nothing more when the database answers later; the write
/// it asked for still lands.
#[test]
fn client_unblock_timeout_answers_unavailable_once() {
    let pg = OwnPg::start_new();
    // A long timeout of the module's own: only the UNBLOCK ends the wait.
    let vk = start_loaded(&pg.url(), &[("member.db-timeout-ms", "20000")]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "u"]);
    let mut locker = pg.client();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_u IN EXCLUSIVE MODE")
        .unwrap();
    let mut waiter = vk.conn();
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut waiter).unwrap();
    let add = thread::spawn(move || {
        let res = cmd(&mut waiter, &["MEMBER.ADD", "u", "late"]).map_err(|e| error_text(&e));
        (res, waiter)
    });
    assert!(
        wait_until(Duration::from_secs(10), || {
            let line: String = redis::cmd("CLIENT")
                .arg("LIST")
                .arg("ID")
                .arg(id)
                .query(&mut c)
                .unwrap();
            line.contains("flags=b")
        }),
        "the ADD never blocked"
    );
    let n: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(id)
        .arg("TIMEOUT")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 1, "CLIENT UNBLOCK refused the client");
    let (res, mut waiter) = add.join().unwrap();
    let text = res.expect_err("the unblocked ADD answered");
    assert!(text.starts_with("UNAVAILABLE"), "{text}");
    locker.batch_execute("COMMIT").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || int(
            &mut c,
            &["MEMBER.EXISTS", "u", "late"]
        ) == 1),
        "the write never landed\n{}",
        vk.log()
    );
    // The ADD's completion has reached the main thread (it counts the add there): nothing
    // more reached the unblocked client, whose next reply is its PING's.
    assert!(
        wait_until(Duration::from_secs(10), || set_info(&mut c, "u", "adds")
            .as_deref()
            == Some("1")),
        "the ADD's completion was never applied: adds {:?}",
        set_info(&mut c, "u", "adds")
    );
    let pong: String = redis::cmd("PING").query(&mut waiter).unwrap();
    assert_eq!(pong, "PONG");
}
