//! Bench section `rebuildmem`: what a rebuild of 1 M and of 10 M rows adds to a node's peak
//! memory above the memory it settled at (issue 25: ~57 bytes per row above the filter
//! before the rows spilled and the static part was built in parts), against the target of
//! `member.build-memory` (64 MB) plus twice the filter, and how long the rebuild takes. A
//! fresh database and server of its own for each size.

use std::time::{Duration, Instant};

use crate::sections::sync_memory::set_number;
use crate::support::member::peak_allocated;
use crate::{progress, support, vk_conn, Bench};

const SIZES: [i64; 2] = [1_000_000, 10_000_000];
const BUDGET: i64 = 64 << 20;
const GIVE_UP: Duration = Duration::from_secs(1200);

fn used_memory(c: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(c).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

impl Bench {
    /// Peak memory a rebuild adds, per size, against 64 MB + 2 × filter.
    pub(crate) fn rebuild_memory(&mut self) {
        for rows in SIZES {
            progress(&format!("rebuildmem: a rebuild of {rows} rows"));
            let db = support::fresh_db();
            let vk = support::member::start_loaded(&db.url(), &[]);
            let mut c = vk_conn(vk.port());
            let _: String = redis::cmd("MEMBER.CREATE")
                .arg("bulk")
                .arg("CAPACITY")
                .arg(rows)
                .query(&mut c)
                .expect("MEMBER.CREATE");
            db.client()
                .batch_execute(&format!(
                    "INSERT INTO member_bulk (entity_id) SELECT 'bulk-' || g FROM generate_series(1, {rows}) g"
                ))
                .expect("outside insert");
            let t = Instant::now();
            while set_number(&mut c, "bulk", "sync_rows_applied") < rows && t.elapsed() < GIVE_UP {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_secs(1));
            let settled = used_memory(&mut c).max(0);
            let before = peak_allocated(&mut c);
            let t = Instant::now();
            let got: redis::RedisResult<i64> = redis::cmd("MEMBER.REBUILD")
                .arg("bulk")
                .arg("SYNC")
                .query(&mut c);
            let secs = t.elapsed().as_secs_f64();
            let built = got.expect("MEMBER.REBUILD SYNC");
            let filter = set_number(&mut c, "bulk", "filter_bytes");
            let peak = peak_allocated(&mut c);
            // The pass before may have left a higher peak; then the rebuild's own is lower.
            let rise = (peak - settled).max(0);
            let allowed = BUDGET + 2 * filter;
            let mb = |b: i64| b as f64 / (1 << 20) as f64;
            self.r.note(format!(
                "rebuildmem: {built} rows rebuilt in {secs:.2} s; peak.allocated +{:.1} MB over \
                 used_memory {:.1} MB before it (peak before {:.1} MB); filter {:.2} MB",
                mb(rise),
                mb(settled),
                mb(before),
                mb(filter)
            ));
            self.r.row(
                "Rebuilds",
                format!(
                    "rebuild: peak above settled memory, {} M rows (MB; × filter); seconds",
                    rows / 1_000_000
                ),
                format!(
                    "+{:.1} MB ({:.1} × filter); {secs:.2} s",
                    mb(rise),
                    rise as f64 / filter.max(1) as f64
                ),
                "~57 B/row above the filter (+57 MB at 1 M, +570 MB at 10 M; issue 25, before)",
                None,
                format!("≤ 64 MB + 2 × filter ({:.1} MB)", mb(allowed)),
                Some(rise <= allowed),
            );
        }
    }
}
