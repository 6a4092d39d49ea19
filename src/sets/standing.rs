//! The node's role and replication link as the registry follows them (the rules:
//! `model/standing.rs`, docs/replicas.md): each change that may leave a filter missing
//! acknowledged ADDs moves the promotion epoch, so no set's filter answers "absent" until work
//! that counts has caught it up again; the log says when a replica stops and resumes serving
//! "absent" from its filters. Main thread.

use std::cell::Cell;
use std::time::Instant;

use redis_module::{Context, ContextFlags};

use crate::config;
use crate::model::standing::{Standing, Withheld};
use crate::server::reply;
use crate::sets::state::{self, catch_up_at, with};

thread_local! {
    /// Whether the last look found every set's filter free to answer "absent" (for the log).
    static SERVING: Cell<bool> = const { Cell::new(true) };
    /// Sets a replica held back because no sync pass had caught them up within the lag bound
    /// since (`lag_bound`), and whether the last look found any still held back so.
    static LAGGED: Cell<(u64, bool)> = const { Cell::new((0, false)) };
}

/// How stale a replica's filter may be and still answer "absent": its last caught-up sync
/// pass (or the rebuild that built it) started less than this ago. Any ADD the primary
/// acknowledged before that start is in the filter whatever its link did since, so an ADD
/// acknowledged at T answers 1 on this replica by T + this bound at the latest (docs/replicas.md).
pub fn lag_bound() -> std::time::Duration {
    config::sync_interval() + config::handover_grace()
}

/// Module load: a node configured with `replicaof` starts as a replica whose link is not up
/// (no role-change event tells it).
pub fn at_load(ctx: &Context) {
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        with(|r| {
            r.standing = Standing::starting_as_replica(Instant::now());
            r.epoch += 1;
        });
        SERVING.with(|s| s.set(false));
    }
}

/// This node just became a primary (the role-change event, before any command runs in the
/// new role): no filter is trusted for "absent" until it has caught up again, by work started
/// a handover grace later.
pub fn on_promoted() {
    let now = Instant::now();
    let grace = config::handover_grace();
    with(|r| {
        r.epoch += 1;
        r.promoted = true;
        r.standing.promoted(now, grace);
    });
    catch_up_at(now + grace);
}

/// This node just became a replica (`REPLICAOF host port`, a Sentinel or cluster failover
/// turning an old primary into a replica): until its link is up and its filters have caught
/// up since, every lookup its filters would answer "absent" goes to cache and database.
pub fn on_demoted(ctx: &Context) {
    with(|r| {
        r.epoch += 1;
        r.standing.demoted(Instant::now());
    });
    stopped(ctx, "it became a replica");
}

/// The replica's link to its primary went down (`up` false) or came up.
pub fn on_link(ctx: &Context, up: bool) {
    let now = Instant::now();
    if !up {
        let moved = with(|r| {
            let moved = r.standing.link_lost(now);
            if moved {
                r.epoch += 1;
            }
            moved
        });
        if moved {
            stopped(ctx, "its link to the primary went down");
        }
        return;
    }
    let replid = crate::server::repl_info::replid(ctx);
    let shown = replid.clone().unwrap_or_else(|| "unknown".into());
    let from = with(|r| {
        r.standing
            .link_came_up(now, config::handover_grace(), replid)
    });
    if let Some(from) = from {
        // The pass that may make the filters current again starts as soon as it would count.
        catch_up_at(from);
        reply::log(
            ctx,
            reply::Level::Notice,
            &format!(
                "libmember: this replica's link to its primary is up (replication id {shown}): \
                 its filters answer \"absent\" again once a sync pass started {} ms from now \
                 has caught them up",
                from.saturating_duration_since(now).as_millis()
            ),
        );
    }
}

fn hold_back_lagging(ctx: &Context, now: Instant) {
    // Only a replica with its link up lags behind a primary; any other standing has its own
    // reason shown (a promotion's sets catch up, they do not lag).
    if !with(|r| r.standing.link_up()) {
        LAGGED.with(|l| l.set((l.get().0, false)));
        return;
    }
    let bound = lag_bound();
    let held = with(|r| {
        if !r.standing.link_up() {
            return Vec::new();
        }
        let epoch = r.epoch;
        r.sets
            .values_mut()
            .filter(|s| s.synced_epoch == epoch)
            .filter(|s| {
                s.covered_since
                    .is_some_and(|t| now.duration_since(t) > bound)
            })
            .map(|s| {
                s.synced_epoch = state::NOT_CURRENT;
                s.def.name.clone()
            })
            .collect::<Vec<_>>()
    });
    let still = !held.is_empty()
        || (LAGGED.with(|l| l.get().1)
            && with(|r| r.sets.values().any(|s| s.synced_epoch != r.epoch)));
    LAGGED.with(|l| {
        let (n, _) = l.get();
        l.set((n + held.len() as u64, still));
    });
    if !held.is_empty() {
        stopped(
            ctx,
            &format!(
                "no sync pass caught up {} set(s) within {} ms, the bound on how stale a \
                 replica's filter may be: {}",
                held.len(),
                bound.as_millis(),
                held.join(", ")
            ),
        );
    }
}

fn stopped(ctx: &Context, why: &str) {
    SERVING.with(|s| s.set(false));
    reply::log(
        ctx,
        reply::Level::Notice,
        &format!(
            "libmember: this replica stops answering \"absent\" from its filters ({why}): \
             lookups go to cache and database until its link is up and its filters have \
             caught up since (docs/replicas.md)"
        ),
    );
}

/// What INFO shows of a node's standing: whether its filters serve "absent" now, and why not.
pub struct Shown {
    pub replica: bool,
    pub link_up: bool,
    /// Why no filter serves "absent" now: the standing's reason, or `catching-up` while some
    /// set has not caught up in the current epoch (`lagging` when the lag bound held it back);
    /// `None` when every set's filter may.
    pub withheld: Option<&'static str>,
    /// Milliseconds since the role or the link last changed.
    pub since_ms: Option<u64>,
    pub link_losses: u64,
    /// Times a set was held back for lagging past the bound.
    pub lag_holds: u64,
}

/// The node's standing now, for INFO and the log.
pub fn shown() -> Shown {
    let now = Instant::now();
    with(|r| {
        let s = &r.standing;
        let lagging = r.sets.values().any(|set| set.synced_epoch != r.epoch);
        let lagged = LAGGED.with(|l| l.get().1);
        let behind = if lagged { "lagging" } else { "catching-up" };
        let withheld = s
            .withheld(now)
            .map(Withheld::name)
            .or(lagging.then_some(behind));
        Shown {
            replica: s.is_replica(),
            link_up: s.link_up(),
            withheld,
            since_ms: s.since().map(|t| now.duration_since(t).as_millis() as u64),
            link_losses: s.link_losses,
            lag_holds: LAGGED.with(|l| l.get().0),
        }
    })
}

/// Housekeeping: on a replica, holds back every set whose filter has not been caught up within
/// the lag bound (a stalled link, a database out of reach: its own sync is then all that bounds
/// how stale it is); says once when a replica's filters serve "absent" again.
pub fn tick(ctx: &Context) {
    hold_back_lagging(ctx, Instant::now());
    if SERVING.with(|s| s.get()) {
        return;
    }
    let s = shown();
    if s.withheld.is_some() {
        return;
    }
    SERVING.with(|c| c.set(true));
    if s.replica {
        let sets = with(|r| r.sets.len());
        reply::log(
            ctx,
            reply::Level::Notice,
            &format!(
                "libmember: this replica answers \"absent\" from its filters again: its link \
                 is up and the filters of its {sets} set(s) have caught up since"
            ),
        );
    }
}
