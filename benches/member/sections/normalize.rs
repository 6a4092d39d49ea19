//! `make bench` section `normalize`: what NORMALIZE and TOKENIZE cost on the hot path. Four
//! sets that differ only in those (none, lower, username, username + hmac-sha256), absent
//! items never repeating, ASCII and non-ASCII, measured by valkey-benchmark (8 connections)
//! as MEMBER.EXISTS pipelined 100 deep and as MEMBER.MEXISTS of 100, the four sets in turn,
//! four times, each round starting one set later (A B C D, B C D A, C D A B, D A B C; each
//! set's runs pooled) on one server. Beside each
//! rate, the server's main-thread CPU time per item (`INFO cpu`): on a machine shared with
//! other work the rates move with it, the CPU an item much less.

use crate::*;

const SECTION: &str = "Normalization and tokenization on the hot path (valkey-benchmark, 8 conns)";
const CONNS: usize = 8;
/// Items per MEXISTS call, and the pipeline depth of EXISTS.
const BATCH: usize = 100;
const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// The sets measured: name, what MEMBER.CREATE is given, and the label of their rows.
const SETS: [(&str, &[&str], &str); 4] = [
    ("norm_none", &["NORMALIZE", "none"], "none"),
    ("norm_lower", &["NORMALIZE", "lower"], "lower"),
    ("norm_username", &["NORMALIZE", "username"], "username"),
    (
        "norm_token",
        &["NORMALIZE", "username", "TOKENIZE", "hmac-sha256"],
        "username + hmac-sha256",
    ),
];

/// Rounds of the four sets in turn: one for each place in the order.
const ROUNDS: usize = SETS.len();

/// Item shapes: ASCII (nearly every username), and one with Latin accents, CJK and
/// full-width letters (every step of NORMALIZE username changes something).
const ITEMS: [(&str, &str); 2] = [
    ("ASCII", "absent:__rand_int__"),
    ("non-ASCII", "Ábsënt李ｘ:__rand_int__"),
];

/// The two ways of sending BATCH items: (label, pipeline depth, command for `set` and `item`).
fn command(batch: bool, set: &str, item: &str) -> (usize, Vec<String>) {
    if batch {
        let mut c = vec![
            "MEMBER.MEXISTS".to_string(),
            set.to_string(),
            "ITEMS".into(),
        ];
        c.extend(std::iter::repeat_n(item.to_string(), BATCH));
        (1, c)
    } else {
        let c = vec![
            "MEMBER.EXISTS".to_string(),
            set.to_string(),
            item.to_string(),
        ];
        (BATCH, c)
    }
}

/// The server's main thread's CPU so far (user + system), seconds.
fn main_thread_cpu(c: &mut redis::Connection) -> f64 {
    ["used_cpu_user_main_thread", "used_cpu_sys_main_thread"]
        .iter()
        .map(|f| {
            info_stat(c, "cpu", f)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .sum()
}

/// One set's measure, pooled over its runs.
#[derive(Clone, Copy, Default)]
struct Figure {
    items: f64,
    secs: f64,
    cpu: f64,
}

impl Figure {
    fn rate(&self) -> f64 {
        self.items / self.secs.max(1e-9)
    }

    /// `1 234 567/s, 0.21 µs CPU`.
    fn text(&self) -> String {
        let us = self.cpu * 1e6 / self.items.max(1.0);
        format!("{}, {us:.2} µs CPU", rate(self.rate()))
    }
}

impl Bench {
    /// Adds one run of `cmd` (`calls` calls) to `f`.
    fn norm_run(
        &self,
        c: &mut redis::Connection,
        f: &mut Figure,
        pipeline: usize,
        calls: u64,
        cmd: &[String],
    ) {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let before = main_thread_cpu(c);
        let st = vb_run(
            self.port,
            CONNS,
            pipeline,
            calls,
            Some(ABSENT_KEYSPACE),
            &args,
        );
        f.cpu += main_thread_cpu(c) - before;
        let per_call = if pipeline == 1 { BATCH as f64 } else { 1.0 };
        f.items += calls as f64 * per_call;
        f.secs += calls as f64 / st.rps().max(1e-9);
    }

    pub(crate) fn normalize(&mut self) {
        let dir = std::env::temp_dir().join(format!("member-bench-norm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("key dir");
        let path = dir.join("token.key");
        std::fs::write(&path, KEY_HEX).expect("key file");
        let mut c = vk_conn(self.port);
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("member.token-key-file")
            .arg(path.to_str().unwrap())
            .query(&mut c)
            .expect("CONFIG SET member.token-key-file");
        for (set, opts, _) in SETS {
            let _: () = redis::cmd("MEMBER.CREATE")
                .arg(set)
                .arg("CAPACITY")
                .arg(self.opts.members)
                .arg(opts)
                .query(&mut c)
                .expect("MEMBER.CREATE");
        }
        for (kind, item) in ITEMS {
            // [set][0: EXISTS, 1: MEXISTS]
            let mut figs = [[Figure::default(); 2]; SETS.len()];
            for (m, batch) in [false, true].into_iter().enumerate() {
                let what = if batch {
                    "MEXISTS of 100"
                } else {
                    "EXISTS pipelined 100"
                };
                progress(&format!(
                    "normalize: {kind} items, {what}, 4 sets × {ROUNDS}"
                ));
                // Sized once, on the plain set, to about `secs / 2` a run.
                let (pipeline, plain) = command(batch, SETS[0].0, item);
                let probe = if batch { 2_000 } else { 200_000 };
                let mut cal = Figure::default();
                self.norm_run(&mut c, &mut cal, pipeline, probe, &plain);
                let calls_per_s = cal.rate() / (BATCH / pipeline) as f64;
                let calls = ((calls_per_s * self.opts.secs / 2.0) as u64).max(probe);
                // Each round starts one set later, so that every set runs once in every place
                // of the order (a set run first or right after the slowest fares differently).
                for round in 0..ROUNDS {
                    for k in 0..SETS.len() {
                        let s = (k + round) % SETS.len();
                        let (pipeline, cmd) = command(batch, SETS[s].0, item);
                        self.norm_run(&mut c, &mut figs[s][m], pipeline, calls, &cmd);
                    }
                }
                for (s, (_, _, label)) in SETS.iter().enumerate().skip(1) {
                    let ratio = figs[s][m].rate() / figs[0][m].rate().max(1e-9);
                    let tokenized = s == SETS.len() - 1;
                    let (target, met) = match (kind, tokenized) {
                        ("ASCII", false) => ("≥ 0.95×", Some(ratio >= 0.95)),
                        ("ASCII", true) => ("≥ 0.8×", Some(ratio >= 0.8)),
                        _ => ("(figure)", None),
                    };
                    self.r.row(
                        SECTION,
                        format!("{kind} items, {what}: NORMALIZE {label} vs none, items/s"),
                        figs[s][m].text(),
                        format!("{} (none)", figs[0][m].text()),
                        Some(ratio),
                        target,
                        met,
                    );
                }
            }
            for (s, (_, _, label)) in SETS.iter().enumerate() {
                let ratio = figs[s][1].rate() / figs[s][0].rate().max(1e-9);
                self.r.row(
                    SECTION,
                    format!("{kind} items, NORMALIZE {label}: MEXISTS of 100 vs EXISTS pipelined 100, items/s"),
                    figs[s][1].text(),
                    format!("{} (EXISTS)", figs[s][0].text()),
                    Some(ratio),
                    "≥ 2×",
                    Some(ratio >= 2.0),
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
