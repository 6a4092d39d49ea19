//! The derived-state effects of a membership change, applied on the main thread: one place
//! used by write completions on the primary, the replicated internal commands on replicas and
//! AOF load, and the sync loop.

use redis_module::{Context, ContextFlags, RedisString};

use crate::canon::Canon;
use crate::filter_store;
use crate::{keys, state};

/// `canon` became (or may have become) a member of `set`: set its filter bits, make a running
/// rebuild include it, drop its cache entry. A set without a filter gets none here: it falls
/// through to the database until its rebuild (which includes this item through the journal)
/// installs a complete one; allocating a whole filter on the main thread for one item would
/// stall every client for as long as the filter takes to zero. If the filter at the key is
/// not the one the set trusts, that one (moved away, or gone) missed the item and is trusted
/// no more.
pub fn added(ctx: &Context, set: &str, canon: &Canon) {
    state::with(|r| {
        let (key, prefix) = match r.sets.get_mut(set) {
            Some(s) => {
                s.journal(canon.hash);
                s.generation += 1;
                (s.filter_key.clone(), s.cache_prefix.clone())
            }
            None => (keys::filter_key(set), keys::cache_prefix(set)),
        };
        let at = filter_store::add(ctx, &key, canon.hash);
        // The trusted filter, if it is not the value that just took the item, missed it.
        if let Some(s) = r.sets.get_mut(set) {
            s.filter_added(at);
        }
        keys::cache_invalidate(ctx, &keys::cache_key(ctx, &prefix, canon));
    });
}

/// `canon` stopped being a member of `set`: drop its cache entry (the filter keeps its bits
/// until the next rebuild; a stale bit is only a false positive).
pub fn removed(ctx: &Context, set: &str, canon: &Canon) {
    let prefix = state::with(|r| match r.sets.get_mut(set) {
        Some(s) => {
            s.generation += 1;
            s.cache_prefix.clone()
        }
        None => keys::cache_prefix(set),
    });
    keys::cache_invalidate(ctx, &keys::cache_key(ctx, &prefix, canon));
}

/// Sends a derived-state effect to replicas and the AOF (never the database write itself).
///
/// While the server pauses replica traffic (`CLIENT PAUSE WRITE`, `FAILOVER`), propagating
/// from a module aborts the server (valkey-io/valkey#1921): effects are then queued, in
/// order, and sent by `flush_replication` once the pause ends. The local effects and the
/// client's reply do not wait.
pub fn replicate(ctx: &Context, command: &str, args: &[&[u8]]) {
    let must_queue = replica_traffic_paused() || HELD.with(|h| !h.borrow().is_empty());
    if must_queue {
        let owned = args.iter().map(|a| a.to_vec()).collect();
        HELD.with(|h| h.borrow_mut().push((command.to_string(), owned)));
    } else {
        ctx.replicate(command, args);
    }
}

/// `replicate` for arguments that are already server strings: they are passed by reference,
/// so even a large payload is not copied on the main thread.
pub fn replicate_strings(ctx: &Context, command: &str, args: &[&RedisString]) {
    let must_queue = replica_traffic_paused() || HELD.with(|h| !h.borrow().is_empty());
    if must_queue {
        let owned = args.iter().map(|a| a.as_slice().to_vec()).collect();
        HELD.with(|h| h.borrow_mut().push((command.to_string(), owned)));
    } else {
        ctx.replicate(command, args);
    }
}

thread_local! {
    static HELD: std::cell::RefCell<Vec<(String, Vec<Vec<u8>>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn replica_traffic_paused() -> bool {
    // SAFETY: a plain query of server state, on the main thread.
    unsafe { redis_module::raw::RedisModule_AvoidReplicaTraffic.unwrap()() != 0 }
}

/// Sends the effects held back during a pause, once it is over (main-thread timer).
pub fn flush_replication(ctx: &Context) {
    if replica_traffic_paused() {
        return;
    }
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    for (command, args) in held {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        ctx.replicate(&command, args.as_slice());
    }
}

/// True when this context executes on behalf of the primary or while loading the AOF: the
/// only callers internal commands accept.
pub fn from_replication_or_load(ctx: &Context) -> bool {
    ctx.get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
}
