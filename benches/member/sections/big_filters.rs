//! `make bench` section `bigfilter`: what a 100 M-member filter costs every other client when
//! it is created, unlinked and deleted (worst PING of another client next to the idle worst
//! of the same run). The set's table is empty: the filter's size, not the COPY, is measured.

use std::thread;
use std::time::{Duration, Instant};

use crate::*;

const BIG_SET: &str = "bigfilter";
const BIG_MEMBERS: u64 = 100_000_000;

impl Bench {
    /// Runs `op` on its own connection while another client PINGs in a loop, from just before
    /// it starts until 200 ms after it ends. Seconds taken and the PINGs.
    fn pinged(&self, op: impl FnOnce(&mut redis::Connection)) -> (f64, Stats) {
        let mut c = vk_conn(self.port);
        let pinger = Pinger::start(self.port);
        thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        op(&mut c);
        let secs = t0.elapsed().as_secs_f64();
        thread::sleep(Duration::from_millis(200));
        (secs, pinger.finish())
    }

    pub(crate) fn big_filters(&mut self) {
        progress("big filters: CREATE, UNLINK, DEL of a 100 M-member filter");
        const SECTION: &str = "Big filters";
        let key = format!("member:{BIG_SET}:bloom");
        let cap = BIG_MEMBERS.to_string();
        let create = |c: &mut redis::Connection| {
            let _: () = redis::cmd("MEMBER.CREATE")
                .arg(BIG_SET)
                .arg("CAPACITY")
                .arg(&cap)
                .query(c)
                .expect("MEMBER.CREATE of the big set");
        };
        let idle = {
            let pinger = Pinger::start(self.port);
            thread::sleep(Duration::from_secs(2));
            pinger.finish()
        };
        let (create_s, create_ping) = self.pinged(create);
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .query(&mut vk_conn(self.port))
            .unwrap_or(0);
        let (_, unlink_ping) = self.pinged(|c| {
            let _: i64 = redis::cmd("UNLINK").arg(&key).query(c).expect("UNLINK");
        });
        // Back to a complete filter (the set rebuilds itself; wait for it), then DEL.
        let _: i64 = redis::cmd("MEMBER.REBUILD")
            .arg(BIG_SET)
            .arg("SYNC")
            .query(&mut vk_conn(self.port))
            .unwrap_or(0);
        let (_, del_ping) = self.pinged(|c| {
            let _: i64 = redis::cmd("DEL").arg(&key).query(c).expect("DEL");
        });
        let idle_ms = idle.max_ms.max(1e-9);
        let describe = |s: &Stats| {
            format!(
                "{:.2} ms (p99 {:.3} ms; {} of {} PINGs > 2 ms)",
                s.max_ms, s.p99_ms, s.over_2ms, s.ops
            )
        };
        let idle_text = format!("{:.2} ms idle (same run)", idle.max_ms);
        self.r.row(
            SECTION,
            format!(
                "worst PING of another client during MEMBER.CREATE of a {:.0} MB filter \
                 ({create_s:.2} s)",
                bytes as f64 / 1e6
            ),
            describe(&create_ping),
            idle_text.clone(),
            Some(create_ping.max_ms / idle_ms),
            "≤ 2× idle",
            Some(create_ping.max_ms <= 2.0 * idle_ms),
        );
        self.r.row(
            SECTION,
            "worst PING of another client during UNLINK of that filter",
            describe(&unlink_ping),
            idle_text.clone(),
            Some(unlink_ping.max_ms / idle_ms),
            "≤ 2× idle",
            Some(unlink_ping.max_ms <= 2.0 * idle_ms),
        );
        self.r.row(
            SECTION,
            "worst PING of another client during DEL of that filter (frees on the main thread \
             unless lazyfree-lazy-user-del yes)",
            describe(&del_ping),
            idle_text,
            Some(del_ping.max_ms / idle_ms),
            "(diagnostic)",
            None,
        );
    }
}
