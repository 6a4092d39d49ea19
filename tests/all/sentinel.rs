//! Debian's `valkey-sentinel` managing a primary and two replicas: the primary is killed,
//! Sentinel promotes a replica and, when the old primary comes back from its AOF, reconfigures
//! it as a replica of the new one. Readers ask every node, the old primary included, through
//! the whole sequence, for items acknowledged more than the replica lag bound before
//! (docs/replicas.md): none may answer 0, on any node, in any state.
use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use support::lifecycle::{log_tail, wait_linked};
use support::member::*;
use support::sentinel::Sentinel;
use support::{fresh_db, wait_until, Valkey};

const WITHIN: Duration = Duration::from_secs(30);

/// Acknowledged items and when their ADD was acknowledged.
type Acked = Arc<Mutex<Vec<(String, Instant)>>>;

fn connect(port: u16) -> Option<redis::Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let c = c.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(c)
}

/// Adds w0, w1, … to set `s` on whichever node the sentinel names primary.
fn writer(sentinel: &Sentinel, acked: &Acked, stop: &AtomicBool) {
    let mut conns: BTreeMap<u16, redis::Connection> = BTreeMap::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Some(port) = sentinel.primary() else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        let c = match conns.entry(port) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => match connect(port) {
                Some(c) => e.insert(c),
                None => {
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            },
        };
        let item = format!("w{n}");
        match redis::cmd("MEMBER.ADD")
            .arg("s")
            .arg(&item)
            .query::<Value>(c)
        {
            Ok(Value::Int(_)) => {
                acked.lock().unwrap().push((item, Instant::now()));
                n += 1;
            }
            _ => {
                conns.remove(&port);
                thread::sleep(Duration::from_millis(50));
            }
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Asks node `port` for items acknowledged more than `bound` ago; records every 0.
fn reader(port: u16, bound: Duration, acked: &Acked, stop: &AtomicBool) -> (u64, Vec<String>) {
    let (mut asked, mut zeros, mut con, mut i) = (0u64, Vec::new(), None, 0usize);
    while !stop.load(Ordering::Relaxed) {
        let item = {
            let a = acked.lock().unwrap();
            let old: Vec<&String> = a
                .iter()
                .filter(|(_, t)| t.elapsed() > bound)
                .map(|(s, _)| s)
                .collect();
            i = i.wrapping_add(7919);
            (!old.is_empty()).then(|| old[i % old.len()].clone())
        };
        let Some(item) = item else {
            thread::sleep(Duration::from_millis(20));
            continue;
        };
        if con.is_none() {
            con = connect(port);
        }
        let Some(c) = con.as_mut() else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        match redis::cmd("MEMBER.EXISTS")
            .arg("s")
            .arg(&item)
            .query::<Value>(c)
        {
            Ok(Value::Int(0)) => zeros.push(format!("{item} on :{port}")),
            Ok(_) => {}
            // UNAVAILABLE, LOADING, a node down: never a wrong answer.
            Err(e) if e.is_io_error() || e.is_connection_dropped() => con = None,
            Err(_) => {}
        }
        asked += 1;
    }
    (asked, zeros)
}

/// Sets its flag when dropped, on the way out of a panic too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_sentinel_failover_and_the_old_primary_back_as_a_replica_answer_no_zero() {
    let db = fresh_db();
    // The default database timeout: a CREATE's DDL on the shared database must not time out
    // on a busy machine.
    let cfg = [
        ("member.sync-interval-ms", "200"),
        ("repl-diskless-sync-delay", "0"),
        ("appendonly", "yes"),
    ];
    let mut primary = start_loaded(&db.url(), &cfg);
    let replicaof = format!("127.0.0.1 {}", primary.port());
    let mut with_primary = cfg.to_vec();
    with_primary.push(("replicaof", replicaof.as_str()));
    let replicas: Vec<Valkey> = (0..2)
        .map(|_| start_loaded(&db.url(), &with_primary))
        .collect();
    let mut p = primary.conn();
    ok(&mut p, &["MEMBER.CREATE", "s"]);
    for r in &replicas {
        let mut c = r.conn();
        wait_linked(r, &mut c, WITHIN);
    }
    let sentinel = Sentinel::start(primary.port(), 1000, 2);
    let bound = Duration::from_millis(
        info_field(&mut p, "replica_lag_bound_ms")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            + 300,
    );

    let acked: Acked = Arc::default();
    let stop = AtomicBool::new(false);
    let ports: Vec<u16> = std::iter::once(primary.port())
        .chain(replicas.iter().map(|r| r.port()))
        .collect();
    let (old_port, results) = thread::scope(|sc| {
        // Whatever happens below (a failed check panics), the clients stop, or the scope
        // would wait for them for ever.
        let _stop = StopOnDrop(&stop);
        let w = sc.spawn(|| writer(&sentinel, &acked, &stop));
        let readers: Vec<_> = ports
            .iter()
            .map(|&port| {
                let (acked, stop) = (&acked, &stop);
                sc.spawn(move || reader(port, bound, acked, stop))
            })
            .collect();
        let enough = |n: usize| wait_until(WITHIN, || acked.lock().unwrap().len() >= n);
        assert!(enough(200), "the writer never got going");
        thread::sleep(bound);
        // The primary dies; the sentinel promotes a replica.
        let old_port = primary.port();
        primary.kill9();
        assert!(
            wait_until(WITHIN, || sentinel.primary().is_some_and(|p| p != old_port)),
            "the sentinel never promoted a replica\n{}",
            sentinel.log()
        );
        let before = acked.lock().unwrap().len();
        assert!(
            enough(before + 200),
            "no ADD acknowledged by the new primary"
        );
        // The old primary comes back from its AOF; the sentinel makes it a replica (and
        // closes its clients' connections then: each check opens its own).
        primary.restart();
        let field = |section: &str, name: &str| {
            connect(old_port).map(|mut o| match section {
                "member" => info_field(&mut o, name),
                s => info_section(&mut o, s, name),
            })
        };
        let reads = |section: &str, name: &str, want: &str| {
            field(section, name).is_some_and(|v| v.as_deref() == Ok(want))
        };
        // The sentinel looks at a returning old primary once per INFO period (10 s).
        assert!(
            wait_until(WITHIN * 2, || reads("replication", "role", "slave")
                && reads("replication", "master_link_status", "up")),
            "the sentinel never made the old primary a replica: {:?}\n{}",
            field("replication", "role"),
            sentinel.log()
        );
        assert!(
            wait_until(WITHIN, || reads("member", "serves_absent", "1")),
            "the old primary never served \"absent\" as a replica: {:?}\n{}",
            field("member", "serves_absent_withheld"),
            log_tail(&primary)
        );
        // Readers go on past the bound on the reconfigured node.
        let now = acked.lock().unwrap().len();
        assert!(enough(now + 200));
        thread::sleep(bound * 2);
        stop.store(true, Ordering::Relaxed);
        w.join().unwrap();
        let results: Vec<(u64, Vec<String>)> =
            readers.into_iter().map(|r| r.join().unwrap()).collect();
        (old_port, results)
    });
    let zeros: Vec<&String> = results.iter().flat_map(|(_, z)| z).collect();
    let asked: Vec<u64> = results.iter().map(|(a, _)| *a).collect();
    assert!(
        zeros.is_empty(),
        "{} lookups of items acknowledged more than the lag bound before answered 0 \
         (asked per node {asked:?}): {:?}",
        zeros.len(),
        &zeros[..zeros.len().min(20)]
    );
    assert!(
        asked.iter().all(|a| *a > 100),
        "a reader hardly asked: {asked:?} (old primary :{old_port} first)"
    );
}
