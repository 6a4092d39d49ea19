//! The only home of the raw blocked-client API. `Blocked` is a safe, `Send` handle that a
//! worker finishes with a `Completion`; dropping it unfinished (a panic, a full queue) still
//! unblocks the client with its fallback, so every blocked client gets exactly one reply.

use std::os::raw::{c_int, c_longlong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_module::{raw, Context, RedisError, RedisResult};

use crate::{error, keys, mainq, metrics, reply};

/// The result of a worker's job, finished on the main thread.
pub trait Completion: Send + 'static {
    /// Applies derived-state effects (filter bits, cache, marks). Called exactly once, on the
    /// main thread with DB 0 selected: from the reply callback, or later from the main-thread
    /// queue when the client timed out or disconnected.
    fn apply(&mut self, ctx: &Context);
    /// The reply for the waiting client, after `apply`. Not called if the client is gone.
    fn reply(&mut self, ctx: &Context) -> RedisResult;
}

/// A finished job on its way to the reply callback, and when its client was blocked (for the
/// LATENCY monitor: `None` for waits that are not database resolutions).
struct Slot(Option<Box<dyn Completion>>, Option<Instant>);

/// Clients blocked through a `Blocked` handle and not yet unblocked (`member.max-blocked-clients`
/// bounds it, see `limits.rs`).
static WAITING: AtomicU64 = AtomicU64::new(0);

/// How many clients wait on a `Blocked` handle now.
pub fn waiting() -> u64 {
    WAITING.load(Ordering::Relaxed)
}

/// A client blocked on a database job.
pub struct Blocked {
    bc: Option<NonNull<raw::RedisModuleBlockedClient>>,
    fallback: Option<Box<dyn Completion>>,
    /// When the client was blocked, for waits bounded by a timeout (a database resolution):
    /// the reply callback reports slow ones to the LATENCY monitor (`latency.rs`). Unbounded
    /// waits (REBUILD SYNC, a CREATE's build) are not resolutions and are not reported.
    since: Option<Instant>,
}

// SAFETY: the server allows RedisModule_UnblockClient from any thread; the handle is used once.
unsafe impl Send for Blocked {}

impl Blocked {
    /// Blocks the calling client for at most `timeout` (zero: until finished). `fallback` is what the client gets if
    /// this handle is dropped without `finish` (worker panic, queue full).
    ///
    /// The caller must have checked that blocking is allowed (not in MULTI, Lua or functions).
    pub fn block(ctx: &Context, timeout: Duration, fallback: Box<dyn Completion>) -> Blocked {
        // SAFETY: ctx is the live command context; the callbacks match the API's signatures.
        let bc = unsafe {
            raw::RedisModule_BlockClient.unwrap()(
                ctx.ctx,
                Some(reply_cb),
                Some(timeout_cb),
                Some(free_cb),
                // 0 means no timeout (MEMBER.REBUILD SYNC).
                timeout.as_millis() as c_longlong,
            )
        };
        let bc = NonNull::new(bc);
        if bc.is_some() {
            WAITING.fetch_add(1, Ordering::Relaxed);
        }
        Blocked {
            bc,
            fallback: Some(fallback),
            since: (!timeout.is_zero()).then(Instant::now),
        }
    }

    /// The same client, answered with `fallback` instead if the handle is dropped unfinished
    /// (a handle passed on to a job that needs a different fallback).
    pub fn with_fallback(mut self, fallback: Box<dyn Completion>) -> Blocked {
        self.fallback = Some(fallback);
        self
    }

    /// Unblocks the client with `done`; its `apply` and `reply` run on the main thread.
    pub fn finish(mut self, done: Box<dyn Completion>) {
        self.unblock(done);
    }

    fn unblock(&mut self, done: Box<dyn Completion>) {
        if let Some(bc) = self.bc.take() {
            WAITING.fetch_sub(1, Ordering::Relaxed);
            let slot = Box::into_raw(Box::new(Slot(Some(done), self.since))).cast::<c_void>();
            // SAFETY: bc came from BlockClient and is unblocked exactly once (taken above).
            unsafe { raw::RedisModule_UnblockClient.unwrap()(bc.as_ptr(), slot) };
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        if let Some(fb) = self.fallback.take() {
            self.unblock(fb);
        }
    }
}

/// Reply callback: the worker finished and the client is still waiting.
///
/// # Safety
/// Called by the server on the main thread with a context whose private data is our `Slot`.
unsafe extern "C" fn reply_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let ctx = Context::new(ctx);
    // SAFETY: the private data is the Slot we passed to UnblockClient; free_cb frees it later.
    let slot =
        unsafe { raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx.ctx) }.cast::<Slot>();
    let Some(slot) = (unsafe { slot.as_mut() }) else {
        reply::send_error(&ctx, error::WORKER_LOST);
        return raw::REDISMODULE_OK as c_int;
    };
    match slot.0.take() {
        Some(mut done) => {
            // A panic must not unwind into the server (that aborts it): the client gets an
            // error instead, still exactly one reply.
            let reply = catch_unwind(AssertUnwindSafe(|| {
                keys::with_db0(&ctx, |ctx| {
                    done.apply(ctx);
                    done.reply(ctx)
                })
            }))
            .unwrap_or_else(|_| {
                reply::log(
                    &ctx,
                    reply::Level::Warning,
                    "libmember: internal error completing a request (contained)",
                );
                Err(RedisError::Str(error::INTERNAL))
            });
            reply::send(&ctx, reply);
            if let Some(since) = slot.1 {
                crate::latency::resolved(since.elapsed());
            }
        }
        None => {
            reply::send_error(&ctx, error::WORKER_LOST);
        }
    }
    raw::REDISMODULE_OK as c_int
}

/// Timeout callback: the database did not answer in time. The job still runs to its end and
/// its `apply` happens later through `free_cb`.
///
/// # Safety
/// Called by the server on the main thread with a valid context.
unsafe extern "C" fn timeout_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    metrics::global(|m| m.db_timeouts += 1);
    reply::send_error(&Context::new(ctx), error::DB_TIMEOUT);
    // The slowest resolution of all: it took at least the timeout (the handle's start time is
    // not reachable from here; every client that can time out waits `member.db-timeout-ms`).
    crate::latency::resolved(Duration::from_millis(crate::config::db_timeout_ms()));
    raw::REDISMODULE_OK as c_int
}

/// Frees the private data. If the reply callback did not run (timeout, disconnect), the
/// completion's effects are still applied, on the main-thread queue with a proper context.
///
/// # Safety
/// Called by the server on the main thread with the pointer we passed to UnblockClient.
unsafe extern "C" fn free_cb(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    if privdata.is_null() {
        return;
    }
    // SAFETY: privdata is the Box<Slot> leaked in `unblock`, freed only here.
    let slot = unsafe { Box::from_raw(privdata.cast::<Slot>()) };
    if let Some(done) = slot.0 {
        mainq::defer(done);
    }
}
