//! A cluster primary killed with -9 under writes: its replica is promoted, and the old primary
//! restarts on its AOF and rejoins as the new primary's replica. `READONLY` readers on it ask
//! right after each acknowledgement: while it does not answer "absent" from its filter
//! (docs/replicas.md) no acknowledged item answers 0 there; once it does, every item
//! acknowledged more than the lag bound before answers 1. On the failover tests' own cluster.
use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use support::member::{info_field, set_info};
use support::wait_until;

use super::cluster_reshard::failover_cluster;
use crate::chaos_harness::router::keyslot;

const WITHIN: Duration = Duration::from_secs(30);

fn readonly(port: u16) -> Option<Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut c = c.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    redis::cmd("READONLY").query::<()>(&mut c).ok()?;
    Some(c)
}

fn add(c: &mut Connection, set: &str, item: &str) -> bool {
    matches!(
        redis::cmd("MEMBER.ADD")
            .arg(set)
            .arg(item)
            .query::<Value>(c),
        Ok(Value::Int(_))
    )
}

#[test]
fn a_killed_primary_back_as_a_replica_answers_no_zero_to_readonly_readers() {
    let mut guard = failover_cluster();
    let cl = &mut *guard;
    cl.wait_healthy(WITHIN, true)
        .expect("cluster healthy before the failover");
    cl.refresh_roles();
    let victim = cl.primaries().next().unwrap().port();
    let heir = cl.replica_of(cl.node_by_port(victim)).port();
    let set = format!("rr_{}", std::process::id());
    cl.create_everywhere(&set);
    let slots: HashSet<u16> = cl.slots_of(cl.node_by_port(victim)).into_iter().collect();
    let mine = |prefix: &'static str| {
        let slots = slots.clone();
        (0..)
            .map(move |i| format!("{prefix}{i}"))
            .filter(move |s| slots.contains(&keyslot(s.as_bytes())))
    };
    let mut v = cl.node_by_port(victim).conn();
    let before: Vec<String> = mine("b").take(50).collect();
    for item in &before {
        assert!(add(&mut v, &set, item), "ADD {item} on :{victim}");
    }
    assert!(
        wait_until(WITHIN, || set_info(&mut v, &set, "filter_serves_absent")
            .as_deref()
            == Ok("1")),
        "the primary's filter never served \"absent\""
    );

    // As the failover tests do: the cluster settles before the kill (under load, a kill right
    // after the set's creation once left a nodes.conf the restart refused as corrupted).
    std::thread::sleep(Duration::from_secs(2));
    cl.kill9(victim);
    assert!(
        wait_until(WITHIN, || cl.is_primary_now(heir)) && cl.wait_healthy(WITHIN, false).is_ok(),
        "the replica :{heir} was not promoted"
    );
    let mut h = cl.node_by_port(heir).conn();
    let mut acked: Vec<(String, Instant)> = Vec::new();
    let mut fresh = mine("a");
    let mut write = |h: &mut Connection, acked: &mut Vec<(String, Instant)>| {
        let item = fresh.next().unwrap();
        assert!(add(h, &set, &item), "ADD {item} on the new primary :{heir}");
        acked.push((item.clone(), Instant::now()));
        item
    };
    for _ in 0..50 {
        write(&mut h, &mut acked);
    }
    cl.restart(victim);
    let mut zeros = Vec::new();
    let (mut asked, mut r) = (0, None);
    let serving = |r: &mut Option<Connection>| {
        r.as_mut()
            .is_some_and(|c| info_field(c, "serves_absent").as_deref() == Ok("1"))
    };
    let began = Instant::now();
    while began.elapsed() < WITHIN * 2 {
        let item = write(&mut h, &mut acked);
        if r.is_none() {
            r = readonly(victim);
        }
        let Some(c) = r.as_mut() else { continue };
        match redis::cmd("MEMBER.EXISTS")
            .arg(&set)
            .arg(&item)
            .query::<Value>(c)
        {
            Ok(Value::Int(0)) if !serving(&mut r) => zeros.push(item),
            Ok(Value::Int(_)) => asked += 1,
            Err(e) if e.is_io_error() || e.is_connection_dropped() => r = None,
            _ => {}
        }
        if serving(&mut r) {
            break;
        }
    }
    assert!(
        zeros.is_empty(),
        "{} acknowledged items answered 0 on the old primary back as a replica before it \
         served \"absent\": {zeros:?}",
        zeros.len()
    );
    assert!(
        serving(&mut r),
        "the old primary never served \"absent\" as a replica"
    );
    assert!(
        asked > 0,
        "the old primary was never asked before it served"
    );
    let mut c = r.expect("connected");
    let bound = Duration::from_millis(
        info_field(&mut c, "replica_lag_bound_ms")
            .unwrap()
            .parse()
            .unwrap(),
    );
    assert_eq!(info_field(&mut c, "replica_link").unwrap(), "up");
    std::thread::sleep(bound);
    let late: Vec<&String> = before
        .iter()
        .chain(acked.iter().map(|(i, _)| i))
        .filter(|i| {
            !matches!(
                redis::cmd("MEMBER.EXISTS")
                    .arg(&set)
                    .arg(i)
                    .query::<Value>(&mut c),
                Ok(Value::Int(1))
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "items acknowledged more than the lag bound before do not answer 1 on the replica: \
         {late:?}"
    );
    cl.wait_healthy(WITHIN, true)
        .expect("the cluster did not heal");
    cl.drop_everywhere(&set);
}
