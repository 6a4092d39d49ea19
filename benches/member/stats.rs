//! What one measured load yields (`Stats`), the A B B A pairing of two loads, and the
//! random generator every load generator draws items from.

/// One measured load: operations over seconds, latency percentiles, and what went wrong.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stats {
    pub(crate) ops: u64,
    pub(crate) secs: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    /// Samples over 2 ms (where samples were kept).
    pub(crate) over_2ms: u64,
    /// Error replies.
    pub(crate) errors: u64,
    /// Replies that contradict what the load generator knows to be true.
    pub(crate) wrong: u64,
    pub(crate) first_error: Option<String>,
}

impl Stats {
    pub(crate) fn rps(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }

    pub(crate) fn from_samples(ops: u64, secs: f64, mut ns: Vec<u64>) -> Stats {
        ns.sort_unstable();
        let q = |p: f64| -> f64 {
            if ns.is_empty() {
                return 0.0;
            }
            let i = ((ns.len() as f64 * p).ceil() as usize).clamp(1, ns.len()) - 1;
            ns[i] as f64 / 1e6
        };
        Stats {
            ops,
            secs,
            p50_ms: q(0.50),
            p99_ms: q(0.99),
            max_ms: q(1.0),
            over_2ms: ns.iter().filter(|&&x| x > 2_000_000).count() as u64,
            ..Stats::default()
        }
    }

    /// Pools runs of the same load: throughput over all of them, mean percentiles.
    pub(crate) fn pool(runs: &[Stats]) -> Stats {
        let n = runs.len().max(1) as f64;
        Stats {
            ops: runs.iter().map(|r| r.ops).sum(),
            secs: runs.iter().map(|r| r.secs).sum(),
            p50_ms: runs.iter().map(|r| r.p50_ms).sum::<f64>() / n,
            p99_ms: runs.iter().map(|r| r.p99_ms).sum::<f64>() / n,
            max_ms: runs.iter().map(|r| r.max_ms).fold(0.0, f64::max),
            over_2ms: runs.iter().map(|r| r.over_2ms).sum(),
            errors: runs.iter().map(|r| r.errors).sum(),
            wrong: runs.iter().map(|r| r.wrong).sum(),
            first_error: runs.iter().find_map(|r| r.first_error.clone()),
        }
    }
}

/// Runs `a` and `b` in A B B A order and pools each side's two runs.
pub(crate) fn abba(mut a: impl FnMut() -> Stats, mut b: impl FnMut() -> Stats) -> (Stats, Stats) {
    let a1 = a();
    let b1 = b();
    let b2 = b();
    let a2 = a();
    (Stats::pool(&[a1, a2]), Stats::pool(&[b1, b2]))
}

/// splitmix64: a small, fast, good-enough generator for picking items.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ t)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}
