//! Bench section `cluster`, many items per call (docs/cluster-commands.md): MEXISTS of 100
//! items of every slot, sent to the set name's node, which asks the other owners over the
//! cluster bus, against the same 100 lookups as a cluster pipeline of EXISTS (one pipeline per
//! primary, all written before any reply is read, as redis-py's cluster pipeline does), from
//! the same number of clients.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use redis::ConnectionLike;

use crate::*;
use support::cluster::Cluster;

const SECTION: &str = "Cluster: many items per call, 3 primaries";
/// The target: items/s of MEXISTS of 100 over a cluster pipeline of 100 EXISTS.
const TARGET: f64 = 1.5;
const ITEMS: usize = 100;
/// Clients of the row with the target; the second row, with more, shows where the server's CPU
/// rather than each call's round trips bounds both sides.
const CLIENTS: [usize; 2] = [4, 16];

/// Items answered per second by `clients` threads, each running `call` (which answers
/// `ITEMS` items) in a loop for `secs`.
fn items_per_s(
    clients: usize,
    secs: f64,
    call: &(impl Fn(usize) -> Box<dyn FnMut() + Send> + Sync),
) -> f64 {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let calls: usize = thread::scope(|s| {
        let runs: Vec<_> = (0..clients)
            .map(|k| {
                let mut one = call(k);
                s.spawn(move || {
                    let mut n = 0;
                    while Instant::now() < until {
                        one();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().expect("client")).sum()
    });
    (calls * ITEMS) as f64 / t0.elapsed().as_secs_f64()
}

impl Bench {
    /// MEXISTS of 100 vs a cluster pipeline of 100 EXISTS: 90 absent items and 10 members,
    /// over every slot.
    pub(crate) fn cluster_batches(&mut self, cl: &Cluster) {
        progress("cluster: MEXISTS of 100 vs a cluster pipeline of 100 EXISTS, 4 and 16 clients");
        let items: Vec<String> = (0..ITEMS)
            .map(|i| {
                if i % 10 == 0 {
                    format!("m{}", i + 1)
                } else {
                    format!("batch-absent-{i}")
                }
            })
            .collect();
        let layout = cl.slots();
        let port_of = |item: &str| {
            let slot = cl.keyslot(item);
            layout
                .iter()
                .find(|r| (r.first..=r.last).contains(&slot))
                .map(|r| r.primary_port)
                .expect("every slot served")
        };
        let mut by_node: HashMap<u16, Vec<&str>> = HashMap::new();
        for it in &items {
            by_node.entry(port_of(it)).or_default().push(it);
        }
        let owner = cl.set_owner(SET).port();
        let mexists = |_| -> Box<dyn FnMut() + Send> {
            let mut c = vk_conn(owner);
            let mut q = redis::cmd("MEMBER.MEXISTS");
            q.arg(SET).arg("ITEMS").arg(&items);
            let packed = q.get_packed_command();
            Box::new(move || {
                let v: redis::Value = c.req_packed_command(&packed).expect("MEXISTS");
                assert!(
                    matches!(&v, redis::Value::Array(a) if a.len() == ITEMS),
                    "{v:?}"
                );
            })
        };
        let pipeline = |_| -> Box<dyn FnMut() + Send> {
            let mut nodes: Vec<(redis::Connection, Vec<u8>, usize)> = by_node
                .iter()
                .map(|(port, its)| {
                    let mut p = redis::pipe();
                    for it in its {
                        p.cmd("MEMBER.EXISTS").arg(SET).arg(*it);
                    }
                    (vk_conn(*port), p.get_packed_pipeline(), its.len())
                })
                .collect();
            Box::new(move || {
                for (c, packed, _) in nodes.iter_mut() {
                    c.send_packed_command(packed).expect("send the pipeline");
                }
                for (c, _, n) in nodes.iter_mut() {
                    for _ in 0..*n {
                        let v: redis::Value = c.recv_response().expect("EXISTS");
                        assert!(matches!(v, redis::Value::Int(_)), "{v:?}");
                    }
                }
            })
        };
        let half = self.opts.secs / 2.0;
        for clients in CLIENTS {
            let (m1, p1, p2, m2) = (
                items_per_s(clients, half, &mexists),
                items_per_s(clients, half, &pipeline),
                items_per_s(clients, half, &pipeline),
                items_per_s(clients, half, &mexists),
            );
            let (m, p) = ((m1 + m2) / 2.0, (p1 + p2) / 2.0);
            let ratio = m / p.max(1e-9);
            let first = clients == CLIENTS[0];
            self.r.row(
                SECTION,
                format!(
                    "items/s: MEXISTS of 100 (90 absent, 10 members, every slot) to the set name's \
                     node vs a cluster pipeline of the same 100 EXISTS, {clients} clients{}",
                    if first { "" } else { " (diagnostic)" }
                ),
                format!("{m:.0} items/s"),
                format!("{p:.0} items/s (pipeline)"),
                Some(ratio),
                if first {
                    format!("≥ {TARGET}×")
                } else {
                    "—".to_string()
                },
                first.then_some(ratio >= TARGET),
            );
        }
        self.r.note(format!(
            "cluster batches: the 100 items lie on {} primaries ({}); MEXISTS goes to :{owner}, \
             which answers its own and asks the others",
            by_node.len(),
            by_node
                .iter()
                .map(|(p, v)| format!(":{p} {}", v.len()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}
