//! MEMBER.MEXISTS and MEMBER.MADD over a cluster (docs/cluster-commands.md): routed by the set
//! name, the receiving node splits the items by the owner of each canonical slot, decides its
//! own, asks the other owners over the cluster bus and answers once, in the order given, the
//! same as one call per item; never a partial array. The shared cluster (3 primaries, 3
//! replicas); the slot-move test on the second one kept for slot moves.
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use redis::Connection;
use support::cluster::{
    cli_follow, stall_exclusive, stall_shared, while_stopped, Cluster, ConfigFor, Migrating, Node,
};
use support::member::*;
use support::wait_until;

fn create(cl: &Cluster, set: &str) {
    ok(
        &mut cl.set_owner(set).conn(),
        &["MEMBER.CREATE", set, "NORMALIZE", "lower"],
    );
    cl.wait_ready(set);
}

fn many(c: &mut impl redis::ConnectionLike, cmd: &str, set: &str, items: &[String]) -> Vec<i64> {
    redis::cmd(cmd)
        .arg(set)
        .arg("ITEMS")
        .arg(items)
        .query(c)
        .unwrap_or_else(|e| panic!("{cmd} {set}: {e}"))
}

fn many_err(c: &mut Connection, cmd: &str, set: &str, items: &[String]) -> String {
    match redis::cmd(cmd)
        .arg(set)
        .arg("ITEMS")
        .arg(items)
        .query::<Vec<i64>>(c)
    {
        Ok(v) => panic!("{cmd} {set} answered {v:?}"),
        Err(e) => format!(
            "{}{}",
            e.code().unwrap_or(""),
            e.detail().map(|d| format!(" {d}")).unwrap_or_default()
        ),
    }
}

fn counter(n: &Node, name: &str) -> i64 {
    info_field(&mut n.conn(), name)
        .unwrap_or_else(|e| panic!("{e} on {}", n.addr()))
        .parse()
        .unwrap()
}

/// The primaries serving the canonical slots of `items` (lowercased, as `NORMALIZE lower`).
fn owners(cl: &Cluster, items: &[String]) -> BTreeSet<u16> {
    items
        .iter()
        .map(|i| cl.owner(cl.keyslot(&i.to_lowercase())).port())
        .collect()
}

/// The rule: every client sends them without options, and the answers equal the
/// per-item calls. Items in mixed case, so their canonical slots differ from the raw ones.
#[test]
fn mexists_and_madd_across_slots_answer_as_the_per_item_calls() {
    let _stall = stall_shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "wide_many";
    create(cl, set);
    let items: Vec<String> = (0..150).map(|i| format!("Wide-{i}")).collect();
    let absent: Vec<String> = (0..60).map(|i| format!("Never-{i}")).collect();
    assert_eq!(owners(cl, &items).len(), 3, "the items span every primary");
    let receiver = cl.set_owner(set);
    let others: Vec<&Node> = cl
        .primaries()
        .filter(|n| n.port() != receiver.port())
        .collect();
    let served: Vec<i64> = others
        .iter()
        .map(|n| counter(n, "forwarded_served"))
        .collect();
    // The `redis` crate's cluster client routes by argv[1], the set name.
    let mut c = cl.client();
    assert_eq!(
        many(&mut c, "MEMBER.MADD", set, &items[..100]),
        vec![1; 100]
    );
    for (n, before) in others.iter().zip(served) {
        assert!(
            counter(n, "forwarded_served") > before,
            "{} served no part of the MADD",
            n.addr()
        );
    }
    // Half again, half new: 0 for the first half, 1 for the second.
    let again = many(&mut c, "MEMBER.MADD", set, &items[50..150]);
    let want: Vec<i64> = (50..150).map(|i| i64::from(i >= 100)).collect();
    assert_eq!(again, want);
    // Lookups of absent items are answered by the owners' filters, not the database.
    let negatives = |cl: &Cluster| -> i64 {
        cl.primaries()
            .map(|n| {
                set_info(&mut n.conn(), set, "path_bloom_negative")
                    .unwrap()
                    .parse::<i64>()
                    .unwrap()
            })
            .sum()
    };
    // Members asked twice: the second time every owner, the receiving node included, answers
    // from the exact-match keys (each in its item's slot), not the database.
    let db_hits = |cl: &Cluster| -> i64 {
        cl.primaries()
            .map(|n| {
                set_info(&mut n.conn(), set, "path_db_hit")
                    .unwrap()
                    .parse::<i64>()
                    .unwrap()
            })
            .sum()
    };
    assert_eq!(many(&mut c, "MEMBER.MEXISTS", set, &items), vec![1; 150]);
    let hits = db_hits(cl);
    assert_eq!(many(&mut c, "MEMBER.MEXISTS", set, &items), vec![1; 150]);
    assert_eq!(
        db_hits(cl),
        hits,
        "members asked again went to the database"
    );
    let before = negatives(cl);
    assert_eq!(many(&mut c, "MEMBER.MEXISTS", set, &absent), vec![0; 60]);
    let filtered = negatives(cl) - before;
    assert!(
        filtered >= 50,
        "only {filtered} of 60 absent items were answered by a filter"
    );
    // Each call's timeouts (its client's, and one per owner asked over the bus) are stopped
    // once it is answered, not left to fire `member.db-timeout-ms` later: 30 more calls leave
    // no 90 timers behind on the receiving node (other tests' calls in flight may hold a few).
    for _ in 0..30 {
        assert_eq!(many(&mut c, "MEMBER.MEXISTS", set, &absent), vec![0; 60]);
    }
    let timers: u64 = info_field(&mut receiver.conn(), "timers_waiting")
        .unwrap()
        .parse()
        .unwrap();
    assert!(timers < 30, "{timers} timers wait on {}", receiver.addr());
    // MEXISTS of members and non-members interleaved, in any case: the order given.
    let asked: Vec<String> = items
        .iter()
        .zip(&absent)
        .flat_map(|(a, b)| [a.to_uppercase(), b.clone()])
        .chain(items[absent.len()..].iter().cloned())
        .collect();
    let got = many(&mut c, "MEMBER.MEXISTS", set, &asked);
    let per_item: Vec<i64> = asked
        .iter()
        .map(|i| {
            redis::cmd("MEMBER.EXISTS")
                .arg(set)
                .arg(i)
                .query(&mut c)
                .unwrap()
        })
        .collect();
    let expected: Vec<i64> = asked
        .iter()
        .map(|i| i64::from(!i.starts_with("Never")))
        .collect();
    assert_eq!(per_item, expected);
    assert_eq!(got, expected);
    // valkey-cli -c from a node that does not serve the set name: one MOVED, then the same.
    let first = &asked[..8];
    let mut args = vec!["MEMBER.MEXISTS", set, "ITEMS"];
    args.extend(first.iter().map(String::as_str));
    let shown = cli_follow(others[0].port(), &args);
    let lines: Vec<i64> = shown
        .lines()
        .map(|l| l.trim().parse().unwrap_or_else(|_| panic!("{shown}")))
        .collect();
    assert_eq!(lines, expected[..8], "{shown}");
    // Bad input gets the standalone errors, and a bad MADD writes none of its items.
    let mut oc = receiver.conn();
    for cmd in ["MEMBER.MEXISTS", "MEMBER.MADD"] {
        let bad = [absent[0].clone(), String::new()];
        let e = many_err(&mut oc, cmd, set, &bad);
        assert_eq!(e, "ERR item 2: item is empty", "{cmd}");
    }
    assert_eq!(
        many(&mut oc, "MEMBER.MEXISTS", set, &absent[..1]),
        vec![0],
        "the refused MADD wrote its first item"
    );
    // A replica (READONLY) asks every primary: it owns no slot.
    let replica = cl.replica_of(receiver);
    let mut rc = replica.conn();
    ok(&mut rc, &["READONLY"]);
    assert_eq!(many(&mut rc, "MEMBER.MEXISTS", set, &asked), expected);
    // A write sent to a replica is moved to the primary, as for any write.
    let e = many_err(&mut rc, "MEMBER.MADD", set, &absent[..2]);
    assert!(e.starts_with("MOVED"), "{e}");
}

/// Every node turned TCP_NODELAY on for the cluster-bus links it opened, one to each other
/// node (the server leaves Nagle's algorithm on there, and concurrent parts then wait for
/// delayed ACKs).
#[test]
fn every_node_sets_nodelay_on_the_bus_links_it_opened() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let others = cl.nodes.len() as i64 - 1;
    for n in &cl.nodes {
        assert!(
            wait_until(Duration::from_secs(20), || counter(n, "bus_nodelay_set")
                >= others),
            "{}: bus_nodelay_set {} < {others}",
            n.addr(),
            counter(n, "bus_nodelay_set")
        );
    }
}

/// Racing MADDs of the same items through different nodes' clients: each item gets exactly
/// one 1 over all calls, and then every per-item call says present.
#[test]
fn racing_madds_add_each_item_exactly_once() {
    let _stall = stall_shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "wide_race";
    create(cl, set);
    let items: Vec<String> = (0..200).map(|i| format!("Race-{i}")).collect();
    let answers: Vec<Vec<i64>> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|k| {
                let mut mine = items.clone();
                mine.rotate_left(k * 50);
                let held = &held;
                let items = &items;
                s.spawn(move || {
                    let mut c = held.client();
                    let got = many(&mut c, "MEMBER.MADD", set, &mine);
                    // Back in the order of `items`.
                    let mut out = vec![0; items.len()];
                    for (i, n) in got.into_iter().enumerate() {
                        out[(i + k * 50) % items.len()] = n;
                    }
                    out
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (i, item) in items.iter().enumerate() {
        let ones: i64 = answers.iter().map(|a| a[i]).sum();
        assert_eq!(ones, 1, "{item}: {ones} calls were told they added it");
    }
    let mut c = cl.client();
    assert_eq!(many(&mut c, "MEMBER.MEXISTS", set, &items), vec![1; 200]);
}

/// An owner that does not answer within the receiving node's `member.db-timeout-ms` (its
/// process is stopped): the whole call is UNAVAILABLE, never a partial array; once it is back
/// the same call answers in full.
#[test]
fn an_owner_too_slow_to_answer_makes_the_whole_call_unavailable() {
    let _stall = stall_exclusive();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "wide_slow";
    create(cl, set);
    let receiver = cl.set_owner(set);
    let slow = cl
        .primaries()
        .find(|n| n.port() != receiver.port())
        .unwrap();
    let items: Vec<String> = (0..40).map(|i| format!("slow-{i}")).collect();
    assert!(owners(cl, &items).contains(&slow.port()));
    let mut rc = receiver.conn();
    let e = {
        let _short = ConfigFor::set(receiver, "member.db-timeout-ms", "200");
        while_stopped(slow, || many_err(&mut rc, "MEMBER.MEXISTS", set, &items))
    };
    assert!(
        e.starts_with(
            "UNAVAILABLE a node holding some of the items' canonical slots did not answer"
        ) && e.contains(&format!(":{}", slow.port())),
        "{e}"
    );
    assert!(wait_until(Duration::from_secs(5), || counter(
        receiver,
        "forwarded_waiting"
    ) == 0));
    assert_eq!(many(&mut rc, "MEMBER.MEXISTS", set, &items), vec![0; 40]);
}

/// One of the receiving node's own slots migrating away: a MADD naming an item of it is
/// refused whole (TRYAGAIN) before anything is written, while MEXISTS still answers (the
/// database decides what the filter may not); once the slot is stable again the MADD lands.
#[test]
fn a_madd_naming_a_moving_slot_is_refused_whole_and_writes_nothing() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "wide_moving";
    create(cl, set);
    let receiver = cl.set_owner(set);
    let other = cl
        .primaries()
        .find(|n| n.port() != receiver.port())
        .unwrap();
    let items: Vec<String> = (0..60).map(|i| format!("moving-{i}")).collect();
    let mine = items
        .iter()
        .find(|i| cl.owner(cl.keyslot(i)).port() == receiver.port())
        .expect("an item of the receiving node")
        .clone();
    assert!(owners(cl, &items).len() > 1);
    let slot = cl.keyslot(&mine);
    let stable = Migrating::start(receiver, other, slot);
    let mut rc = receiver.conn();
    let e = many_err(&mut rc, "MEMBER.MADD", set, &items);
    assert!(
        e.starts_with("TRYAGAIN libmember: the canonical slot of one of the items is moving"),
        "{e}"
    );
    assert_eq!(many(&mut rc, "MEMBER.MEXISTS", set, &items), vec![0; 60]);
    drop(stable);
    assert!(wait_until(Duration::from_secs(10), || {
        redis::cmd("MEMBER.MADD")
            .arg(set)
            .arg("ITEMS")
            .arg(&items)
            .query::<Vec<i64>>(&mut rc)
            .is_ok_and(|v| v == vec![1; 60])
    }));
}
