//! The server's events the module follows. Keyspace notifications for the writes of other
//! commands (SET, APPEND, COPY, RENAME, MOVE, RESTORE, EXPIRE, PERSIST …), SWAPDB and loading a
//! snapshot can put a value the module did not write onto its keys: filters carry an identity,
//! and the pointers to them that sets remember are dropped on every one of these
//! (`store::keys_changed`). A replica's link to its primary going down or up can hide a slot's
//! move (`cluster::owner`). The only room that subscribes to them.

use std::os::raw::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::server_events::LoadingSubevent;
use redis_module::{raw, Context, NotifyEvent};

use crate::sets::{cache_epoch, keys};

/// Generic keyspace events (`event_handlers` in lib.rs). A value put onto an exact-match key
/// by another command (COPY, RENAME, MOVE, RESTORE: maybe an entry the module wrote before a
/// DEL removed it) or a TTL changed there (EXPIRE, PERSIST: an entry must not outlive its
/// membership) is not believed (`foreign_writes`); a key that only went away is harmless.
pub fn on_generic(ctx: &Context, _kind: NotifyEvent, event: &str, key: &[u8]) {
    let gone = matches!(event, "del" | "rename_from" | "move_from");
    if !gone && keys::is_cache_key(key) {
        crate::sets::foreign_writes::written(ctx, key);
    }
}

/// String-class events (SET, SETRANGE, APPEND, GETSET, MSET, INCR, BITOP …): the only
/// commands that can put a string onto a key, and only a string equal to the module's own can
/// be believed as an exact-match entry (`foreign_writes`); a value of another type there never
/// reads as one, and the next fill replaces it. The list, set, hash, sorted set and stream
/// classes are not subscribed to: their writes cost the module nothing.
pub fn on_write(ctx: &Context, _kind: NotifyEvent, _event: &str, key: &[u8]) {
    if keys::is_cache_key(key) {
        crate::sets::foreign_writes::written(ctx, key);
    }
}

/// FLUSHALL / FLUSHDB remove every key without an event per key.
#[redis_module_macros::flush_event_handler]
fn on_flush(_ctx: &Context, _sub: redis_module::server_events::FlushSubevent) {
    crate::filter::store::keys_changed();
}

/// Loading a snapshot (DEBUG RELOAD, a replica's full sync) may bring back entries written
/// by this process before a DEL.
#[redis_module_macros::loading_event_handler]
fn on_loading(_ctx: &Context, sub: LoadingSubevent) {
    crate::filter::store::keys_changed();
    if sub != LoadingSubevent::Ended && sub != LoadingSubevent::Failed {
        cache_epoch::distrust_cache();
        // The filters held in module memory come back with the dataset (its aux field), and
        // every slot is accepted afresh (a replica's full sync may follow a new primary).
        if crate::server::cluster_mode::enabled() {
            crate::filter::store::clear();
            crate::cluster::owner::unaccept(None);
        }
    }
}

/// Subscribes to SWAPDB and to a replica's link to its primary (the crate wraps neither).
/// Call once from module load.
pub fn subscribe(ctx: &Context) -> Result<(), &'static str> {
    type Callback =
        unsafe extern "C" fn(*mut raw::RedisModuleCtx, raw::RedisModuleEvent, u64, *mut c_void);
    let events: [(u64, Callback, &'static str); 2] = [
        (
            raw::REDISMODULE_EVENT_SWAPDB,
            on_swapdb,
            "libmember: cannot subscribe to SWAPDB events",
        ),
        (
            raw::REDISMODULE_EVENT_MASTER_LINK_CHANGE,
            on_primary_link,
            "libmember: cannot subscribe to primary link events",
        ),
    ];
    for (id, callback, failed) in events {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: module load, main thread; the callback is a plain extern "C" fn.
        let rc = unsafe {
            raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, event, Some(callback))
        };
        if rc != raw::REDISMODULE_OK as i32 {
            return Err(failed);
        }
    }
    Ok(())
}

/// A replica's link to its primary went down or came up: its filters stop answering "absent"
/// until the link is up and they have caught up since (`sets/standing.rs`). While it was down,
/// the primary ran
/// any `CLUSTER SETSLOT` without replicating it (Valkey replicates it only to replicas online
/// at that moment), so a slot may have left and come back unseen: in cluster mode every slot
/// is accepted afresh (`cluster::owner`).
///
/// # Safety
/// Called by the server on the main thread.
unsafe extern "C" fn on_primary_link(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    sub: u64,
    _data: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if crate::server::cluster_mode::enabled() {
            crate::cluster::owner::unaccept(None);
        }
        let ctx = Context::new(ctx);
        let up = sub == raw::REDISMODULE_SUBEVENT_MASTER_LINK_UP;
        crate::sets::standing::on_link(&ctx, up);
    }));
}

/// SWAPDB involving DB 0 replaces every exact-match key at once, entries set aside before a
/// DEL included.
///
/// # Safety
/// Called by the server on the main thread; `data` is a `RedisModuleSwapDbInfo`.
unsafe extern "C" fn on_swapdb(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _sub: u64,
    data: *mut c_void,
) {
    // SAFETY: for this event the server passes a RedisModuleSwapDbInfo (or null).
    let dbs = unsafe { data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() }
        .map(|i| (i.dbnum_first, i.dbnum_second));
    crate::filter::store::keys_changed();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if dbs.is_none_or(|(a, b)| a == 0 || b == 0) {
            cache_epoch::distrust_cache();
        }
    }));
}
