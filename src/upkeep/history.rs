//! The main thread's answer to a change of the database's identity: another database, or
//! another history of it after a failover or a point-in-time restore (docs/failover.md, "What
//! a change does"). Nothing derived from the old one is believed any more: every filter is
//! made incomplete (its confirmed false positives go with it) and rebuilt by the housekeeping
//! sweep, the exact-match keys' epoch moves, and the marks of ended ADDs are dropped.

use std::cell::Cell;

use redis_module::Context;

use crate::db::identity;
use crate::filter::known_absent::KnownAbsent;
use crate::filter::store;
use crate::server::reply;
use crate::sets::{cache_epoch, state};

thread_local! {
    /// The identity generation the main thread last answered.
    static ANSWERED: Cell<u64> = const { Cell::new(0) };
    /// Whether the node said that it cannot read the timeline.
    static TOLD_UNREADABLE: Cell<bool> = const { Cell::new(false) };
}

/// Main thread, at every housekeeping sweep and before a sync pass applies: answers a change
/// of identity the workers saw, once.
pub fn react(ctx: &Context) {
    let now = identity::generation();
    if ANSWERED.with(|a| a.get()) == now {
        return;
    }
    answer(ctx, now);
}

/// Main thread, at every housekeeping sweep: says once that promotions cannot be seen, when
/// the role may not read the timeline.
pub fn tell_unreadable(ctx: &Context) {
    if identity::history_refused() && !TOLD_UNREADABLE.with(|t| t.replace(true)) {
        reply::log(
            ctx,
            reply::Level::Warning,
            "libmember: the module's database role may not call pg_walfile_name() or \
             pg_current_wal_lsn(): a promotion of a standby cannot be seen (db_history \
             unreadable); grant EXECUTE on both back (docs/failover.md)",
        );
    }
}

fn answer(ctx: &Context, now: u64) {
    ANSWERED.with(|a| a.set(now));
    let (history, changes, _) = identity::shown();
    cache_epoch::distrust_cache();
    let keys: Vec<_> = state::with(|r| {
        r.sets
            .values_mut()
            .map(|s| {
                s.distrust_marks();
                s.trusted = None;
                s.filter_key.clone()
            })
            .collect()
    });
    for key in &keys {
        store::with_mut(ctx, key, |f| {
            f.cov.complete = false;
            f.known_absent = KnownAbsent::default();
        });
    }
    reply::log(
        ctx,
        reply::Level::Warning,
        &format!(
            "libmember: the database behind member.pg-url is another one, or another history \
             of it (a failover or a point-in-time restore; now {history}, change {changes} \
             seen by this node): every filter ({} set(s)) rebuilds from it, and exact-match \
             keys, confirmed false positives and recent-writes marks made before are no longer \
             believed (docs/failover.md)",
            keys.len()
        ),
    );
}
