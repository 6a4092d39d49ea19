//! Fault injection against a real PostgreSQL, the database away: stopped, down at start-up,
//! restarted, or its URL changed. The contract under test (docs/contract.md "The correctness
//! contract"): items the filter rejects are still answered; every other lookup and every write
//! gets an error starting with `UNAVAILABLE` within the timeout — never a 0 or 1 in its place,
//! never a hang — and the module recovers by itself. A database that is there but slow:
//! `tests/all/timeouts.rs`.
use crate::support;

use std::thread;
use std::time::{Duration, Instant};

use support::faults::*;
use support::member::*;
use support::{free_port, start_with, wait_until, OwnPg};

#[test]
fn postgres_down_gives_errors_not_answers_and_recovers() {
    let mut pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &[]);
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
    go_fast(&mut c);

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
fn start_while_postgres_is_down() {
    let mut pg = OwnPg::start_new();
    {
        // Made under the default timeout: a CREATE on a busy machine can take longer than
        // FAST's 500 ms.
        let vk1 = start_loaded(&pg.url(), &[]);
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
    assert_eq!(info_field(&mut c, "catalog_loaded").as_deref(), Ok("0"));
    unavailable(&vk, &mut c, &["MEMBER.EXISTS", "s4", "x"]);
    unavailable(&vk, &mut c, &["MEMBER.EXISTS", "s4", "present"]);
    unavailable(&vk, &mut c, &["MEMBER.ADD", "s4", "y"]);

    pg.start();
    go_patient(&mut c);

    // From the first answer on, answers match PostgreSQL: this node's filter is missing at
    // first, so "present" can only come from the database, never a false 0.
    wait_for_answer(&vk, &mut c, "s4", "present", 1, Duration::from_secs(20));
    assert_eq!(info_field(&mut c, "catalog_loaded").as_deref(), Ok("1"));
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
            == Ok("1")),
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
        // The set and its members are made under the default timeout: a CREATE on a busy
        // machine can take longer than FAST's 500 ms.
        let vk1 = start_loaded(&pg.url(), &[]);
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
    assert_eq!(info_field(&mut c, "catalog_loaded").as_deref(), Ok("0"));
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
            == Ok("1")),
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

/// The quiet-hours version of the first test: PostgreSQL restarts while nobody asks, so every
/// worker still holds a connection from before. Once it is back, calls must simply work.
#[test]
fn quiet_postgres_restart_then_every_call_answers() {
    const WORKERS: usize = 4;
    let mut pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &[]);
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
    go_fast(&mut c);

    pg.stop();
    pg.start();
    // The first call comes once the module has seen PostgreSQL back: a sync pass (one a
    // second, on a worker of its own choosing) has read from it since the restart. Every
    // other worker still holds its connection from before.
    let passes = info_number(&mut c, "member", "member_sync_passes");
    assert!(
        wait_until(Duration::from_secs(20), || info_number(
            &mut c,
            "member",
            "member_sync_passes"
        ) > passes),
        "no sync pass read PostgreSQL after its restart\n{}",
        vk.log()
    );

    let mut pgc = pg.client();
    every_call_answers(&vk, &mut c, &mut pgc, "s6");
}

/// A connection attempt still in flight when `member.pg-url` changes says nothing of the new
/// URL: after a connection under the new one succeeded, the old attempt's late failure never
/// shows in `db_link_error`. The old URL is a listener that accepts and holds every
/// connection unanswered (the driver's connect timeout covers only the TCP connect), and
/// closes them once the new URL has served, which fails those attempts then. (Under load in
/// CI, a TLS handshake under an earlier URL once failed after the new URL had connected, and
/// INFO showed the old error.)
#[test]
fn a_late_failure_under_an_old_url_never_shows_once_the_new_one_connected() {
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};

    let env = Env::with(&[("member.db-timeout-ms", "2000")]);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "a"]), 1);
    let good = env.db.url();

    // Accepts every connection and holds it, unanswered.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_port = hole.local_addr().unwrap().port();
    let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    {
        let held = held.clone();
        thread::spawn(move || {
            for s in hole.incoming() {
                let Ok(s) = s else { return };
                held.lock().unwrap().push(s);
            }
        });
    }
    let url = format!("host=127.0.0.1 port={hole_port} user=postgres dbname=nowhere");
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &url]);
    // An ADD goes to the database: its worker's attempt is now held.
    let mut waiting = env.conn();
    let add = thread::spawn(move || cmd(&mut waiting, &["MEMBER.ADD", "s", "b"]));
    assert!(
        wait_until(Duration::from_secs(10), || !held.lock().unwrap().is_empty()),
        "the module never tried the held URL"
    );
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &good]);
    assert!(
        wait_until(Duration::from_secs(20), || cmd(
            &mut c,
            &["MEMBER.ADD", "s", "c"]
        )
        .is_ok()),
        "the new URL never served"
    );
    assert_eq!(info_field(&mut c, "db_link_error").as_deref(), Ok("none"));
    // Now the held attempts fail; each failure would be recorded as it ends.
    for s in held.lock().unwrap().iter() {
        let _ = s.shutdown(Shutdown::Both);
    }
    // The ADD sent under the held URL: `UNAVAILABLE` when its own job's attempt was the one
    // held, or 1 when it still waited in its set's lane and went into an insert on the new URL
    // (the held attempt was then another job's). Never another answer.
    let first = add.join().unwrap();
    assert!(
        matches!(&first, Ok(redis::Value::Int(1)))
            || first
                .as_ref()
                .is_err_and(|e| e.code() == Some("UNAVAILABLE")),
        "the held ADD: {first:?}"
    );
    let late = wait_until(Duration::from_secs(2), || {
        info_field(&mut c, "db_link_error").as_deref() != Ok("none")
    });
    assert!(
        !late,
        "db_link_error shows a failure under the old URL: {:?}",
        info_field(&mut c, "db_link_error")
    );
    // The worker the held attempt kept goes back to work under the new URL.
    for item in ["d", "e", "f", "g", "h"] {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", item]), 1);
    }
}
