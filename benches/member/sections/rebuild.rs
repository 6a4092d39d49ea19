//! Section `rebuild`: MEMBER.REBUILD SYNC against a COPY of the same rows, and what it costs
//! other clients (worst PING) and the main thread (the swap, from the server log).

use std::io::BufRead;
use std::thread;
use std::time::{Duration, Instant};

use crate::*;

impl Bench {
    /// COPY of the active rows read by libpq, the reference client (`psql -c "COPY … TO
    /// STDOUT"` into /dev/null): (seconds, PINGs meanwhile when `ping`).
    pub(crate) fn copy_baseline(&self, ping: bool) -> (f64, Option<Stats>) {
        let pinger = ping.then(|| Pinger::start(self.port));
        let t0 = Instant::now();
        let status = std::process::Command::new("psql")
            .args([
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                &self.db.url(),
                "-c",
                COPY_SQL,
            ])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("psql");
        assert!(status.success(), "psql COPY failed: {status}");
        let secs = t0.elapsed().as_secs_f64();
        (secs, pinger.map(Pinger::finish))
    }

    /// The same COPY through the postgres crate's blocking reader, read and discarded:
    /// (seconds, bytes). The module read its COPY this way before; kept as a note.
    fn copy_blocking_crate(&self) -> (f64, u64) {
        let mut pg = pg_connect(&self.db.url());
        let t0 = Instant::now();
        let mut r = pg.copy_out(COPY_SQL).expect("COPY");
        let mut bytes = 0u64;
        loop {
            let n = r.fill_buf().expect("COPY read").len();
            if n == 0 {
                break;
            }
            r.consume(n);
            bytes += n as u64;
        }
        drop(r);
        (t0.elapsed().as_secs_f64(), bytes)
    }

    pub(crate) fn rebuild(&mut self) {
        progress("rebuild vs COPY");
        const SECTION: &str = "Rebuild";
        let port = self.port;
        let timed_rebuild = |ping: bool| -> (f64, Option<Stats>) {
            let mut c = vk_conn(port);
            let pinger = ping.then(|| Pinger::start(port));
            let t0 = Instant::now();
            let rows: i64 = redis::cmd("MEMBER.REBUILD")
                .arg(SET)
                .arg("SYNC")
                .query(&mut c)
                .expect("MEMBER.REBUILD SYNC");
            let secs = t0.elapsed().as_secs_f64();
            assert!(rows > 0, "MEMBER.REBUILD SYNC loaded {rows} rows");
            (secs, pinger.map(Pinger::finish))
        };
        // Times with nothing else running, the two sides in turn; then one run of each with a
        // client PINGing in a loop, for the latency rows (on two CPUs that client and the
        // server answering it take most of one, which slows the side that needs more CPU).
        let (c1, _) = self.copy_baseline(false);
        let mut pinged = None;
        let (lib_secs, copy_secs, lib_ping, label) = if self.rebuild_available {
            let (r1, _) = timed_rebuild(false);
            let (c2, _) = self.copy_baseline(false);
            let (r2, _) = timed_rebuild(false);
            let (cp, copy_ping) = self.copy_baseline(true);
            let (rp, lib_ping) = timed_rebuild(true);
            pinged = Some((rp, cp, copy_ping.expect("pinged")));
            (
                (r1 + r2) / 2.0,
                (c1 + c2) / 2.0,
                lib_ping.expect("pinged"),
                "MEMBER.REBUILD SYNC".to_string(),
            )
        } else {
            let (s, p) = self.startup_build.clone().expect("start-up build measured");
            self.r.note(
                "MEMBER.REBUILD is not in this build (\"unknown command\"): the rebuild rows show the \
                 filter build a fresh valkey-server runs in the background at start-up (same rebuild \
                 code; time = MEMBER.INFO last_rebuild_s, measured inside the module; PINGs during \
                 it include the start-up)",
            );
            let (c2, _) = self.copy_baseline(false);
            (
                s,
                (c1 + c2) / 2.0,
                p,
                "start-up filter build (no MEMBER.REBUILD)".to_string(),
            )
        };
        let (crate_secs, bytes) = self.copy_blocking_crate();
        // The machine's own noise floor: PINGs with nothing else running.
        let pinger = Pinger::start(self.port);
        thread::sleep(Duration::from_secs_f64(lib_secs.clamp(1.0, 5.0)));
        let idle_ping = pinger.finish();
        let ratio = lib_secs / copy_secs;
        self.r.row(
            SECTION,
            format!("{label}: seconds"),
            format!("{lib_secs:.3} s"),
            format!(
                "{copy_secs:.3} s (COPY of {:.1} MB by psql into /dev/null; the postgres \
                 crate's blocking reader: {crate_secs:.3} s)",
                bytes as f64 / 1e6
            ),
            Some(ratio),
            "≤ 1.30×",
            Some(ratio <= 1.3),
        );
        let copy_ping = match pinged {
            Some((rp, cp, copy_ping)) => {
                self.r.row(
                    SECTION,
                    format!("{label}: seconds while another client PINGs in a loop"),
                    format!("{rp:.3} s"),
                    format!("{cp:.3} s (the same psql COPY, the same PINGs)"),
                    Some(rp / cp),
                    "diagnostic",
                    None,
                );
                copy_ping
            }
            None => self.copy_baseline(true).1.expect("pinged"),
        };
        let ms = lib_ping.max_ms;
        self.r.row(
            SECTION,
            format!("{label}: worst PING latency of another client"),
            format!(
                "{ms:.2} ms (p99 {:.3} ms; {} of {} PINGs > 2 ms)",
                lib_ping.p99_ms, lib_ping.over_2ms, lib_ping.ops
            ),
            format!(
                "{:.2} ms during the COPY baseline (p99 {:.3} ms; {} of {} > 2 ms); \
                 {:.2} ms with nothing else running ({} of {} > 2 ms)",
                copy_ping.max_ms,
                copy_ping.p99_ms,
                copy_ping.over_2ms,
                copy_ping.ops,
                idle_ping.max_ms,
                idle_ping.over_2ms,
                idle_ping.ops
            ),
            Some(ms / copy_ping.max_ms.max(1e-9)),
            "≤ 2 ms",
            Some(ms <= 2.0),
        );
        // What the rebuild itself costs the main thread, as the module logs it: the swap is
        // the only step of a rebuild that runs there. Unlike a PING's round trip, this does
        // not include the CPU scheduling of two shared cores.
        let swaps: Vec<f64> = self
            .vk
            .log()
            .lines()
            .filter_map(|l| l.split("held the main thread ").nth(1))
            .filter_map(|rest| rest.trim().trim_end_matches("ms").trim().parse().ok())
            .collect();
        // Where each rebuild's time went, as the module logs it.
        let log = self.vk.log();
        let parts: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("rebuilt set") && l.contains("(manual"))
            .filter_map(|l| l.split(" members in ").nth(1))
            .filter_map(|rest| rest.split(", filter of").next())
            .collect();
        if !parts.is_empty() {
            self.r.note(format!(
                "MEMBER.REBUILDs, from the server log (the last one while PINGed): {}",
                parts.join("; ")
            ));
        }
        if let Some(worst) = swaps.iter().copied().reduce(f64::max) {
            self.r.row(
                SECTION,
                format!(
                    "{label}: main-thread time of the swap (server log, worst of {})",
                    swaps.len()
                ),
                format!("{worst:.3} ms"),
                "—",
                None,
                "≤ 2 ms",
                Some(worst <= 2.0),
            );
        }
    }
}
