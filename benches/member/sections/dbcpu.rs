//! Section `dbcpu` (issue 10, "how much load it takes off the database"): PostgreSQL CPU time
//! per 1 000 lookups of the same items, libmember vs a point query per lookup vs the seeds' pattern.
//!
//! CPU is what the kernel counted for the bench's own PostgreSQL cluster (`pg_cpu.rs`), read
//! while every client connection is open, before the first lookup and after the last one, and
//! net of what the cluster uses with nothing to do (once settled, before and after, over IDLE each).

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::pg_cpu::{CpuSample, PgCpu};
use crate::sections::seeds_app::{load_app_bloom, seeds_lookup, BloomShape};
use crate::*;

const SECTION: &str = "Database load: PostgreSQL CPU, same items for every variant, 16 clients";
/// Lookups of the realistic mix per variant (the same list for each).
const LOOKUPS: usize = 200_000;
/// Present, never-cached members looked up per variant on the cold path.
const COLD_LOOKUPS: usize = 20_000;
/// Client threads, one connection each, one lookup in flight each.
const CLIENTS: usize = 16;
/// The window over which the idle cluster's own CPU use is measured.
const IDLE: Duration = Duration::from_secs(3);
/// At most this long for the idle rate to settle (two windows within 30 %) before the passes:
/// right after the bulk load of 1 M members, the module's sync pass runs for a while at about
/// 80 ms of CPU a second.
const SETTLE_MAX: Duration = Duration::from_secs(60);

/// One variant's pass over a list of items.
struct Pass {
    load: Stats,
    /// PostgreSQL CPU in the window, ms: as counted, and net of the idle rate (set by the caller).
    raw_ms: f64,
    net_ms: f64,
    /// Seconds between the two probes.
    window_s: f64,
    /// The same by clock ticks (/proc/<pid>/stat utime + stime), ms, as counted.
    ticks_ms: f64,
    /// Lookups that reached PostgreSQL, and the statements that resolved them.
    to_db: u64,
    statements: u64,
}

impl Pass {
    fn per_1000(&self) -> f64 {
        self.net_ms * 1000.0 / self.load.ops.max(1) as f64
    }

    fn per_resolved_us(&self) -> f64 {
        self.net_ms * 1000.0 / self.to_db.max(1) as f64
    }
}

/// The realistic mix: 95 % absent items never seen before, 5 % members whose cache entries are
/// warm (m1..=warm, like section `mixed`). A fixed seed: the same list on every run.
fn mixed_items(n: usize, warm: u64) -> Vec<(String, bool)> {
    let mut rng = Rng(0xdb_c0de);
    (0..n)
        .map(|_| {
            if rng.below(100) < PRESENT_PCT {
                (format!("m{}", 1 + rng.below(warm)), true)
            } else {
                (format!("dbcpu:{}", rng.next()), false)
            }
        })
        .collect()
}

/// A MEMBER.INFO / INFO member counter.
fn member_stat(c: &mut redis::Connection, field: &str) -> u64 {
    info_stat(c, "member", field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO member has no {field}"))
}

/// The cluster's CPU use with no lookups, ms per second over IDLE, and its three busiest
/// processes meanwhile.
fn idle_rate(cpu: &PgCpu, pg: &mut postgres::Client) -> (f64, String) {
    let (s0, p0, t0) = (cpu.sample(), cpu.by_process(), Instant::now());
    thread::sleep(IDLE);
    let rate = s0.ms_to(&cpu.sample()) / t0.elapsed().as_secs_f64();
    let mut busiest: Vec<(f64, u32, String)> = cpu
        .by_process()
        .into_iter()
        .map(|(pid, (title, ns))| {
            let was = p0.get(&pid).map_or(0, |p| p.1);
            (ns.saturating_sub(was) as f64 / 1e6, pid, title)
        })
        .collect();
    busiest.sort_by(|a, b| b.0.total_cmp(&a.0));
    let top: Vec<String> = busiest
        .iter()
        .take(3)
        .map(|(ms, pid, t)| {
            let last: String = pg
                .query_opt(
                    "SELECT left(query, 60) FROM pg_stat_activity WHERE pid = $1",
                    &[&(*pid as i32)],
                )
                .ok()
                .flatten()
                .map_or(String::new(), |r| r.get(0));
            format!("{t} {ms:.1} ms (last statement: {last:?})")
        })
        .collect();
    (rate, top.join("; "))
}

impl Bench {
    /// PostgreSQL CPU per 1 000 lookups and per resolved lookup, libmember vs the baselines.
    pub(crate) fn dbcpu(&mut self) {
        let mut pg = self.db.client();
        let cpu = PgCpu::of(&mut pg);
        // The steady state autovacuum reaches on its own soon after the bulk load: until the
        // change log has statistics, each sync pass may scan all of its rows (~90 ms a second
        // at 1 M members), which would drown what the lookups cost.
        pg.batch_execute("ANALYZE member_changes")
            .expect("ANALYZE member_changes");
        let mut c = self.vk.conn();
        progress("database load: waiting for the idle cluster's CPU use to settle");
        let started = Instant::now();
        let (first, first_busiest) = idle_rate(&cpu, &mut pg);
        let mut prev = first;
        let (idle_before, busiest) = loop {
            let (rate, top) = idle_rate(&cpu, &mut pg);
            let settled = (rate - prev).abs() <= 0.3 * prev.max(2.0);
            prev = rate;
            if settled || started.elapsed() > SETTLE_MAX {
                break (rate, top);
            }
        };
        if started.elapsed() > IDLE * 2 + Duration::from_millis(500) {
            self.r.note(format!(
                "database load, idle: the cluster used {first:.1} ms of CPU per second at first, {idle_before:.1} \
                 after {:.0} s; busiest processes at first: {first_busiest}",
                started.elapsed().as_secs_f64()
            ));
        }
        self.r.note(format!(
            "database load, idle: the busiest processes of the cluster over {} s: {busiest}",
            IDLE.as_secs()
        ));
        progress("database load: the seeds' Bloom filter (1 % FPR) into Valkey");
        let shape = load_app_bloom(&mut c, self.opts.members);

        let mixed = mixed_items(LOOKUPS, self.warm);
        progress(&format!(
            "database load: {} lookups (95 % absent) per variant, {CLIENTS} clients",
            thousands(LOOKUPS as u64)
        ));
        let mut lib = self.pass_member(&cpu, &mixed);
        let mut point = self.pass_point(&cpu, &mixed);
        let mut seeds = self.pass_seeds(&cpu, &mixed, &shape);

        // Cold path: members never looked up (so never cached), resolved by PostgreSQL.
        let n = self.opts.members;
        let first = self
            .cold_next
            .fetch_add(COLD_LOOKUPS as u64, Ordering::Relaxed);
        let cold: Vec<(String, bool)> = (0..COLD_LOOKUPS as u64)
            .map(|i| (format!("m{}", (first + i - 1) % n + 1), true))
            .collect();
        progress(&format!(
            "database load: {} present, uncached members per variant",
            thousands(COLD_LOOKUPS as u64)
        ));
        // Read the rows once first, so both variants find them in PostgreSQL's buffers.
        self.pass_point(&cpu, &cold);
        let mut lib_cold = self.pass_member(&cpu, &cold);
        let mut point_cold = self.pass_point(&cpu, &cold);

        let (idle_after, _) = idle_rate(&cpu, &mut pg);
        // Net of the idle rate: the mean of the two windows around the passes.
        let idle_ms_per_s = (idle_before + idle_after) / 2.0;
        for p in [
            &mut lib,
            &mut point,
            &mut seeds,
            &mut lib_cold,
            &mut point_cold,
        ] {
            p.net_ms = (p.raw_ms - idle_ms_per_s * p.window_s).max(0.0);
        }
        self.dbcpu_rows(&lib, &point, &seeds, &lib_cold, &point_cold);
        self.r.row(
            SECTION,
            "diagnostic: PostgreSQL CPU of the idle cluster, the module connected (its sync pass every 1 s)",
            format!("{idle_before:.1} ms/s before the passes, {idle_after:.1} ms/s after"),
            "—",
            None,
            "—",
            None,
        );
        self.r.note(format!(
            "database load: {idle_ms_per_s:.2} ms of CPU per second of the idle cluster subtracted from every \
             variant for its window; as counted, in ms \
             (precise / by clock ticks of {:.0} ms per process): libmember {:.1} / {:.0}, point query {:.1} / {:.0}, \
             seeds' pattern {:.1} / {:.0}; cold: libmember {:.1} / {:.0}, point query {:.1} / {:.0}",
            cpu.tick_ms(),
            lib.raw_ms, lib.ticks_ms, point.raw_ms, point.ticks_ms, seeds.raw_ms, seeds.ticks_ms,
            lib_cold.raw_ms, lib_cold.ticks_ms, point_cold.raw_ms, point_cold.ticks_ms,
        ));
        self.r.note(format!(
            "database load, lookups per second meanwhile: libmember {}, point query {}, seeds' pattern {}; \
             cold: libmember {}, point query {}",
            rate(lib.load.rps()),
            rate(point.load.rps()),
            rate(seeds.load.rps()),
            rate(lib_cold.load.rps()),
            rate(point_cold.load.rps()),
        ));
        for (name, p) in [
            ("libmember", &lib),
            ("point query", &point),
            ("seeds' pattern", &seeds),
            ("libmember, cold", &lib_cold),
            ("point query, cold", &point_cold),
        ] {
            if p.load.errors > 0 || p.load.wrong > 0 {
                self.r.note(format!(
                    "database load ({name}): {} error replies, {} wrong answers; first error: {}",
                    p.load.errors,
                    p.load.wrong,
                    p.load.first_error.as_deref().unwrap_or("-")
                ));
            }
        }
    }

    /// One pass of `items` with CPU probes around it; `to_db` and `statements` filled by the
    /// caller when it knows them better.
    fn measured<W>(
        cpu: &PgCpu,
        items: &[(String, bool)],
        make: impl Fn(usize) -> W + Sync,
        op: impl Fn(&mut W, &str) -> Result<bool, String> + Sync,
    ) -> Pass {
        let probe = || (cpu.sample(), Instant::now());
        let (load, (b, tb), (a, ta)): (Stats, (CpuSample, Instant), (CpuSample, Instant)) =
            items_load(CLIENTS, items, make, op, probe);
        let raw_ms = b.ms_to(&a);
        let window = (ta - tb).as_secs_f64();
        Pass {
            raw_ms,
            net_ms: raw_ms,
            window_s: window,
            ticks_ms: a.ticks.saturating_sub(b.ticks) as f64 * cpu.tick_ms(),
            to_db: load.ops,
            statements: load.ops,
            load,
        }
    }

    /// MEMBER.EXISTS per item; reached PostgreSQL = the db-hit and db-miss paths.
    fn pass_member(&mut self, cpu: &PgCpu, items: &[(String, bool)]) -> Pass {
        let port = self.port;
        let mut c = self.vk.conn();
        let info0 = set_info_all(&mut c);
        let (batches0, points0) = (
            member_stat(&mut c, "member_db_batches"),
            member_stat(&mut c, "member_db_batched_points"),
        );
        let mut p = Self::measured(
            cpu,
            items,
            |_| vk_conn(port),
            |c, item| {
                redis::cmd("MEMBER.EXISTS")
                    .arg(SET)
                    .arg(item)
                    .query::<i64>(c)
                    .map(|v| v == 1)
                    .map_err(|e| e.to_string())
            },
        );
        let info1 = set_info_all(&mut c);
        let d = |k: &str| (num(&info1, k) - num(&info0, k)) as u64;
        p.to_db = d("path_db_hit") + d("path_db_miss");
        p.statements = member_stat(&mut c, "member_db_batches") - batches0;
        let points = member_stat(&mut c, "member_db_batched_points") - points0;
        if points != p.to_db {
            self.r.note(format!(
                "database load: the module batched {points} points for {} lookups that reached PostgreSQL",
                p.to_db
            ));
        }
        p
    }

    /// One prepared point query per item.
    fn pass_point(&self, cpu: &PgCpu, items: &[(String, bool)]) -> Pass {
        let url = self.db.url();
        Self::measured(
            cpu,
            items,
            |_| pg_point_query(&url),
            |(pg, st), item| {
                pg.query_opt(&*st, &[&item])
                    .map(|r| r.is_some())
                    .map_err(|e| e.to_string())
            },
        )
    }

    /// The seeds' pattern per item (`seeds_app.rs`).
    fn pass_seeds(&self, cpu: &PgCpu, items: &[(String, bool)], shape: &BloomShape) -> Pass {
        let (port, url) = (self.port, self.db.url());
        let to_db = AtomicU64::new(0);
        let mut p = Self::measured(
            cpu,
            items,
            |_| {
                let (pg, st) = pg_point_query(&url);
                (vk_conn(port), pg, st)
            },
            |(vk, pg, st), item| seeds_lookup(shape, vk, pg, st, item, &to_db),
        );
        p.to_db = to_db.load(Ordering::Relaxed);
        p.statements = p.to_db;
        p
    }
}

impl Bench {
    /// The section's rows: per 1 000 lookups of the mix, and per resolved lookup when cold.
    fn dbcpu_rows(
        &mut self,
        lib: &Pass,
        point: &Pass,
        seeds: &Pass,
        lib_cold: &Pass,
        point_cold: &Pass,
    ) {
        let n = thousands(lib.load.ops);
        let lib_cell = format!(
            "{:.2} ms ({} of {n} lookups reached PostgreSQL, in {} statements)",
            lib.per_1000(),
            thousands(lib.to_db),
            thousands(lib.statements)
        );
        self.r.row(
            SECTION,
            "PostgreSQL CPU per 1 000 lookups, 95 % absent / 5 % present (warm cache): vs a point query per lookup",
            lib_cell.clone(),
            format!(
                "{:.2} ms (prepared `SELECT 1 … WHERE entity_id = $1`, {} queries)",
                point.per_1000(),
                thousands(point.statements)
            ),
            Some(lib.per_1000() / point.per_1000().max(1e-9)),
            "—",
            None,
        );
        self.r.row(
            SECTION,
            "PostgreSQL CPU per 1 000 lookups, 95 % absent / 5 % present (warm cache): vs the seeds' pattern",
            lib_cell,
            format!(
                "{:.2} ms (Bloom 1 % in Valkey → recent set → cache → SELECT, SET on a hit; {} reached PostgreSQL)",
                seeds.per_1000(),
                thousands(seeds.to_db)
            ),
            Some(lib.per_1000() / seeds.per_1000().max(1e-9)),
            "—",
            None,
        );
        self.r.row(
            SECTION,
            format!(
                "PostgreSQL CPU per resolved lookup, cold path ({} present, uncached members)",
                thousands(lib_cold.load.ops)
            ),
            format!(
                "{:.1} µs ({} resolved in {} batched statements, {:.1} items each)",
                lib_cold.per_resolved_us(),
                thousands(lib_cold.to_db),
                thousands(lib_cold.statements),
                lib_cold.to_db as f64 / lib_cold.statements.max(1) as f64
            ),
            format!(
                "{:.1} µs (one prepared point query each)",
                point_cold.per_resolved_us()
            ),
            Some(lib_cold.per_resolved_us() / point_cold.per_resolved_us().max(1e-9)),
            "—",
            None,
        );
    }
}
