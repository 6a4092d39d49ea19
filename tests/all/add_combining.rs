//! ADDs of one set share the set's next insert (issue 30, docs/sync.md "Write path"): while
//! the set's inserts run, ADDs taken by other workers wait for them instead of each sending a
//! statement of its own, and every one of them still gets its own answer.
use crate::support;

use std::thread;
use std::time::Duration;

use support::member::*;
use support::wait_until;

/// Inserts into `member_<set>` waiting for a lock.
fn inserts_waiting(pg: &mut postgres::Client, set: &str) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM pg_stat_activity
          WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO ' || $1 || ' %'",
        &[&format!("member_{set}")],
    )
    .unwrap()
    .get(0)
}

#[test]
fn adds_arriving_while_the_sets_inserts_run_go_in_one_statement() {
    const ADDS: usize = 10;
    let env = Env::with(&[("member.workers", "4"), ("member.db-timeout-ms", "20000")]);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "comb"]);
    let mut pg = env.pg();
    // Every insert into the set's table waits until this transaction ends.
    let mut lock = env.pg();
    lock.batch_execute("BEGIN; LOCK TABLE member_comb IN SHARE MODE")
        .unwrap();
    let before = info_number(&mut c, "member", "member_db_batches");
    let mut clients = Vec::new();
    for i in 0..ADDS {
        let mut conn = env.conn();
        clients.push(thread::spawn(move || {
            int(&mut conn, &["MEMBER.ADD", "comb", &format!("item-{i}")])
        }));
        // Each ADD reaches the module on its own (it is then a blocked client, waiting for
        // the database) and a worker or the batch it joins (the queue is empty again): without
        // combining, each of the four workers would hold a statement of its own.
        assert!(
            wait_until(Duration::from_secs(10), || info_number(
                &mut c,
                "member",
                "member_blocked_clients"
            ) == i as i64 + 1),
            "ADD {i} never reached the module"
        );
        assert!(
            wait_until(Duration::from_secs(10), || info_number(
                &mut c,
                "member",
                "member_db_queue"
            ) == 0),
            "ADD {i} waits for a worker: every worker holds an insert of this set (no combining)"
        );
    }
    assert!(wait_until(Duration::from_secs(10), || inserts_waiting(
        &mut pg, "comb"
    ) >= 2));
    // A negative window: every ADD is in the module and none is queued (checked above), so a
    // third insert would be one a worker already holds and sends at once; 300 ms is far more
    // than that takes, and on a loaded machine a late one can only be missed here, never
    // invented (the statement count below still bounds it).
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        inserts_waiting(&mut pg, "comb"),
        2,
        "more inserts of one set ran at once than the combiner allows"
    );
    lock.batch_execute("COMMIT").unwrap();
    let answers: Vec<i64> = clients.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(answers, vec![1; ADDS], "every ADD made its item a member");
    let statements = info_number(&mut c, "member", "member_db_batches") - before;
    assert!(
        statements <= 3,
        "{ADDS} ADDs took {statements} statements: the two that waited for the lock, then one"
    );
    for i in 0..ADDS {
        assert_eq!(
            int(&mut c, &["MEMBER.EXISTS", "comb", &format!("item-{i}")]),
            1
        );
    }
}
