//! MEMBER.REBUILD in a cluster (docs/cluster-commands.md): routed by the set name, and the node
//! that runs it has every primary rebuild its slots of the set over the cluster bus; SYNC
//! answers the sum of their rows, a primary that does not answer in time fails the call by its
//! address.
use crate::support;

use std::time::Duration;

use support::cluster::{cli_follow, while_stopped, Cluster, ConfigFor};
use support::member::*;
use support::wait_until;

fn rebuilt_by_hand(c: &mut redis::Connection, set: &str) -> bool {
    set_info(c, set, "last_rebuild_reason").as_deref() == Ok("manual")
        && set_info(c, set, "last_rebuild").as_deref() == Ok("ok")
}

#[test]
fn rebuild_from_any_node_rebuilds_every_primary_and_sync_sums_their_rows() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "cw_rebuild";
    cl.create_everywhere_with(set, &["NORMALIZE", "none"]);
    cl.db()
        .client()
        .batch_execute(&format!(
            "INSERT INTO member_{set} (entity_id) SELECT 'r' || g FROM generate_series(1, 300) g"
        ))
        .expect("insert rows");
    // Every primary's first build is over: a REBUILD now starts a new one on each.
    cl.wait_ready(set);
    for p in cl.primaries() {
        assert!(!rebuilt_by_hand(&mut p.conn(), set), "{}", p.addr());
    }
    let owner = cl.set_owner(set);
    let other = cl.primaries().find(|n| n.port() != owner.port()).unwrap();
    let moved = err(&mut other.conn(), &["MEMBER.REBUILD", set]);
    assert!(
        moved.starts_with(&format!("MOVED {} ", cl.keyslot(set)))
            && moved.ends_with(&format!(":{}", owner.port())),
        "{moved}"
    );
    // From a node that does not serve the name: the cli follows MOVED to the owner, which has
    // every primary rebuild.
    assert_eq!(
        cli_follow(other.port(), &["MEMBER.REBUILD", set, "ASYNC"]),
        "OK"
    );
    for p in cl.primaries() {
        let mut c = p.conn();
        assert!(
            wait_until(Duration::from_secs(30), || rebuilt_by_hand(&mut c, set)),
            "{} never rebuilt: {:?} {:?}",
            p.addr(),
            set_info(&mut c, set, "last_rebuild_reason"),
            set_info(&mut c, set, "last_rebuild")
        );
    }
    // SYNC through a cluster client (it routes by argv[1]): every row, counted once, as the
    // sum of each primary's own rows.
    let rows: i64 = redis::cmd("MEMBER.REBUILD")
        .arg(set)
        .arg("SYNC")
        .query(&mut cl.client())
        .expect("REBUILD SYNC");
    assert_eq!(rows, 300);
    let per_node: Vec<i64> = cl
        .primaries()
        .map(|p| {
            set_info(&mut p.conn(), set, "last_rebuild_rows")
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(per_node.iter().all(|r| *r > 0), "{per_node:?}");
    assert_eq!(per_node.iter().sum::<i64>(), 300, "{per_node:?}");
    // A set no node knows: the owner of its name says so, no primary is asked.
    let unknown = "cw_rebuild_nosuch";
    assert_eq!(
        err(
            &mut cl.set_owner(unknown).conn(),
            &["MEMBER.REBUILD", unknown, "SYNC"]
        ),
        "ERR no such set: create it with MEMBER.CREATE"
    );
    ok(&mut owner.conn(), &["MEMBER.DROP", set]);
}

#[test]
fn a_primary_that_does_not_answer_fails_the_call_by_its_address() {
    // The exclusive cluster: one primary is stopped for a moment, and the owner's database
    // timeout shortened; no other test uses it meanwhile.
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "cw_rebuild_slow";
    cl.create_everywhere_with(set, &["NORMALIZE", "none"]);
    cl.wait_ready(set);
    let owner = cl.set_owner(set);
    let slow = cl.primaries().find(|n| n.port() != owner.port()).unwrap();
    let _short = ConfigFor::set(owner, "member.db-timeout-ms", "300");
    // The slow primary is stopped: it reads no cluster message until the call has answered.
    let e = while_stopped(slow, || {
        err(&mut owner.conn(), &["MEMBER.REBUILD", set, "SYNC"])
    });
    assert_eq!(
        e,
        format!(
            "UNAVAILABLE primary {} did not answer MEMBER.REBUILD within member.db-timeout-ms; \
             the rebuilds that started go on",
            slow.addr()
        )
    );
    // The rebuilds that started went on; the late one runs too (its answer is dropped).
    for p in cl.primaries() {
        let mut c = p.conn();
        assert!(
            wait_until(Duration::from_secs(30), || rebuilt_by_hand(&mut c, set)),
            "{} never rebuilt",
            p.addr()
        );
    }
    ok(&mut owner.conn(), &["MEMBER.DROP", set]);
}
