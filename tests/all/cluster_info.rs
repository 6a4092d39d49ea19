//! MEMBER.INFO over a cluster (docs/cluster-commands.md): routed by the set name, the node that
//! runs it asks every node for its part and answers once with the set's definition, totals over
//! the nodes and each node's fields; a node that does not answer in time is listed, not fatal.
//! MEMBER.NODEINFO gives one node's part wherever it is sent. The shared cluster (3 primaries,
//! 3 replicas).
use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;
use support::cluster::{
    cli_follow, stall_exclusive, stall_shared, while_stopped, Cluster, ConfigFor, Node,
};
use support::member::*;
use support::wait_until;

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}

/// A cluster-wide MEMBER.INFO: its top-level fields and each node's fields.
struct Wide {
    top: HashMap<String, String>,
    nodes: Vec<HashMap<String, String>>,
}

fn pairs(v: &[Value]) -> HashMap<String, String> {
    v.chunks(2).map(|p| (text(&p[0]), text(&p[1]))).collect()
}

fn wide(c: &mut impl redis::ConnectionLike, set: &str) -> Wide {
    let v: Value = redis::cmd("MEMBER.INFO").arg(set).query(c).unwrap();
    let Value::Array(all) = v else {
        panic!("MEMBER.INFO {set}: {v:?}")
    };
    let mut top = HashMap::new();
    let mut nodes = Vec::new();
    for p in all.chunks(2) {
        match (&p[0], &p[1]) {
            (k, Value::Array(list)) if text(k) == "nodes" => {
                for n in list {
                    let Value::Array(f) = n else { panic!("{n:?}") };
                    nodes.push(pairs(f));
                }
            }
            (k, v) => {
                top.insert(text(k), text(v));
            }
        }
    }
    Wide { top, nodes }
}

fn num(m: &HashMap<String, String>, k: &str) -> i64 {
    m.get(k)
        .unwrap_or_else(|| panic!("no {k} in {m:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{k} = {:?}", m[k]))
}

fn create(cl: &Cluster, set: &str) {
    ok(&mut cl.set_owner(set).conn(), &["MEMBER.CREATE", set]);
    cl.wait_ready(set);
}

/// From any client, the same answer: the definition once, totals that are the sums of the
/// nodes' own figures, and one entry per node whose fields are what MEMBER.NODEINFO says there.
#[test]
fn info_reports_the_set_over_every_node() {
    let _stall = stall_shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "wide_info";
    create(cl, set);
    let items: Vec<String> = (0..90).map(|i| format!("info-{i}")).collect();
    let mut c = cl.client();
    let added: Vec<i64> = redis::cmd("MEMBER.MADD")
        .arg(set)
        .arg("ITEMS")
        .arg(&items)
        .query(&mut c)
        .unwrap();
    assert_eq!(added, vec![1; 90]);
    let _: Vec<i64> = redis::cmd("MEMBER.MEXISTS")
        .arg(set)
        .arg("ITEMS")
        .arg(&items)
        .query(&mut c)
        .unwrap();
    let w = wide(&mut c, set);
    assert_eq!(w.top["name"], set);
    assert_eq!(
        Ok(w.top["capacity"].clone()),
        set_info(&mut cl.set_owner(set).conn(), set, "capacity")
    );
    assert_eq!(num(&w.top, "cluster_nodes"), 6);
    assert_eq!(num(&w.top, "cluster_nodes_answered"), 6);
    assert_eq!(num(&w.top, "cluster_slots_owned"), 16384);
    assert_eq!(num(&w.top, "adds_new"), 90);
    assert_eq!(w.nodes.len(), 6);
    let mut roles: Vec<&str> = w.nodes.iter().map(|n| n["role"].as_str()).collect();
    roles.sort();
    assert_eq!(
        roles,
        ["primary", "primary", "primary", "replica", "replica", "replica"]
    );
    let by_port: HashMap<u16, &Node> = cl.nodes.iter().map(|n| (n.port(), n)).collect();
    let mut filter_items = 0;
    for n in &w.nodes {
        assert_eq!(n["state"], "ok", "{n:?}");
        assert_eq!(n["cluster_node"], n["node_id"]);
        let port: u16 = n["address"].rsplit(':').next().unwrap().parse().unwrap();
        // The node's part is what it says of itself (counters may have moved since: not those).
        let mut nc = by_port[&port].conn();
        for k in [
            "cluster_role",
            "cluster_slots_owned",
            "filter_items",
            "adds_new",
        ] {
            assert_eq!(
                Ok(n[k].clone()),
                set_info(&mut nc, set, k),
                "{k} of {}",
                n["address"]
            );
        }
        if n["role"] == "primary" {
            filter_items += num(n, "filter_items");
        }
    }
    assert_eq!(num(&w.top, "filter_items"), filter_items);
    // valkey-cli -c from a node that does not serve the set name: one MOVED, then the answer.
    let other = cl
        .nodes
        .iter()
        .find(|n| n.port() != cl.set_owner(set).port())
        .unwrap();
    let shown = cli_follow(other.port(), &["MEMBER.INFO", set]);
    assert!(
        shown.lines().any(|l| l.trim() == "cluster_nodes_answered"),
        "{shown}"
    );
}

/// A node that does not answer within `member.db-timeout-ms` (it is stopped) is listed
/// with `state` `timeout`, and the call still answers with the others' parts.
#[test]
fn a_node_too_slow_to_answer_is_listed_not_fatal() {
    let _stall = stall_exclusive();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "wide_info_slow";
    create(cl, set);
    let receiver = cl.set_owner(set);
    let slow = cl.replica_of(receiver);
    let w = {
        let _short = ConfigFor::set(receiver, "member.db-timeout-ms", "200");
        while_stopped(slow, || wide(&mut receiver.conn(), set))
    };
    assert_eq!(num(&w.top, "cluster_nodes"), 6);
    assert_eq!(num(&w.top, "cluster_nodes_answered"), 5);
    let late: Vec<_> = w.nodes.iter().filter(|n| n["state"] != "ok").collect();
    assert_eq!(late.len(), 1, "{:?}", w.nodes);
    assert_eq!(late[0]["state"], "timeout");
    assert!(late[0]["address"].ends_with(&format!(":{}", slow.port())));
    assert!(!late[0].contains_key("filter_items"));
}

/// CREATE, ALTER and DROP tell every other node to read the catalog again at once: with the
/// periodic check a minute apart, the other nodes still hold the new settings and forget the
/// dropped set within seconds. A cluster of its own (3 primaries), checking the catalog once
/// a minute.
#[test]
fn alter_and_drop_reach_every_node_at_once() {
    let cl = Cluster::start_primaries_only(&[("member.sync-interval-ms", "60000")]);
    let set = "told_everywhere";
    let owner = cl.set_owner(set);
    ok(
        &mut owner.conn(),
        &["MEMBER.CREATE", set, "CACHE-TTL", "30"],
    );
    let others: Vec<&Node> = cl
        .primaries()
        .filter(|n| n.port() != owner.port())
        .collect();
    // Every other primary shows CACHE-TTL `want` within `wait`.
    let all_show = |want: &str, wait: u64, failed: &str| {
        for n in &others {
            let mut c = n.conn();
            assert!(
                wait_until(Duration::from_secs(wait), || set_info(
                    &mut c,
                    set,
                    "cache_ttl"
                )
                .as_deref()
                    == Ok(want)),
                "{} {failed}",
                n.addr()
            );
        }
    };
    // Each learns the set now: NODEINFO asks the catalog about a set it does not know.
    all_show("30", 20, &format!("never learned {set}"));
    ok(&mut owner.conn(), &["MEMBER.ALTER", set, "CACHE-TTL", "45"]);
    all_show("45", 10, "still holds the old CACHE-TTL");
    ok(&mut owner.conn(), &["MEMBER.DROP", set]);
    for n in &others {
        let mut c = n.conn();
        assert!(
            wait_until(Duration::from_secs(10), || set_info(
                &mut c,
                set,
                "cache_ttl"
            )
            .is_err_and(|e| e.0.contains("no such set"))),
            "{} still serves the dropped set",
            n.addr()
        );
    }
}

/// A set a node cannot serve (an attached set whose source table is gone) is retried with a wait that doubles after each
/// failure, not every 2 s for ever, and NODEINFO says why and how long the next wait is.
#[test]
fn a_set_a_node_cannot_serve_backs_off_and_says_why() {
    let _stall = stall_shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "cannot_serve";
    // A set whose source table is not there (dropped behind the module's back): written into
    // the catalog directly, as the CREATE that made it would have, then the table is gone.
    cl.db()
        .client()
        .batch_execute(&format!(
            "INSERT INTO member_catalog (name, error_rate, capacity, cache_ttl, recent_ttl,
                                         normalize, source_schema, source_table, source_column,
                                         source_sync)
             VALUES ('{set}', 0.01, 1000, 300, 10, 'none', 'public', 'cannot_serve_src',
                     'name', 'log');
             UPDATE member_catalog_version SET version = version + 1"
        ))
        .unwrap();
    let node = cl.primaries().next().unwrap();
    let mut c = node.conn();
    let failures = |c: &mut redis::Connection| -> i64 {
        set_info(c, set, "rebuild_failures").map_or(0, |v| v.parse().unwrap())
    };
    assert!(
        wait_until(Duration::from_secs(60), || failures(&mut c) >= 3),
        "{}: {:?}",
        node.addr(),
        set_info(&mut c, set, "last_rebuild_error")
    );
    let v: Vec<String> = redis::cmd("MEMBER.NODEINFO")
        .arg(set)
        .query(&mut c)
        .unwrap();
    let f: HashMap<&str, &str> = v
        .chunks(2)
        .map(|p| (p[0].as_str(), p[1].as_str()))
        .collect();
    assert!(
        f["last_rebuild_error"].contains("cannot_serve_src"),
        "{f:?}"
    );
    let n: u32 = f["rebuild_failures"].parse().unwrap();
    let wait: u64 = f["rebuild_retry_wait_s"].parse().unwrap();
    assert_eq!(wait, (2u64 << (n - 1).min(16)).min(300), "{f:?}");
    cl.drop_everywhere(set);
}
