//! A PostgreSQL failover behind pgbouncer in transaction pooling (docs/failover.md, "Behind
//! a pooler"): the node's connections are the pooler's and survive the failover, so no
//! reconnect tells the node; the history read at the start of every sync pass must. The
//! standby misses acknowledged members and outside rows, the primary is killed, the standby
//! is promoted, and pgbouncer is pointed at it and reloaded, as an operator (or a Patroni
//! callback) does. A checker asks for members of both histories all through it.
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::failover::{all_answer, exists, insert, SYNC_MS};
use support::failover::PgPair;
use support::member::*;
use support::pgbouncer::{Mode, OwnPgbouncer};
use support::wait_until;

#[test]
fn behind_a_transaction_pooler_a_failover_is_seen_at_the_next_sync_pass() {
    let mut pair = PgPair::start();
    pair.least_privilege("app");
    let (primary_port, standby_port) = pair.ports();
    let bouncer = OwnPgbouncer::start(Mode::Transaction, primary_port, &["app"]);
    let sync = SYNC_MS.to_string();
    let vk = start_loaded(
        &bouncer.url_as("app", "app"),
        &[("member.sync-interval-ms", &sync)],
    );
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    let history = info_field(&mut c, "db_history").expect("INFO member db_history");
    assert!(history.starts_with("timeline 1 "), "db_history {history}");
    let mut p = pair.primary_db("app");

    let both: Vec<String> = (0..20).map(|i| format!("both-{i}")).collect();
    for (i, item) in both.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(int(&mut c, &["MEMBER.ADD", "s", item]), 1);
        } else {
            insert(&mut p, "s", item);
        }
    }
    pair.wait_caught_up();
    pair.stop_standby();
    // On the old history only, seen by the node: exact-match keys, marks, filter bits.
    let lost: Vec<String> = (0..30).map(|i| format!("lost-{i}")).collect();
    for (i, item) in lost.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(int(&mut c, &["MEMBER.ADD", "s", item]), 1);
        } else {
            insert(&mut p, "s", item);
        }
    }
    for item in &lost {
        assert!(
            wait_until(Duration::from_secs(20), || exists(&mut c, "s", item)
                == Some(1)),
            "{item} never answered 1 before the failover"
        );
        assert_eq!(exists(&mut c, "s", item), Some(1));
    }
    drop(p);

    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
    let checker = {
        let (stop, wrong, both) = (stop.clone(), wrong.clone(), both.clone());
        let mut c = vk.conn();
        thread::spawn(move || {
            let mut asked = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for item in &both {
                    asked += 1;
                    if exists(&mut c, "s", item) == Some(0) {
                        wrong.lock().unwrap().push(item.clone());
                    }
                }
            }
            asked
        })
    };

    pair.fail_over();
    bouncer.retarget(standby_port);
    let mut s = pair.standby_db("app");
    let fresh: Vec<String> = (0..20).map(|i| format!("new-row-{i}")).collect();
    for item in &fresh {
        insert(&mut s, "s", item);
    }

    assert!(
        wait_until(Duration::from_secs(30), || {
            info_field(&mut c, "db_history_changes").as_deref() == Ok("1")
        }),
        "the node never saw the failover behind the pooler: db_history {:?}\n{}\n{}",
        info_field(&mut c, "db_history"),
        vk.log(),
        bouncer.log()
    );
    let history = info_field(&mut c, "db_history").unwrap();
    assert!(history.starts_with("timeline 2 "), "db_history {history}");
    for item in &fresh {
        assert!(
            wait_until(Duration::from_secs(10), || exists(&mut c, "s", item)
                == Some(1)),
            "{item}, committed on the new primary, never answered 1 (explain {:?})\n{}",
            explain(&mut c, "s", item),
            vk.log()
        );
    }
    for item in &lost {
        assert!(
            wait_until(Duration::from_secs(5), || exists(&mut c, "s", item)
                == Some(0)),
            "{item}, lost in the promotion, still answers 1 (explain {:?})",
            explain(&mut c, "s", item)
        );
    }
    assert!(
        wait_until(Duration::from_secs(30), || {
            set_info(&mut c, "s", "filter_serves_absent").as_deref() == Ok("1")
        }),
        "the filter was never rebuilt from the new primary"
    );
    all_answer(&mut c, &lost, 0, "after the rebuild");
    all_answer(&mut c, &fresh, 1, "after the rebuild");
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "added-after"]), 1);
    assert_eq!(exists(&mut c, "s", "added-after"), Some(1));

    stop.store(true, Ordering::Relaxed);
    let asked = checker.join().unwrap();
    let wrong = wrong.lock().unwrap().clone();
    assert!(asked > 0, "the checker never asked");
    assert!(
        wrong.is_empty(),
        "{} of {asked} lookups of members of both histories answered 0: {wrong:?}",
        wrong.len()
    );
}
