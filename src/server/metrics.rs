//! Counters and latency percentiles, bumped where each path is decided and read by INFO.
//! Main-thread only (thread-local), so the hot path pays no atomics and no lock.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use crate::model::funnel::Path;

/// Per-path counters of MEMBER.EXISTS, kept per set and globally.
#[derive(Clone, Debug, Default)]
pub struct PathCounters {
    pub exists: u64,
    pub bloom_negative: u64,
    pub bloom_positive: u64,
    pub filter_incomplete: u64,
    /// Lookups whose filter was not asked because its set has not caught up in the node's
    /// current epoch (a promotion, a replica's link down or just up: docs/replicas.md).
    /// Counted in `filter_incomplete` too.
    pub withheld: u64,
    pub recent: u64,
    pub cache_hit: u64,
    pub fp_cache: u64,
    pub db_hit: u64,
    pub db_miss: u64,
    /// Database misses of items a complete, trusted filter let through (an incomplete or
    /// missing filter lets everything through: those misses are not the filter's), other than
    /// lapsed members.
    pub false_positives: u64,
    /// Lookups the filter let through of members that lapsed since it was built (deleted,
    /// expired, marked inactive), answered by the database or the fp-cache.
    pub lapsed: u64,
    /// The part of `lapsed` answered by the fp-cache (counted in `fp_cache` too).
    pub lapsed_cached: u64,
    pub db_errors: u64,
    pub adds: u64,
    pub adds_new: u64,
    pub dels: u64,
}

impl PathCounters {
    pub fn record(&mut self, path: Path) {
        match path {
            Path::BloomNegative => self.bloom_negative += 1,
            Path::Recent => self.recent += 1,
            Path::CacheHit => self.cache_hit += 1,
            Path::FpCache => self.fp_cache += 1,
            Path::DbHit => self.db_hit += 1,
            Path::DbMiss => self.db_miss += 1,
        }
    }

    fn ratio(a: u64, b: u64) -> f64 {
        if b == 0 {
            0.0
        } else {
            a as f64 / b as f64
        }
    }

    /// Share of EXISTS calls the filter let through.
    pub fn bloom_exists_true_rate(&self) -> f64 {
        Self::ratio(self.bloom_positive, self.exists)
    }
    /// Share of EXISTS calls that went to PostgreSQL.
    pub fn db_fallback_rate(&self) -> f64 {
        Self::ratio(self.db_hit + self.db_miss + self.recent, self.exists)
    }
    /// Share of absent items the filter wrongly let through: filter hits the database
    /// answered "absent" (now or moments ago, `fp_cache`), over the absent items the filter
    /// judged. Lookups past an incomplete or missing filter are not its false positives, nor
    /// are lookups of members that lapsed since it was built (`lapsed`): the filter rightly
    /// holds those, so this rate is the one to hold against the set's ERROR.
    pub fn false_positive_rate_est(&self) -> f64 {
        let fp = self.false_positives + self.fp_cache.saturating_sub(self.lapsed_cached);
        Self::ratio(fp, fp + self.bloom_negative)
    }
}

/// Log-linear latency histogram in microseconds: 8 sub-buckets per power of two.
#[derive(Clone, Debug)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; 64 * 8],
            count: 0,
        }
    }
}

impl Histogram {
    fn index(us: u64) -> usize {
        if us < 8 {
            return us as usize;
        }
        let msb = 63 - us.leading_zeros() as u64;
        let sub = (us >> (msb - 3)) & 7;
        ((msb - 2) * 8 + sub) as usize
    }

    fn upper(idx: usize) -> u64 {
        if idx < 8 {
            return idx as u64;
        }
        let msb = (idx / 8) as u64 + 2;
        let sub = (idx % 8) as u64;
        ((8 + sub + 1) << (msb - 3)) - 1
    }

    pub fn record(&mut self, us: u64) {
        self.record_n(us, 1);
    }

    /// Records one sampled call, which took `took`, standing for `SAMPLE_EVERY` calls. Its time
    /// is rounded up to the microsecond, as every bucket's bound is: a call answered in 300 ns
    /// counts as 1 µs, so a quantile is never below a time it stands for (truncated, a fast
    /// release build's calls all read 0 µs).
    pub fn record_sample(&mut self, took: Duration) {
        let us = u64::try_from(took.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX);
        self.record_n(us, SAMPLE_EVERY);
    }

    fn record_n(&mut self, us: u64, n: u64) {
        let i = Self::index(us).min(self.buckets.len() - 1);
        self.buckets[i] += n;
        self.count += n;
    }

    /// The q-quantile (0..=1) in microseconds, as the upper bound of its bucket (≤12.5 % high).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let target = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                return Self::upper(i);
            }
        }
        Self::upper(self.buckets.len() - 1)
    }
}

/// Module-wide figures for `INFO member`.
#[derive(Debug, Default)]
pub struct Global {
    pub paths: PathCounters,
    pub exists_latency: Histogram,
    pub db_timeouts: u64,
    pub rebuilds_done: u64,
    /// Rebuilds `member.auto-grow` started.
    pub auto_grow_rebuilds: u64,
    /// Replicated filters (`MEMBER._LOAD`) decoded off the main thread and swapped in.
    pub loads_off_thread: u64,
    pub rebuilds_failed: u64,
    /// Atomic slot migration events (`CLUSTER MIGRATESLOTS`) this node followed.
    pub slot_migration_events: u64,
}

thread_local! {
    static GLOBAL: RefCell<Global> = RefCell::new(Global::default());
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

/// One EXISTS call in this many has its latency measured (two clock reads spared on the
/// others); each measured call counts for this many in the histogram.
pub const SAMPLE_EVERY: u64 = 8;

/// The start time of a call whose latency is to be measured, for one call in SAMPLE_EVERY.
#[inline]
pub fn sample_start() -> Option<Instant> {
    CALLS.with(|c| {
        let n = c.get().wrapping_add(1);
        c.set(n);
        n.is_multiple_of(SAMPLE_EVERY).then(Instant::now)
    })
}

/// Access to the module-wide figures (main thread).
pub fn global<R>(f: impl FnOnce(&mut Global) -> R) -> R {
    GLOBAL.with(|g| f(&mut g.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_monotonic_and_tight() {
        let mut prev = 0;
        for us in 0..100_000u64 {
            let i = Histogram::index(us);
            assert!(i >= prev);
            prev = i;
            let up = Histogram::upper(i);
            assert!(up >= us, "{us} -> {up}");
            assert!(up as f64 <= us as f64 * 1.125 + 1.0, "{us} -> {up}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        for us in 1..=1000 {
            h.record(us);
        }
        let p50 = h.quantile(0.5);
        assert!((500..=570).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((990..=1120).contains(&p99), "{p99}");
        assert_eq!(Histogram::default().quantile(0.99), 0);
    }

    #[test]
    fn a_sampled_call_is_rounded_up_to_the_microsecond() {
        let mut h = Histogram::default();
        h.record_sample(Duration::from_nanos(300));
        assert_eq!(h.quantile(0.999), 1);
        h.record_sample(Duration::from_nanos(2_001));
        assert_eq!(h.quantile(0.999), 3);
        assert_eq!(h.quantile(0.5), 1);
    }

    #[test]
    fn rates() {
        let mut c = PathCounters {
            exists: 100,
            bloom_positive: 10,
            ..Default::default()
        };
        c.bloom_negative = 90;
        c.db_miss = 3;
        c.false_positives = 1;
        c.db_hit = 2;
        c.cache_hit = 5;
        assert_eq!(c.bloom_exists_true_rate(), 0.1);
        assert_eq!(c.db_fallback_rate(), 0.05);
        assert!((c.false_positive_rate_est() - 1.0 / 91.0).abs() < 1e-12);
        // Lapsed members answered by the fp-cache are not the filter's false positives.
        c.fp_cache = 3;
        c.lapsed = 4;
        c.lapsed_cached = 2;
        assert!((c.false_positive_rate_est() - 2.0 / 92.0).abs() < 1e-12);
    }
}
