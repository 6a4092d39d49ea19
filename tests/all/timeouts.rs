//! Fault injection against a real PostgreSQL that is there but slow: a lock held from another
//! session. Every call that needs it gets `UNAVAILABLE` within the timeout, exactly once, and
//! a write that commits after its client gave up (by the timeout, or by `CLIENT UNBLOCK`) still
//! reaches the filter. The database away: `tests/all/faults.rs`.
use crate::support;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use support::faults::*;
use support::member::*;
use support::{wait_until, OwnPg};

#[test]
fn slow_postgres_times_out_and_late_add_still_lands() {
    let pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &[]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s2", "RECENT-TTL", "1"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s2", "seed"]), 1);
    let item = bloom_negative_item(&mut c, "s2", "late");
    go_fast(&mut c);
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

    // The client has its timeout and the INSERT still waits (both checked above): release the
    // lock now, well within the module's 2 s statement timeout, however slow the machine.
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
    // The set is made under the default timeout (a CREATE on a busy machine can take longer
    // than FAST's 500 ms); the concurrent calls below run under FAST.
    let vk = start_loaded(&pg.url(), &[]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s3"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s3", "seed"]), 1);
    go_fast(&mut c);

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
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // Every client has its reply (joined above) while 4 workers are stuck on the lock and
    // 16 jobs are queued: release it now, well within the stuck INSERTs' 2 s statement
    // timeout, however slow the machine.
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
/// waits itself (src/server/block.rs); here a lock toggled at the timeout's own period makes lookups
/// end on both sides of it, many times, and every call must be answered.
#[test]
fn answers_at_the_timeout_boundary_are_never_lost() {
    const THREADS: usize = 6;
    const ITEMS: usize = 150;
    let pg = OwnPg::start_new();
    // The set and its rows are made under a generous timeout (a fresh PostgreSQL on a busy
    // machine can take longer than FAST's); the boundary itself is tested at 20 ms below.
    let vk = start_loaded(&pg.url(), &[("member.db-timeout-ms", "20000")]);
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
        set_info(&mut c, "edge", "recent_marks").as_deref() == Ok("0")
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

/// `CLIENT UNBLOCK <id> TIMEOUT` on a client waiting for the database (docs/limits.md):
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
            == Ok("1")),
        "the ADD's completion was never applied: adds {:?}",
        set_info(&mut c, "u", "adds")
    );
    let pong: String = redis::cmd("PING").query(&mut waiter).unwrap();
    assert_eq!(pong, "PONG");
}
