//! Section `pooler` (docs/pooler.md): the same database lookups (present, uncached items) and
//! the same ADDs of new items, 64 clients, through pgbouncer in transaction pooling and in
//! session pooling against a direct connection; and what the pooled way would cost a direct
//! connection (`member.pg-pooler yes` without a pooler), the reason it is not used there.
//! Each side is a fresh valkey-server on the bench's database (its own cache, its filter built
//! from the table), so no side finds the others' items cached.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::support::pgbouncer::{Mode, Pgbouncer};
use crate::*;

/// One node of the comparison: its server and the next item it looks up or adds.
struct Node {
    name: &'static str,
    vk: support::Valkey,
    next_lookup: AtomicU64,
    next_add: AtomicU64,
}

impl Bench {
    pub(crate) fn pooler(&mut self) {
        const CLIENTS: usize = 64;
        progress("behind pgbouncer: lookups and ADDs, direct vs session vs transaction pooling");
        let n = self.opts.members;
        let db_name = self.db.name.clone();
        let direct_url = self.db.url();
        let urls: [(&'static str, String, &'static str); 4] = [
            ("direct", direct_url.clone(), "auto"),
            (
                "transaction",
                Pgbouncer::get(Mode::Transaction).url(&db_name),
                "auto",
            ),
            (
                "session",
                Pgbouncer::get(Mode::Session).url(&db_name),
                "auto",
            ),
            ("pooled-direct", direct_url, "yes"),
        ];
        let extra = Self::extra(&self.opts);
        let nodes: Vec<Node> = urls
            .into_iter()
            .enumerate()
            .map(|(i, (name, url, pooler))| {
                let mut cfg: Vec<(&str, &str)> =
                    extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
                cfg.push(("member.pg-pooler", pooler));
                let vk = start_loaded(&url, &cfg);
                let mut c = vk.conn();
                // Its own filter, from the table (the catalog names the set; the node builds it).
                let built = support::wait_until(Duration::from_secs(600), || {
                    let i = set_info_all(&mut c);
                    i.get("filter_complete").map(String::as_str) == Some("1")
                        && i.get("filter_caught_up").map(String::as_str) == Some("1")
                });
                assert!(built, "{name}: the filter was never built:\n{}", vk.log());
                Node {
                    name,
                    vk,
                    // Each node from its own quarter of the order: no side reads rows another
                    // side has just brought into PostgreSQL's buffers (the direct node, which
                    // runs in every pair, may reach into the next quarter: never the pooled
                    // sides' advantage).
                    next_lookup: AtomicU64::new(i as u64 * n / 4),
                    next_add: AtomicU64::new(0),
                }
            })
            .collect();
        let half = self.half();
        // An event-loop client (2 threads) on both sides, as in the cold path.
        let load = RawLoad {
            threads: 2,
            conns_per_thread: CLIENTS / 2,
            pipeline: 1,
            limit: Limit::Time(half),
        };
        // Each measurement starts once the last one's aftermath has ended (`settle`).
        let pg = std::sync::Mutex::new(self.db.client());
        let settle = || settle(&mut pg.lock().unwrap(), &nodes);
        let add_load = |node: &Node, load: &RawLoad| {
            let gen = |_: &mut Rng, buf: &mut Vec<u8>| {
                let k = node.next_add.fetch_add(1, Ordering::Relaxed);
                let item = format!("pool:{}:{k}", node.name);
                push_cmd(buf, &[b"MEMBER.ADD", SET.as_bytes(), item.as_bytes()]);
                Expect::Yes
            };
            raw_load(node.vk.port(), load, &gen)
        };
        let lookups = |node: &Node| {
            settle();
            let gen = |_: &mut Rng, buf: &mut Vec<u8>| {
                let k = node.next_lookup.fetch_add(1, Ordering::Relaxed);
                // The members in a scattered order, each looked up once on a node (a prime
                // step through them): a batch's items lie apart in the table, as real
                // lookups do, not on the same few pages as consecutive ones.
                let item = format!("m{}", 1 + k.wrapping_mul(299_993) % n);
                push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
                Expect::Yes
            };
            raw_load(node.vk.port(), &load, &gen)
        };
        let adds = |node: &Node| {
            settle();
            add_load(node, &load)
        };
        // A short ADD load on every node first: the first ADDs into the loaded table (its new
        // pages, the change log's first rows) cost more than later ones, and the first pair
        // measured would otherwise pay for them on one side only.
        let warm = RawLoad {
            limit: Limit::Time(Duration::from_millis(500)),
            ..load
        };
        for node in &nodes {
            add_load(node, &warm);
        }
        let direct = &nodes[0];
        for (node, target, title) in [
            (
                &nodes[1],
                Some(0.8),
                "Behind pgbouncer, transaction pooling, 64 clients",
            ),
            (
                &nodes[2],
                None,
                "Behind pgbouncer, session pooling, 64 clients",
            ),
            (
                &nodes[3],
                None,
                "The pooled way on a direct connection (member.pg-pooler yes), 64 clients",
            ),
        ] {
            let (p, d) = abba(|| lookups(node), || lookups(direct));
            self.r.pair(
                title,
                "EXISTS of present, uncached items (each one a database lookup)",
                &p,
                &d,
                target,
                None,
                "the same lookups over a direct connection",
            );
            let (p, d) = abba(|| adds(node), || adds(direct));
            self.r.pair(
                title,
                "MEMBER.ADD of new items",
                &p,
                &d,
                target,
                None,
                "the same ADDs over a direct connection",
            );
        }
        // How many items a statement carried on each node (lookups and ADDs together): a
        // pooled statement is planned at every call, so its cost per item falls with this.
        let per_batch: Vec<String> = nodes
            .iter()
            .map(|n| {
                let mut c = n.vk.conn();
                let b = member_counter(&mut c, "member_db_batches");
                let p = member_counter(&mut c, "member_db_batched_points");
                format!("{} {:.1}", n.name, if b > 0.0 { p / b } else { 0.0 })
            })
            .collect();
        self.r.note(format!(
            "pooler: items per database statement, lookups and ADDs: {}",
            per_batch.join(", ")
        ));
        let mut c = direct.vk.conn();
        self.r.note(format!(
            "pooler: pgbouncer 1.18, stock configuration (default_pool_size 20), on this machine; \
             member.workers = {}",
            config_value(&mut c, "member.workers").unwrap_or_else(|| "?".into()),
        ));
    }
}

/// Waits until what the last measurement left behind has ended, so that it does not weigh on
/// the next one: every node's sync has read every write committed so far (each node reads
/// every other node's ADDs from the change log), and no autovacuum worker runs. Without it the
/// first side measured after the warm-up, or after the other side's ADDs, paid for their
/// aftermath: two direct nodes compared this way measured 0.81x for lookups.
fn settle(pg: &mut postgres::Client, nodes: &[Node]) {
    let xmax: i64 = pg
        .query_one(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint",
            &[],
        )
        .expect("xmax")
        .get(0);
    let quiet = support::wait_until(Duration::from_secs(120), || {
        let vacuums: i64 = pg
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'",
                &[],
            )
            .expect("pg_stat_activity")
            .get(0);
        vacuums == 0
            && nodes.iter().all(|n| {
                let i = set_info_all(&mut n.vk.conn());
                i.get("sync_watermark_xid")
                    .and_then(|w| w.parse::<i64>().ok())
                    .is_some_and(|w| w >= xmax)
            })
    });
    assert!(quiet, "the nodes' sync never caught up with xid {xmax}");
}
