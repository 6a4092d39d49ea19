//! Auto-grow (`member.auto-grow`): a set whose filter has outgrown its rate (estimated FPR
//! above twice its ERROR) gets a rebuild sized for twice its rows, by itself, one at a time
//! and with a backoff; a filter built for settings an ALTER changed is rebuilt too. The
//! decisions are plain Rust (`Grow`, `stale`); `check` is the housekeeping glue.

use std::time::{Duration, Instant};

use redis_module::{Context, ContextFlags, RedisString};

use crate::sets::state::{self, Rebuild};
use crate::upkeep::rebuild::{self, Reason};
use crate::{config, filter::store, server::metrics};

pub use crate::model::set_upkeep::{Grow, TRIGGER};

/// How often housekeeping looks at the sets' fill (a sweep runs every 100 ms; a filter fills
/// far slower than that, and a node may hold many sets).
const CHECK_EVERY: Duration = Duration::from_secs(1);

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
        let seen = store::with(ctx, &key, |f| {
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
                crate::server::reply::log(
                    ctx,
                    crate::server::reply::Level::Notice,
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
        let fits = crate::sets::limits::check_filter_size(members, rate).and_then(|()| {
            crate::server::transient::check_memory(
                crate::filter::bytes_for(members, rate),
                crate::server::transient::memory_budget(),
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
                crate::server::reply::log(
                    ctx,
                    crate::server::reply::Level::Warning,
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
            crate::server::reply::log(
                ctx,
                crate::server::reply::Level::Notice,
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
    fn a_filter_built_for_other_settings_is_stale() {
        assert!(!stale((0.01, Some(1000)), 0.01, 1000));
        // Grown, or sized for more rows than CAPACITY: still right.
        assert!(!stale((0.01, Some(6000)), 0.01, 1000));
        assert!(stale((0.01, Some(1000)), 0.001, 1000));
        assert!(stale((0.01, Some(1000)), 0.01, 5000));
        // A cluster node's share is not compared.
        assert!(!stale((0.01, None), 0.01, 5000));
    }
}
