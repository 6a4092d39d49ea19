//! Bench section `syncmem`: what an outside bulk INSERT of 3 M rows costs a node's memory
//! during the sync pass that reads it (issue 25: it used to be ~390 bytes per row), how long
//! until the last of those rows is in the filter, and the longest PING meanwhile (the main
//! thread applies the pass page by page). A fresh database and server of its own. The time has
//! no baseline in the same run (the module before paging is not at hand): compare it with the
//! figures in docs/sync.md, "Measured".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::member::peak_allocated;
use crate::{progress, support, vk_conn, Bench};

/// Rows the outside INSERT writes.
const ROWS: i64 = 3_000_000;
/// What the pass may add to the server's peak memory, whatever the rows.
const BUDGET_MB: f64 = 64.0;
const GIVE_UP: Duration = Duration::from_secs(600);

/// A number field of MEMBER.INFO `set` (0 when absent).
pub(crate) fn set_number(c: &mut redis::Connection, set: &str, field: &str) -> i64 {
    let v: Vec<String> = redis::cmd("MEMBER.INFO")
        .arg(set)
        .query(c)
        .unwrap_or_default();
    v.chunks(2)
        .find(|p| p[0] == field)
        .and_then(|p| p[1].parse().ok())
        .unwrap_or(0)
}

fn rows_applied(c: &mut redis::Connection) -> i64 {
    set_number(c, "bulk", "sync_rows_applied")
}

impl Bench {
    /// Peak memory per outside row during the sync pass, and time to the last row visible.
    pub(crate) fn sync_memory(&mut self) {
        progress(&format!("syncmem: an outside INSERT of {ROWS} rows"));
        let db = support::fresh_db();
        let vk = support::member::start_loaded(&db.url(), &[]);
        let mut c = vk_conn(vk.port());
        let _: String = redis::cmd("MEMBER.CREATE")
            .arg("bulk")
            .arg("CAPACITY")
            .arg(2 * ROWS)
            .query(&mut c)
            .expect("MEMBER.CREATE");
        let before = peak_allocated(&mut c);
        let t = Instant::now();
        db.client()
            .batch_execute(&format!(
                "INSERT INTO member_bulk (entity_id) SELECT 'bulk-' || g FROM generate_series(1, {ROWS}) g"
            ))
            .expect("outside insert");
        progress(&format!(
            "  committed in {:.1} s",
            t.elapsed().as_secs_f64()
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let pinger = {
            let (stop, port) = (stop.clone(), vk.port());
            std::thread::spawn(move || {
                let mut p = vk_conn(port);
                let mut worst = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let _: String = redis::cmd("PING").query(&mut p).expect("PING");
                    worst = worst.max(t.elapsed());
                    std::thread::sleep(Duration::from_millis(1));
                }
                worst
            })
        };
        let t = Instant::now();
        while rows_applied(&mut c) < ROWS && t.elapsed() < GIVE_UP {
            std::thread::sleep(Duration::from_millis(5));
        }
        let visible = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let worst = pinger.join().expect("pinger");
        let rise = (peak_allocated(&mut c) - before).max(0);
        let mb = rise as f64 / (1 << 20) as f64;
        self.r.note(format!(
            "syncmem: {ROWS} outside rows; peak.allocated +{mb:.1} MB during the pass; the \
             last row in the filter {visible:.2} s after the commit (interval 1 s); longest \
             PING meanwhile {:.1} ms",
            worst.as_secs_f64() * 1e3
        ));
        self.r.row(
            "Sync loop",
            "sync: peak memory per outside row (3 M rows): bytes / row; s until the last is visible",
            format!("{:.1} B (+{mb:.1} MB); {visible:.2} s", rise as f64 / ROWS as f64),
            "~390 B (+1.17 GB); ~5 s on a quiet machine (issue 25, before paging)",
            None,
            format!("peak < {BUDGET_MB:.0} MB, flat in rows"),
            Some(mb < BUDGET_MB),
        );
    }
}
