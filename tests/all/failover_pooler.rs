//! A PostgreSQL failover behind pgbouncer in transaction pooling (docs/failover.md, "When a
//! node reads it"), done the way pgbouncer's docs give for a switchover: `PAUSE` holds every
//! new transaction, the standby (which missed acknowledged members and outside rows) is
//! promoted in place of the killed primary, pgbouncer is pointed at it and reloaded, and
//! `RESUME` lets the held transactions go on there. No statement of the node fails and none of
//! its connections drops, so no reconnect tells it: the history read at the start of every sync
//! pass must (with that read disabled the node never sees the failover and this test fails).
//! A checker asks for members of both histories all through it.
use crate::support;

use std::time::Duration;

use super::failover::{add_or_insert, all_answer, exists, insert, NeverZero, SYNC_MS};
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
    add_or_insert(&mut c, &mut p, &both);
    pair.wait_caught_up();
    pair.stop_standby();
    // On the old history only, seen by the node: exact-match keys, marks, filter bits.
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

    let checker = NeverZero::start(vk.conn(), &both);

    // pgbouncer's switchover: PAUSE holds every new transaction (none fails), the failover
    // happens behind it, RESUME lets them go on to the new primary.
    bouncer.admin("PAUSE");
    pair.fail_over();
    bouncer.retarget(standby_port);
    bouncer.admin("RESUME");
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

    checker.finish();
}
