//! A rebuild's window (docs/sync.md, "A rebuild's window"): rows committed after a rebuild's
//! snapshot and before its swap, while no sync pass puts them in its journal, are in the new
//! filter when it starts to serve. No pass could: the set had lost its filter, so no value
//! with a watermark was there to be caught up (after a failover or a restore, the value there
//! counts another history's ids, and the passes read nothing of the window either).
use crate::support;

use std::thread;
use std::time::Duration;

use support::member::*;
use support::wait_until;

/// Waits until a session of the test's database waits for a lock in a statement like `like`.
fn wait_for_lock(env: &Env, like: &str, never: &str) {
    let mut pg = env.pg();
    let mut waiting = || -> i64 {
        pg.query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE $1",
            &[&like],
        )
        .unwrap()
        .get(0)
    };
    assert!(
        wait_until(Duration::from_secs(30), || waiting() > 0),
        "{never}\n{}",
        env.vk.log()
    );
}

/// The order is made by a lock, not by timing. The test's transaction holds the set table in
/// ACCESS EXCLUSIVE mode: the rebuild takes its snapshot (which touches no table) and then
/// waits at its COPY; the transaction writes its rows and commits, after that snapshot and
/// before the swap, which cannot come until the COPY has read the table. No pass runs by the
/// interval (an hour) or by a notification (off); the one the swap asks for at once is the
/// only other way the rows could reach the filter, and the lookups are pipelined behind the
/// rebuild's reply, so that they run right after the swap, before such a pass has read anything.
#[test]
fn rows_committed_while_a_lost_filter_is_rebuilt_answer_1_from_the_swap_on() {
    let env = Env::with(&[("member.sync-interval-ms", "3600000")]);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "before"]), 1);

    let mut locker = env.pg();
    locker
        .batch_execute("BEGIN; LOCK TABLE member_s IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let rows: Vec<String> = (0..20).map(|i| format!("window-{i}")).collect();

    // One client, one pipeline: the filter key goes, the rebuild starts at once (no sweep can
    // start one in between), and the lookups wait behind its reply.
    let asked = rows.clone();
    let mut p = env.conn();
    let lookups = thread::spawn(move || {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL")
            .arg("member:s:bloom")
            .ignore()
            .cmd("MEMBER.REBUILD")
            .arg("s")
            .arg("SYNC")
            .ignore();
        for item in &asked {
            pipe.cmd("MEMBER.EXPLAIN").arg("s").arg(item);
        }
        let answers: Vec<(i64, String)> = pipe.query(&mut p).expect("the pipeline");
        answers
    });

    wait_for_lock(
        &env,
        "COPY (SELECT entity_id, scope FROM member_s %",
        "the rebuild's COPY never waited at the lock",
    );
    for item in &rows {
        locker
            .execute("INSERT INTO member_s (entity_id) VALUES ($1)", &[item])
            .unwrap();
    }
    locker.batch_execute("COMMIT").unwrap();

    let answers = lookups.join().expect("the pipelined client");
    let wrong: Vec<_> = rows
        .iter()
        .zip(&answers)
        .filter(|(_, (answer, _))| *answer != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "rows committed during the rebuild answered 0 right after its swap: {wrong:?}\n{}",
        env.vk.log()
    );
    // Served by the new filter, not by a fall-through to the database.
    assert_eq!(set_info(&mut c, "s", "filter_serves_absent").unwrap(), "1");
    assert_eq!(
        explain(&mut c, "s", "never-added"),
        (0, "bloom-negative".to_string())
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "before"]), 1);
}

/// What the catch-up cannot read: a row committed after it, in the moment before the swap.
/// No pass puts it in the new filter before the next one; but a lookup that answered 1 for it
/// meanwhile (the set falling through to the database) put it there, so it never answers 0
/// after having answered 1. Held by the debug build's failpoint: the rebuild waits between its
/// catch-up and the swap while the test holds an advisory lock. Before the fix, the lookup
/// pipelined behind the rebuild's reply answered `(0, "bloom-negative")`.
#[test]
fn a_row_a_lookup_confirmed_before_the_swap_answers_1_after_it() {
    const SET: &str = "failpoint_held_w";
    let env = Env::debug_build(&[("member.sync-interval-ms", "3600000")]);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", SET]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", SET, "before"]), 1);

    let mut locker = env.pg();
    let lock = format!("libmember failpoint build {SET}");
    locker
        .execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", &[&lock])
        .unwrap();
    let mut p = env.conn();
    let rebuild = thread::spawn(move || {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL")
            .arg(format!("member:{SET}:bloom"))
            .ignore()
            .cmd("MEMBER.REBUILD")
            .arg(SET)
            .arg("SYNC")
            .ignore()
            .cmd("MEMBER.EXPLAIN")
            .arg(SET)
            .arg("late");
        let answers: Vec<(i64, String)> = pipe.query(&mut p).expect("the pipeline");
        answers
    });

    wait_for_lock(
        &env,
        "%pg_advisory_lock_shared%",
        "the rebuild never waited at the failpoint",
    );
    let mut pg = env.pg();
    let table = format!("member_{SET}");
    pg.execute(
        &format!("INSERT INTO {table} (entity_id) VALUES ('late')"),
        &[],
    )
    .unwrap();
    // The set has no filter: the lookup reads the table.
    assert_eq!(explain(&mut c, SET, "late").0, 1);
    locker
        .execute(
            "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
            &[&lock],
        )
        .unwrap();

    let answers = rebuild.join().expect("the pipelined client");
    assert_eq!(
        answers[0].0,
        1,
        "a row that answered 1 before the swap answered {:?} right after it\n{}",
        answers[0],
        env.vk.log()
    );
    assert_eq!(set_info(&mut c, SET, "filter_serves_absent").unwrap(), "1");
    assert_eq!(
        explain(&mut c, SET, "never-added"),
        (0, "bloom-negative".to_string())
    );
}
