//! What the registry (`state.rs`) records of each set's upkeep, as plain data and decisions
//! with no server calls: why a rebuild ran and what its waiters hear (`Reason`, `Reply`, driven
//! by `rebuild.rs`), auto-grow's backoff (`Grow`, driven by `grow.rs`) and the sync loop's
//! progress (`SyncState`, driven by `sync.rs`).

use std::time::{Duration, Instant};

/// Why a rebuild started (MEMBER.INFO `last_rebuild_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// MEMBER.CREATE's first build.
    Create,
    /// MEMBER.REBUILD.
    Manual,
    /// The filter was missing or incomplete (housekeeping).
    Incomplete,
    /// `member.rebuild-interval-s`.
    Periodic,
    /// ERROR or CAPACITY changed (MEMBER.ALTER here or on another node).
    Alter,
    /// The set outgrew its filter (`member.auto-grow`): sized for twice its rows.
    AutoGrow,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Create => "create",
            Reason::Manual => "manual",
            Reason::Incomplete => "incomplete",
            Reason::Periodic => "periodic",
            Reason::Alter => "alter",
            Reason::AutoGrow => "auto-grow",
        }
    }
}

/// What a caller waiting for a rebuild hears when it succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// MEMBER.REBUILD SYNC: the number of members loaded.
    Rows,
    /// MEMBER.CREATE: OK.
    Ok,
    /// MEMBER.CREATE that found a build already running, started before its catalog step
    /// (a set table it only just made): OK; a failure of that build starts one more, whose
    /// outcome it hears instead.
    OkOrRetry,
    /// MEMBER.ALTER SYNC: OK once a filter with the settings it set is in.
    Altered,
}

/// A filter grows once its estimated FPR is more than this many times the set's ERROR.
pub const TRIGGER: f64 = 2.0;
/// Least time between two automatic rebuilds of one set (whatever their outcome).
const MIN_GAP: Duration = Duration::from_secs(5);
/// Backoff after the first failed automatic rebuild, doubled for each further one in a row.
const BACKOFF_FIRST: Duration = Duration::from_secs(10);
/// Longest backoff, and how long a grown filter that would not fit waits to be looked at again.
const BACKOFF_MAX: Duration = Duration::from_secs(600);
/// One set's auto-grow state (main thread).
#[derive(Debug, Default)]
pub struct Grow {
    /// Automatic rebuilds started (MEMBER.INFO `auto_grow_rebuilds`).
    pub rebuilds: u64,
    /// Failed automatic rebuilds in a row.
    failures: u32,
    /// No automatic rebuild starts before this.
    not_before: Option<Instant>,
    /// Why the grown filter cannot be made (too large, no memory), until one can.
    pub error: Option<String>,
}

impl Grow {
    /// True when a filter at `est_fpr` has outgrown a set of rate `error_rate`.
    pub fn outgrown(est_fpr: f64, error_rate: f64) -> bool {
        est_fpr > TRIGGER * error_rate
    }

    /// True when no backoff holds an automatic rebuild back at `now`.
    pub fn may_start(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }

    /// An automatic rebuild starts at `now`.
    pub fn started(&mut self, now: Instant) {
        self.rebuilds += 1;
        self.error = None;
        self.not_before = Some(now + MIN_GAP);
    }

    /// The automatic rebuild ended at `now`, `ok` or not: a failure backs off, doubling.
    pub fn finished(&mut self, ok: bool, now: Instant) {
        if ok {
            self.failures = 0;
            return;
        }
        self.failures = self.failures.saturating_add(1);
        let backoff = BACKOFF_FIRST
            .saturating_mul(1 << (self.failures - 1).min(16))
            .min(BACKOFF_MAX);
        self.not_before = Some(now + backoff);
    }

    /// The grown filter would not fit (`why`): looked at again after `BACKOFF_MAX`. True when
    /// the reason is new (worth a log line).
    pub fn refused(&mut self, why: String, now: Instant) -> bool {
        self.not_before = Some(now + BACKOFF_MAX);
        let new = self.error.as_deref() != Some(why.as_str());
        self.error = Some(why);
        new
    }
}

/// Per-set sync progress, shown by MEMBER.INFO.
#[derive(Debug, Default)]
pub struct SyncState {
    pub last_ok: Option<Instant>,
    pub last_error: Option<String>,
    pub rows_applied: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_past_twice_the_rate() {
        assert!(!Grow::outgrown(0.02, 0.01));
        assert!(Grow::outgrown(0.0201, 0.01));
        // A filter sized for n at p reaches 2p at about 1.2 n.
        let mut b = crate::filter::Bloom::new(1000, 0.01);
        for i in 0..1000u128 {
            b.add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835));
        }
        assert!(!Grow::outgrown(b.estimated_fpr(), 0.01));
        for i in 1000..1500u128 {
            b.add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835));
        }
        assert!(Grow::outgrown(b.estimated_fpr(), 0.01));
    }

    #[test]
    fn one_at_a_time_with_backoff() {
        let t0 = Instant::now();
        let mut g = Grow::default();
        assert!(g.may_start(t0));
        g.started(t0);
        assert_eq!(g.rebuilds, 1);
        assert!(!g.may_start(t0 + Duration::from_secs(1)));
        g.finished(true, t0 + Duration::from_secs(1));
        assert!(g.may_start(t0 + MIN_GAP));
        // Failures back off, doubling up to the cap.
        g.finished(false, t0);
        assert!(!g.may_start(t0 + BACKOFF_FIRST - Duration::from_millis(1)));
        assert!(g.may_start(t0 + BACKOFF_FIRST));
        g.finished(false, t0);
        assert!(!g.may_start(t0 + BACKOFF_FIRST * 2 - Duration::from_millis(1)));
        for _ in 0..40 {
            g.finished(false, t0);
        }
        assert!(g.may_start(t0 + BACKOFF_MAX));
        // A refusal is logged once per reason.
        assert!(g.refused("too large".into(), t0));
        assert!(!g.refused("too large".into(), t0));
        assert!(!g.may_start(t0 + BACKOFF_MAX - Duration::from_secs(1)));
        g.started(t0 + BACKOFF_MAX);
        assert!(g.error.is_none());
    }
}
