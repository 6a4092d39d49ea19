//! Section `cold`: present, uncached items (every lookup needs PostgreSQL) against pgbench's
//! prepared point query, 64 clients, and the ceiling of the same connections.

use std::sync::atomic::Ordering;

use crate::*;

impl Bench {
    pub(crate) fn cold_path(&mut self) {
        const CLIENTS: usize = 64;
        progress(
            "cold path: EXISTS of present, uncached items vs pgbench (prepared point query), 64 clients",
        );
        let port = self.port;
        let half = self.half();
        let n = self.opts.members;
        let cold_next = &self.cold_next;
        let mut c = self.vk.conn();
        let before = set_info_all(&mut c);
        // Both sides use an event-loop client (2 threads), so the figure compares what the
        // servers spend per lookup, not 64 client threads fighting over two CPUs.
        let load = RawLoad {
            threads: 2,
            conns_per_thread: CLIENTS / 2,
            pipeline: 1,
            limit: Limit::Time(half),
        };
        let gen = |_: &mut Rng, buf: &mut Vec<u8>| {
            // Members from n/2 on were never looked up; wrap (warm) only if a run ever gets
            // through half the set.
            let k = cold_next.fetch_add(1, Ordering::Relaxed);
            let item = format!("m{}", (k - 1) % n + 1);
            push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
            Expect::Yes
        };
        let db = &self.db;
        let (e, p) = abba(
            || raw_load(port, &load, &gen),
            || pgbench(db, n, CLIENTS, half),
        );
        self.r.pair(
            "Cold path (every lookup needs PostgreSQL), 64 clients",
            "present, uncached items",
            &e,
            &p,
            Some(2.0),
            None,
            "pgbench -M prepared -c 64 -j 2: one point query per lookup",
        );
        // The ceiling on this machine: the same generator and connections running GET, which
        // does no database work at all, against the same pgbench.
        let get = |_: &mut Rng, buf: &mut Vec<u8>| {
            push_cmd(buf, &[b"GET", PRESENT_KEY.as_bytes()]);
            Expect::Yes
        };
        let (g, p2) = abba(
            || raw_load(port, &load, &get),
            || pgbench(db, n, CLIENTS, half),
        );
        self.r.pair(
            "Cold path (every lookup needs PostgreSQL), 64 clients",
            "diagnostic: ceiling, GET of a present key with the same 64 connections",
            &g,
            &p2,
            None,
            None,
            "pgbench -M prepared -c 64 -j 2: one point query per lookup",
        );
        let after = set_info_all(&mut c);
        let d = |k: &str| num(&after, k) - num(&before, k);
        let used = self.cold_next.load(Ordering::Relaxed) - (n / 2 + 1);
        self.r.note(format!(
            "cold EXISTS: {:.1} % of lookups answered by the database (db-hit), {:.1} % from the cache{}; member.workers = {}",
            100.0 * d("path_db_hit") / d("exists_calls").max(1.0),
            100.0 * d("path_cache_hit") / d("exists_calls").max(1.0),
            if used > n / 2 { " (the cold range wrapped: some items were warm)" } else { "" },
            config_value(&mut c, "member.workers").unwrap_or_else(|| "?".into()),
        ));
    }
}
