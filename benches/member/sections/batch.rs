//! `make bench` section `batch`: items per second of MEMBER.MEXISTS / MEMBER.MADD of 100 items
//! against 100 pipelined EXISTS / ADDs and against MGET of 100 keys, all by valkey-benchmark
//! (50 connections; every `__rand_int__` of a command is drawn on its own).

use crate::*;

/// Items per multi-item call, and the pipeline depth of the single-item side.
const BATCH: usize = 100;
/// New items written by each run of each write side (four runs: A B B A).
const WRITES: u64 = 100_000;

/// `prefix` followed by BATCH copies of `item` (`__rand_int__` is drawn per copy).
fn batch_cmd(prefix: &[&str], item: &str) -> Vec<String> {
    prefix
        .iter()
        .map(|s| s.to_string())
        .chain(std::iter::repeat_n(item.to_string(), BATCH))
        .collect()
}

impl Bench {
    /// One valkey-benchmark figure in items per second: `per_call` items per command,
    /// `pipeline` commands in flight per connection.
    fn items_per_s(&self, pipeline: usize, keyspace: u64, cmd: &[String]) -> f64 {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let per_call = if pipeline == 1 { BATCH as f64 } else { 1.0 };
        let st = vb_timed(
            self.port,
            pipeline,
            self.opts.secs / 2.0,
            Some(keyspace),
            &args,
        );
        st.rps() * per_call
    }

    /// Like `items_per_s`, for a fixed `items` (writes: no calibration run, the table grows
    /// by exactly that much).
    fn items_fixed(&self, pipeline: usize, items: u64, cmd: &[String]) -> f64 {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let (per_call, n) = if pipeline == 1 {
            (BATCH as f64, items / BATCH as u64)
        } else {
            (1.0, items)
        };
        let st = vb_run(self.port, 50, pipeline, n, Some(ABSENT_KEYSPACE), &args);
        st.rps() * per_call
    }

    /// A B B A of two item rates, pooled as the mean of each side's two runs.
    fn abba_rate(&self, a: &dyn Fn() -> f64, b: &dyn Fn() -> f64) -> (f64, f64) {
        let (a1, b1, b2, a2) = (a(), b(), b(), a());
        ((a1 + a2) / 2.0, (b1 + b2) / 2.0)
    }

    pub(crate) fn batch(&mut self) {
        const SECTION: &str = "Many items per call (valkey-benchmark, 50 conns)";
        let mexists = batch_cmd(&["MEMBER.MEXISTS", SET, "ITEMS"], "absent:__rand_int__");
        let exists: Vec<String> = ["MEMBER.EXISTS", SET, "absent:__rand_int__"]
            .map(String::from)
            .to_vec();
        let mget = batch_cmd(&["MGET"], "absent:__rand_int__");
        for (pool, keyspace, target) in [
            ("a recurring pool of 100 000", REPEATED_KEYSPACE, true),
            ("never repeating", ABSENT_KEYSPACE, false),
        ] {
            progress(&format!(
                "batch: MEXISTS of {BATCH} absent items ({pool}) vs {BATCH} pipelined EXISTS"
            ));
            let (m, e) = self.abba_rate(&|| self.items_per_s(1, keyspace, &mexists), &|| {
                self.items_per_s(BATCH, keyspace, &exists)
            });
            let ratio = m / e.max(1e-9);
            self.r.row(
                SECTION,
                format!("absent items ({pool}): MEXISTS of {BATCH} vs {BATCH} pipelined EXISTS, items/s"),
                rate(m),
                format!("{} (EXISTS, pipeline {BATCH})", rate(e)),
                Some(ratio),
                if target { "≥ 2×" } else { "(diagnostic)" },
                target.then_some(ratio >= 2.0),
            );
            if target {
                progress(&format!(
                    "batch: MEXISTS of {BATCH} absent items vs MGET of {BATCH} absent keys"
                ));
                let (m, g) = self.abba_rate(&|| self.items_per_s(1, keyspace, &mexists), &|| {
                    self.items_per_s(1, keyspace, &mget)
                });
                self.r.row(
                    SECTION,
                    format!("absent items ({pool}): MEXISTS of {BATCH} vs MGET of {BATCH} absent keys, items/s"),
                    rate(m),
                    format!("{} (MGET)", rate(g)),
                    Some(m / g.max(1e-9)),
                    "(GET-equivalent)",
                    None,
                );
            }
        }
        progress(&format!(
            "batch: MADD of {BATCH} new items vs {BATCH} pipelined ADDs"
        ));
        let madd = batch_cmd(&["MEMBER.MADD", SET, "ITEMS"], "madd:__rand_int__");
        let add: Vec<String> = ["MEMBER.ADD", SET, "padd:__rand_int__"]
            .map(String::from)
            .to_vec();
        let (m, a) = self.abba_rate(&|| self.items_fixed(1, WRITES, &madd), &|| {
            self.items_fixed(BATCH, WRITES, &add)
        });
        self.r.row(
            SECTION,
            format!("new items: MADD of {BATCH} vs {BATCH} pipelined ADDs, items/s"),
            rate(m),
            format!("{} (ADD, pipeline {BATCH})", rate(a)),
            Some(m / a.max(1e-9)),
            "(figure)",
            None,
        );
    }
}
