//! Bench section `idle`: what the sync loop costs an idle database (issue 17), and how soon an
//! outside write becomes visible among thousands of sets. Each size runs on a fresh database
//! and valkey-server of its own, so nothing else touches the database while it is measured.

use std::time::{Duration, Instant};

use crate::{info_stat, pg_connect, progress, support, thousands, vk_conn, Bench};

/// Set counts measured, and the idle target (commits/s per node) from issue 17.
const SIZES: [u64; 3] = [10, 300, 3000];
const TARGET_COMMITS_PER_S: f64 = 20.0;
/// Seconds over which `xact_commit` is sampled. An idle backend flushes its statistics up to
/// 10 s late (PostgreSQL 15), so the window is long and starts after a settling time.
const WINDOW: Duration = Duration::from_secs(30);
const SETTLE: Duration = Duration::from_secs(12);
/// Outside writes timed for visibility at the largest size.
const SAMPLES: usize = 40;
/// The module's sync interval (its default).
const INTERVAL_MS: u64 = 1000;

/// Commits of database `name` so far (the statistics are flushed about once a second).
fn commits(pg: &mut postgres::Client, name: &str) -> i64 {
    pg.query_one(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
        &[&name],
    )
    .expect("pg_stat_database")
    .get(0)
}

/// Commits/s of database `name` over `WINDOW`.
fn commits_per_s(pg: &mut postgres::Client, name: &str) -> f64 {
    let before = commits(pg, name);
    std::thread::sleep(WINDOW);
    (commits(pg, name) - before) as f64 / WINDOW.as_secs_f64()
}

/// Creates `n` sets of CAPACITY 1000, pipelined, and waits until every filter has caught up.
fn create_sets(c: &mut redis::Connection, n: u64) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("MEMBER.CREATE")
                .arg(format!("idle{i:04}"))
                .arg("CAPACITY")
                .arg(1000);
        }
        let _: Vec<String> = p.query(c).expect("MEMBER.CREATE");
    }
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

impl Bench {
    /// Idle database commits/s caused by one node with 10, 300 and 3000 sets; visibility delay
    /// of an outside write at the largest size.
    pub(crate) fn idle_sync(&mut self) {
        for n in SIZES {
            progress(&format!("idle node with {} sets", thousands(n)));
            let db = support::fresh_db();
            let vk = crate::support::member::start_loaded(
                &db.url(),
                &[("member.sync-interval-ms", &INTERVAL_MS.to_string())],
            );
            let mut c = vk_conn(vk.port());
            let t0 = Instant::now();
            create_sets(&mut c, n);
            progress(&format!("  created in {:.1} s", t0.elapsed().as_secs_f64()));
            // Let the CREATEs' own commits reach the statistics, then sample.
            std::thread::sleep(SETTLE);
            let mut pg = pg_connect(&support::Pg::get().url("postgres"));
            let passes0: u64 = info_stat(&mut c, "member", "member_sync_passes")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let with_node = commits_per_s(&mut pg, &db.name);
            let passes1: u64 = info_stat(&mut c, "member", "member_sync_passes")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let stmts =
                info_stat(&mut c, "member", "member_sync_statements_per_pass").unwrap_or_default();
            let visible = (n == *SIZES.last().unwrap()).then(|| visibility(&db, &mut c, n));
            // What the database does by itself with that many tables (autovacuum visits
            // them): the same window with the node stopped. The node's cost is the difference.
            drop(c);
            drop(vk);
            std::thread::sleep(SETTLE);
            let without = commits_per_s(&mut pg, &db.name);
            let per_s = (with_node - without).max(0.0);
            self.r.row(
                "Sync loop",
                format!("idle node, {} sets: database commits/s", thousands(n)),
                format!("{per_s:.1}"),
                if n == 300 {
                    "1172 (issue 17, per-set polling)".to_string()
                } else {
                    "-".to_string()
                },
                None,
                format!("≤ {TARGET_COMMITS_PER_S}"),
                Some(per_s <= TARGET_COMMITS_PER_S),
            );
            self.r.note(format!(
                "idle, {n} sets: {with_node:.1} commits/s with the node running, {without:.1} \
                 with it stopped; {} sync passes in {} s, {stmts} statement(s) in the last pass",
                passes1.saturating_sub(passes0),
                WINDOW.as_secs()
            ));
            if let Some((p50, p99)) = visible {
                self.r.row(
                    "Sync loop",
                    format!(
                        "outside write → EXISTS 1, {} sets: p50 / p99 ms",
                        thousands(n)
                    ),
                    format!("{p50:.0} / {p99:.0}"),
                    "-",
                    None,
                    format!("p99 ≤ ~{INTERVAL_MS} (one sync interval)"),
                    Some(p99 <= INTERVAL_MS as f64 * 1.25),
                );
            }
        }
    }
}

/// Time from an outside INSERT's commit until EXISTS answers 1, over `SAMPLES` writes to
/// random sets among `n`, at random moments: (p50, p99) in ms.
fn visibility(db: &support::TestDb, c: &mut redis::Connection, n: u64) -> (f64, f64) {
    progress(&format!(
        "  outside-write visibility, {SAMPLES} writes among {} sets",
        thousands(n)
    ));
    let mut pg = db.client();
    let mut delays = Vec::with_capacity(SAMPLES);
    let mut rng = crate::Rng(0x5eed);
    for i in 0..SAMPLES {
        // At a random point of the pass cycle, not just after the pass that made the
        // previous write visible.
        std::thread::sleep(Duration::from_millis(rng.next() % INTERVAL_MS));
        let set = format!("idle{:04}", rng.next() % n);
        let item = format!("outside-{i}");
        pg.execute(
            &format!("INSERT INTO member_{set} (entity_id) VALUES ($1)"),
            &[&item],
        )
        .expect("outside insert");
        let t = Instant::now();
        loop {
            let v: i64 = redis::cmd("MEMBER.EXISTS")
                .arg(&set)
                .arg(&item)
                .query(c)
                .expect("MEMBER.EXISTS");
            if v == 1 || t.elapsed() > Duration::from_secs(30) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        delays.push(t.elapsed().as_secs_f64() * 1e3);
    }
    delays.sort_by(f64::total_cmp);
    (pct(&delays, 0.5), pct(&delays, 0.99))
}
