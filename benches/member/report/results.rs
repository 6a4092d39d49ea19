//! The end of a run: the header (machine, versions, other load), the table, how each figure is
//! measured and the notes; printed, and written to bench/results.md and bench/latency.svg.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use crate::*;

impl Bench {
    pub(crate) fn finish(
        mut self,
        module: &std::path::Path,
        took: Duration,
        (load_before, (busy0, total0), own0): (f64, (u64, u64), u64),
    ) {
        let (busy1, total1) = cpu_ticks();
        let own = own_tree_ticks().saturating_sub(own0);
        let span = total1.saturating_sub(total0).max(1) as f64;
        let others = busy1.saturating_sub(busy0).saturating_sub(own) as f64 / span;
        if others > 0.05 {
            self.r.note(format!(
                "other processes used {:.0} % of the CPUs during this run: the figures are noisier \
                 than on an idle machine (both sides of each ratio were exposed alike, A B B A)",
                others * 100.0
            ));
        }
        let mut c = self.vk.conn();
        let valkey = info_stat(&mut c, "server", "valkey_version")
            .or_else(|| info_stat(&mut c, "server", "redis_version"))
            .unwrap_or_else(|| "?".into());
        let mut pg = self.db.client();
        let pg_version: String = pg
            .query_one("SELECT version()", &[])
            .map(|r| r.get(0))
            .unwrap_or_else(|_| "?".into());
        let workers = redis::cmd("CONFIG")
            .arg("GET")
            .arg("member.workers")
            .query::<Vec<String>>(&mut c)
            .ok()
            .and_then(|v| v.get(1).cloned())
            .unwrap_or_else(|| "?".into());
        let errors = info_stat(&mut c, "member", "member_db_errors").unwrap_or_default();
        let timeouts = info_stat(&mut c, "member", "member_db_timeouts").unwrap_or_default();
        if errors != "0" || timeouts != "0" {
            self.r.note(format!(
                "module database errors: {errors}, timeouts: {timeouts}"
            ));
        }

        let mut head = String::new();
        let _ = writeln!(head, "# libmember benchmark\n");
        let _ = writeln!(
            head,
            "{} members (`{TABLE}`, 1 % FPR, CACHE-TTL {CACHE_TTL_S} s), member.workers = {workers}, \
             {:.1} s of load per side of each comparison (two runs, A B B A), whole run {:.0} s, {}.\n",
            thousands(self.opts.members),
            self.opts.secs,
            took.as_secs_f64(),
            utc_now()
        );
        let _ = writeln!(head, "Machine (every figure from the same run on the same servers; load generators share the CPU with the servers):\n");
        for (k, v) in machine() {
            let _ = writeln!(head, "- {k}: {v}");
        }
        let _ = writeln!(
            head,
            "- other load: 1-minute load average {load_before:.2} before the run; processes \
             outside the bench used {:.0} % of all CPUs during it (the bench and its servers: {:.0} %)",
            others * 100.0,
            own as f64 / span * 100.0
        );
        let _ = writeln!(head, "- Valkey: {valkey}");
        let _ = writeln!(head, "- PostgreSQL: {pg_version}");
        let _ = writeln!(
            head,
            "- module: `{}`\n",
            module
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap_or(module)
                .display()
        );
        let table = self.r.table();
        let mut notes = String::from(
            "\nHow each figure is measured:\n\n\
             - Negative path: `valkey-benchmark -c 50 [-P 16] -r 1000000000 MEMBER.EXISTS bench absent:__rand_int__` \
             vs `GET bench:present`; latency is per request (a pipelined batch's latency for each of its requests). \
             The recurring pool is the same command with `-r 100000`: 100 000 absent items checked again and again.\n\
             - Mixed: a Rust RESP generator, 2 threads × 25 non-blocking connections, each with one batch in flight \
             (like valkey-benchmark); 95 % `absent:<random>`, \
             5 % one of the first 20 000 members, whose cache entries were filled first. The GET baseline reads the \
             same items' cache keys (`member:bench:hit:<item>\\0`: 5 % hits, 95 % nil). The 16-thread rows use the \
             `redis` crate for both MEMBER.EXISTS and the application pattern.\n\
             - Cold path: items from the second half of the set, each looked up once (never cached), sent by the RESP \
             generator (2 threads × 32 connections, one request in flight each), vs `pgbench -n -M prepared -c 64 -j 2` \
             running `SELECT 1 FROM member_bench WHERE entity_id = 'm' || :id AND scope = ''` for random members \
             (latency from pgbench's per-transaction log).\n\
             - False-positive rate: `exists_calls − path_bloom_negative` over the probes, from MEMBER.INFO before/after.\n\
             - Latency: about 1 % of absent probes pass the filter and wait for PostgreSQL, so the p99 of a \
             mostly-absent load sits at the edge of that slow tail (and, pipelined, a false positive holds up its \
             whole batch).\n\
             - Rebuild: client-side time of MEMBER.REBUILD SYNC vs the same COPY read by libpq (`psql -c \"COPY … TO \
             STDOUT\"` into /dev/null; the postgres crate's blocking `copy_out`, 2–3× slower, in parentheses), two \
             of each in turn with nothing else running; then one more of each while a separate thread PINGs in a \
             loop and keeps its worst latency.\n\
             - Database load: the PostgreSQL CPU time the kernel counted for the bench's own cluster (the postmaster \
             and every child of it, from /proc/<pid>/schedstat, processes that exited through the postmaster's \
             cutime/cstime), read once all 16 client connections are open and again before any closes, minus the idle \
             cluster's rate (the mean of 3 s before, once two such windows agree within 30 %, and 3 s after the passes) over the same window. Every variant looks up the same list: 200 000 items, 95 % never-seen \
             absent items and 5 % of the first 20 000 members (warm cache); the cold row 20 000 members never looked up \
             (read once by point queries first, so both sides find the rows in PostgreSQL's buffers). The seeds' pattern \
             (`sections/seeds_app.rs`): a 1 % Bloom filter of the members as a Valkey bit string read with one \
             `BITFIELD_RO` (this Valkey has no Bloom module), the recent-writes set when it says no, the cache key \
             when it says yes, the prepared point query on a miss, `SET … EX` on a hit.\n\
             - Many items per call: `valkey-benchmark -c 50 -r <pool>` running `MEMBER.MEXISTS bench ITEMS` with 100 \
             `absent:__rand_int__` items (each drawn on its own), items/s = calls/s × 100, vs `MEMBER.EXISTS bench \
             absent:__rand_int__` with `-P 100` and vs `MGET` of 100 such keys; MADD of 100 `madd:__rand_int__` vs \
             `MEMBER.ADD` with `-P 100`, 100 000 new items per run.\n\
             - Write path: 32 clients each side, new random keys: `valkey-benchmark -c 32 -r 1000000000` running \
             `MEMBER.ADD bench wp:a:__rand_int__` and `MEMBER.MADD bench ITEMS` with 100 such items, vs `pgbench -M \
             prepared -c 32 -j 2` running a single-row `INSERT … ON CONFLICT DO NOTHING` into `wp_plain` (`LIKE \
             member_bench INCLUDING ALL`: same columns, indexes and generated column, no triggers) and into \
             `member_bench` itself (its change-log trigger fires); order P A M T T M A P, each side's two runs \
             pooled. Per row: PostgreSQL CPU of the bench's cluster, valkey-server CPU (`INFO cpu`), transaction ids \
             drawn, and the module's batched statements (`member_db_batches`).\n\
             - Cluster: 3 primaries (no replicas) with the same set on a database of their own; per node, the same \
             valkey-benchmark / RESP generator command lines sent to one primary and to the standalone node, every \
             item tagged `{<tag>}` with a slot that primary owns (no redirects); memory is MEMBER.INFO \
             `filter_bytes` summed over the primaries.\n",
        );
        if !self.r.notes.is_empty() {
            notes.push_str("\nObservations from this run:\n\n");
            for n in &self.r.notes {
                let _ = writeln!(notes, "- {n}");
            }
        }
        let doc = format!("{head}{table}{notes}");
        println!("\n{doc}");
        if self.opts.only.is_some() {
            progress(
                "partial run (--only): bench/results.md and bench/latency.svg left as they were",
            );
            return;
        }

        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench");
        std::fs::create_dir_all(&dir).expect("create bench/");
        std::fs::write(dir.join("results.md"), &doc).expect("write bench/results.md");
        let svg = latency_svg(
            &self.r.bars,
            &format!(
                "{} members, 50 connections, {} CPUs; negative = absent items, mixed = 95 % absent / 5 % present (warm cache)",
                thousands(self.opts.members),
                thread::available_parallelism().map_or(0, |n| n.get())
            ),
        );
        std::fs::write(dir.join("latency.svg"), svg).expect("write bench/latency.svg");
        progress(&format!(
            "wrote {} and {}",
            dir.join("results.md").display(),
            dir.join("latency.svg").display()
        ));
    }
}
