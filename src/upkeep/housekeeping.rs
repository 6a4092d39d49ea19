//! The main thread's periodic upkeep (from the `mainq` timer, at most every `SWEEP_EVERY`):
//! expired recent-writes marks, the catalog check, rebuilds of missing or incomplete filters
//! and periodic ones, auto-grow, cluster ownership and slot fills, the latency threshold, the
//! memory budget, and the sync loop's sweep.

use std::time::{Duration, Instant};

use redis_module::{Context, RedisString};

use crate::sets::state::{catch_up_at, with, Rebuild};
use crate::{config, filter::store, upkeep::rebuild};

const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// What the main-thread timer runs after its queued tasks on every tick (handed to
/// `mainq::start`): replication of the effects batched meanwhile, a sync pass a change
/// notification asked for, and the periodic sweep (`run`).
pub fn tick(ctx: &Context) {
    crate::server::replication::flush_replication(ctx);
    // Another history of the database is answered before anything else (docs/failover.md).
    crate::upkeep::history::react(ctx);
    crate::upkeep::history::tell_unreadable(ctx);
    // A change notification starts its pass within this tick, not the next sweep.
    crate::upkeep::sync::poke(ctx);
    run(ctx);
}

/// Periodic upkeep from the main-thread timer: drops expired marks, reads the catalog when
/// due, and starts a rebuild for every set whose filter is missing or incomplete.
pub fn run(ctx: &Context) {
    let now = Instant::now();
    let due = with(|r| {
        if r.last_sweep
            .is_some_and(|t| now.duration_since(t) < SWEEP_EVERY)
        {
            return false;
        }
        r.last_sweep = Some(now);
        true
    });
    if !due {
        return;
    }
    with(|r| {
        for s in r.sets.values_mut() {
            s.purge_marks(now);
        }
    });
    crate::sets::catalog::tick(now);
    let promoted = with(|r| {
        let graces = r.catch_ups.len();
        r.catch_ups.retain(|t| *t > now);
        std::mem::take(&mut r.promoted) || r.catch_ups.len() < graces
    });
    let every = config::rebuild_interval();
    let idle: Vec<(String, RedisString, bool)> = with(|r| {
        r.sets
            .values()
            .filter(|s| matches!(s.rebuild, Rebuild::Idle))
            .filter(|s| s.next_rebuild_try.is_none_or(|t| now >= t))
            .map(|s| {
                let due = every.is_some_and(|e| {
                    s.last_rebuild
                        .as_ref()
                        .is_none_or(|(at, _)| now.duration_since(*at) >= e)
                });
                (s.def.name.clone(), s.filter_key.clone(), due)
            })
            .collect()
    });
    for (name, key, due) in idle {
        let complete = store::with(ctx, &key, |f| f.cov.complete).unwrap_or(false);
        if !complete {
            rebuild::start(&name, rebuild::Reason::Incomplete);
        } else if due {
            rebuild::start(&name, rebuild::Reason::Periodic);
        }
    }
    crate::upkeep::grow::check(ctx, now);
    crate::sets::standing::tick(ctx);
    crate::upkeep::node_report::tick(ctx, now);
    crate::sets::rotation::tick(ctx);
    crate::upkeep::rotation::tick(ctx, now);
    if crate::server::cluster_mode::enabled() {
        if let Some(at) = crate::cluster::owner::poll(ctx) {
            catch_up_at(at);
        }
        crate::upkeep::slot_fill::schedule(ctx);
    }
    let strangers = strangers_waiting(ctx, now);
    crate::server::latency::refresh(ctx, now);
    if memory_refresh_due(now) {
        crate::sets::limits::refresh_memory_budget(ctx);
    }
    crate::upkeep::sync::run(ctx, promoted || strangers);
}

/// How often at most a sweep starts sync passes early for untrusted filter values.
const STRANGERS_EVERY: Duration = Duration::from_secs(1);

/// True (at most once per `STRANGERS_EVERY`) when a set's key holds a complete filter value
/// that the set does not trust (moved or copied back, restored, loaded), or that has not
/// caught up in the node's current epoch though its standing would let it (a set learned, or
/// a filter installed, after the pass that ended a grace; docs/replicas.md): the sync loop
/// then catches it up now rather than after a whole `member.sync-interval-ms`, during which
/// every lookup of the set would go to the database.
fn strangers_waiting(ctx: &Context, now: Instant) -> bool {
    let sets: Vec<(RedisString, Option<u64>, bool)> = with(|r| {
        if r.strangers_seen
            .is_some_and(|t| now.duration_since(t) < STRANGERS_EVERY)
        {
            return Vec::new();
        }
        let may_serve = r.standing.withheld(now).is_none();
        r.sets
            .values()
            .map(|s| {
                let behind = may_serve && s.synced_epoch != r.epoch;
                (s.filter_key.clone(), s.trusted, behind)
            })
            .collect()
    });
    let found = sets.iter().any(|(key, trusted, behind)| {
        store::with(ctx, key, |f| {
            f.cov.complete && f.cov.watermark.is_some() && (*behind || !f.trusted(*trusted))
        })
        .unwrap_or(false)
    });
    if found {
        with(|r| r.strangers_seen = Some(now));
    }
    found
}

/// True at most once a second: time to refresh the memory budget rebuild threads read.
fn memory_refresh_due(now: Instant) -> bool {
    thread_local! {
        static LAST: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }
    LAST.with(|l| {
        let due = l
            .get()
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
        if due {
            l.set(Some(now));
        }
        due
    })
}
