//! Bench section `visibility`: how soon an outside write (a SQL client's `INSERT … COMMIT`)
//! is answered 1 by MEMBER.EXISTS, with the sync loop's interval alone (the default 1 s) and
//! with `member.sync-notify yes` (issue 10). Each mode gets a fresh database and server.

use std::time::{Duration, Instant};

use crate::{progress, support, vk_conn, Bench, Rng};

/// Outside writes timed per mode.
const SAMPLES: usize = 60;
/// The module's sync interval (its default) in both modes.
const INTERVAL_MS: u64 = 1000;
/// How often the client asks EXISTS while it waits.
const POLL: Duration = Duration::from_micros(500);
/// Give-up bound for one write (well over an interval).
const GIVE_UP: Duration = Duration::from_secs(10);

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

impl Bench {
    /// Outside-write visibility delay, p50/p99, interval only vs change notification.
    pub(crate) fn visibility(&mut self) {
        let mut seen = Vec::new();
        for notify in [false, true] {
            let mode = if notify { "yes" } else { "no" };
            progress(&format!(
                "visibility: {SAMPLES} outside writes, sync-notify {mode}"
            ));
            let (p50, p99, notes) = measure(notify);
            self.r
                .note(format!("visibility, sync-notify {mode}: {notes}"));
            seen.push((p50, p99));
            let (figure, target, met) = if notify {
                (
                    "outside write → EXISTS 1, sync-notify yes: p50 / p99 ms".to_string(),
                    "p99 ≤ 100 (milliseconds, not an interval)".to_string(),
                    p99 <= 100.0,
                )
            } else {
                (
                    format!(
                        "outside write → EXISTS 1, interval {INTERVAL_MS} ms only: p50 / p99 ms"
                    ),
                    format!("p99 ≤ ~{INTERVAL_MS} (one sync interval)"),
                    p99 <= INTERVAL_MS as f64 * 1.25,
                )
            };
            let base = match (notify, seen.first()) {
                (true, Some((b50, b99))) => format!("{b50:.1} / {b99:.1} (interval only)"),
                _ => "-".to_string(),
            };
            let ratio = match (notify, seen.first()) {
                (true, Some((b50, _))) if p50 > 0.0 => Some(b50 / p50),
                _ => None,
            };
            self.r.row(
                "Sync loop",
                figure,
                format!("{p50:.1} / {p99:.1}"),
                base,
                ratio,
                target,
                Some(met),
            );
        }
    }
}

/// Times `SAMPLES` outside inserts of new items into one set until EXISTS answers 1:
/// (p50 ms, p99 ms, a note on what the node did).
fn measure(notify: bool) -> (f64, f64, String) {
    let db = support::fresh_db();
    let vk = support::member::start_loaded(
        &db.url(),
        &[
            ("member.sync-interval-ms", &INTERVAL_MS.to_string()),
            ("member.sync-notify", if notify { "yes" } else { "no" }),
        ],
    );
    let mut c = vk_conn(vk.port());
    let _: String = redis::cmd("MEMBER.CREATE")
        .arg("vis")
        .arg("CAPACITY")
        .arg(100_000)
        .query(&mut c)
        .expect("MEMBER.CREATE");
    if notify {
        let t = Instant::now();
        while info(&mut c, "member_sync_notify").as_deref() != Some("listening") {
            assert!(t.elapsed() < GIVE_UP, "the listener never connected");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut pg = db.client();
    let mut rng = Rng(0x715_1b1e);
    let mut delays = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        // A random moment of the pass cycle, not right after the pass that answered the
        // previous write.
        std::thread::sleep(Duration::from_millis(rng.next() % INTERVAL_MS));
        let item = format!("outside-{i}");
        pg.execute("INSERT INTO member_vis (entity_id) VALUES ($1)", &[&item])
            .expect("outside insert");
        let t = Instant::now();
        loop {
            let v: i64 = redis::cmd("MEMBER.EXISTS")
                .arg("vis")
                .arg(&item)
                .query(&mut c)
                .expect("MEMBER.EXISTS");
            if v == 1 || t.elapsed() > GIVE_UP {
                break;
            }
            std::thread::sleep(POLL);
        }
        delays.push(t.elapsed().as_secs_f64() * 1e3);
    }
    delays.sort_by(f64::total_cmp);
    let notes = format!(
        "{} sync passes ({} woken by {} notifications), max {:.1} ms",
        info(&mut c, "member_sync_passes").unwrap_or_default(),
        info(&mut c, "member_sync_notify_passes").unwrap_or_default(),
        info(&mut c, "member_sync_notify_received").unwrap_or_default(),
        delays.last().copied().unwrap_or_default(),
    );
    (pct(&delays, 0.5), pct(&delays, 0.99), notes)
}

fn info(c: &mut redis::Connection, field: &str) -> Option<String> {
    crate::info_stat(c, "member", field)
}
