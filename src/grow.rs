//! Auto-grow (`member.auto-grow`): a set whose filter has outgrown its rate (estimated FPR
//! above twice its ERROR) gets a rebuild sized for twice its rows, by itself, one at a time
//! and with a backoff; a filter built for settings an ALTER changed is rebuilt too. The
//! decisions are plain Rust (`Grow`, `stale`); `check` is the housekeeping glue.

use std::time::{Duration, Instant};

use redis_module::{Context, ContextFlags, RedisString};

use crate::rebuild::{self, Reason};
use crate::state::{self, Rebuild};
use crate::{config, filter_store, metrics};

/// A filter grows once its estimated FPR is more than this many times the set's ERROR.
pub const TRIGGER: f64 = 2.0;
/// Least time between two automatic rebuilds of one set (whatever their outcome).
const MIN_GAP: Duration = Duration::from_secs(5);
/// Backoff after the first failed automatic rebuild, doubled for each further one in a row.
const BACKOFF_FIRST: Duration = Duration::from_secs(10);
/// Longest backoff, and how long a grown filter that would not fit waits to be looked at again.
const BACKOFF_MAX: Duration = Duration::from_secs(600);
/// How often housekeeping looks at the sets' fill (a sweep runs every 100 ms; a filter fills
/// far slower than that, and a node may hold many sets).
const CHECK_EVERY: Duration = Duration::from_secs(1);

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

/// An idle set, as housekeeping looks at it.
struct Idle {
    name: String,
    key: RedisString,
    rate: f64,
    capacity: u64,
    /// Its last rebuild failed.
    failed: bool,
    /// Auto-grow is on and no backoff holds it back.
    may_grow: bool,
}

/// True when a filter built for `(rate, capacity)` (capacity `None`: a cluster node's share,
/// not compared) does not serve a set of `rate` and `capacity`: built before an ALTER.
pub fn stale(built_for: (f64, Option<u64>), rate: f64, capacity: u64) -> bool {
    built_for.0 != rate || built_for.1.is_some_and(|c| c < capacity)
}

/// Housekeeping, once per `CHECK_EVERY`, on primaries only (a replica gets its primary's
/// filters): rebuilds a complete filter built for other settings (`stale`), and, when
/// `member.auto-grow` is on, starts an automatic rebuild for every idle set whose complete
/// filter has outgrown its rate. O(1) per set: the filter keeps its fill and its sizing.
pub fn check(ctx: &Context, now: Instant) {
    thread_local! {
        static LAST: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }
    let due = LAST.with(|l| {
        let due = l.get().is_none_or(|t| now.duration_since(t) >= CHECK_EVERY);
        if due {
            l.set(Some(now));
        }
        due
    });
    if !due || ctx.get_flags().contains(ContextFlags::SLAVE) {
        return;
    }
    let auto_grow = config::auto_grow();
    let idle: Vec<Idle> = state::with(|r| {
        r.sets
            .values()
            .filter(|s| matches!(s.rebuild, Rebuild::Idle))
            .filter(|s| s.next_rebuild_try.is_none_or(|t| now >= t))
            .map(|s| Idle {
                name: s.def.name.clone(),
                key: s.filter_key.clone(),
                rate: s.def.error_rate,
                capacity: s.def.capacity,
                failed: s.last_rebuild.as_ref().is_some_and(|(_, o)| o.is_err()),
                may_grow: auto_grow && s.grow.may_start(now),
            })
            .collect()
    });
    for Idle {
        name,
        key,
        rate,
        capacity,
        failed,
        may_grow,
    } in idle
    {
        let seen = filter_store::with(ctx, &key, |f| {
            let b = &f.bloom;
            let built_for = (b.configured_fpr(), f.slots.is_none().then(|| b.capacity()));
            (f.cov.complete, b.estimated_fpr(), b.items(), built_for)
        });
        let Some((true, est, items, built_for)) = seen else {
            continue;
        };
        if !failed && stale(built_for, rate, capacity) {
            // Built before an ALTER this node did not see (it was down, say): rebuilt once
            // with the set's settings (not again after a failure: REBUILD or ALTER retry).
            if rebuild::start(&name, Reason::Alter) {
                crate::reply::log(
                    ctx,
                    crate::reply::Level::Notice,
                    &format!(
                        "libmember: set '{name}': its filter was built for other settings \
                         than ERROR {rate} CAPACITY {capacity}: rebuilding it"
                    ),
                );
            }
            continue;
        }
        if !may_grow || !Grow::outgrown(est, rate) {
            continue;
        }
        // The rows are about the filter's items: a grown filter that cannot fit is not
        // tried (each try would stream the whole table), only reported.
        let members = items.saturating_mul(2);
        let fits = crate::command::settings::check_filter_size(members, rate).and_then(|()| {
            crate::limits::check_memory(
                crate::filter::bytes_for(members, rate),
                crate::limits::memory_budget(),
            )
        });
        if let Err(why) = fits {
            let why = format!("cannot grow the filter for about {items} rows: {why}");
            if state::with(|r| {
                r.sets
                    .get_mut(&name)
                    .map(|s| s.grow.refused(why.clone(), now))
            }) == Some(true)
            {
                crate::reply::log(
                    ctx,
                    crate::reply::Level::Warning,
                    &format!("libmember: set '{name}': {why}"),
                );
            }
            continue;
        }
        state::with(|r| {
            if let Some(s) = r.sets.get_mut(&name) {
                s.grow.started(now);
            }
        });
        if rebuild::start(&name, Reason::AutoGrow) {
            metrics::global(|m| m.auto_grow_rebuilds += 1);
            crate::reply::log(
                ctx,
                crate::reply::Level::Notice,
                &format!(
                    "libmember: set '{name}' outgrew its filter (estimated FPR {est:.4} > \
                     {TRIGGER} x ERROR {rate}, about {items} items): rebuilding it sized for \
                     twice its rows (member.auto-grow)"
                ),
            );
        }
    }
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
    fn a_filter_built_for_other_settings_is_stale() {
        assert!(!stale((0.01, Some(1000)), 0.01, 1000));
        // Grown, or sized for more rows than CAPACITY: still right.
        assert!(!stale((0.01, Some(6000)), 0.01, 1000));
        assert!(stale((0.01, Some(1000)), 0.001, 1000));
        assert!(stale((0.01, Some(1000)), 0.01, 5000));
        // A cluster node's share is not compared.
        assert!(!stale((0.01, None), 0.01, 5000));
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
