//! The only home of the raw blocked-client API. `Blocked` is a safe, `Send` handle that a
//! worker finishes with a `Completion`; dropping it unfinished (a panic, a full queue) still
//! unblocks the client with its fallback, so every blocked client gets exactly one reply.
//!
//! A wait bounded by a timeout is timed by the module itself (a main-thread timer), never by
//! the server: the client is blocked without a server timeout, and whichever of the timer and
//! the worker comes first unblocks it (an atomic swap decides). Redis 7.0 loses the reply of a
//! client that a module unblocks in the same event-loop iteration in which the server's own
//! timeout for it expires (fixed later upstream, redis#13015): the client then waits for ever.
//! With one party unblocking, that cannot happen on any server.

use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::{raw, Context, RedisError, RedisResult};

use crate::server::timer::{self, TimerId};
use crate::{model::error, server::mainq, server::metrics, server::reply};

/// The result of a worker's job, finished on the main thread.
pub trait Completion: Send + 'static {
    /// Applies derived-state effects (filter bits, cache, marks). Called exactly once, on the
    /// main thread with DB 0 selected: from the reply callback, or later from the main-thread
    /// queue when the client timed out or disconnected.
    fn apply(&mut self, ctx: &Context);
    /// The reply for the waiting client, after `apply`. Not called if the client is gone.
    fn reply(&mut self, ctx: &Context) -> RedisResult;
}

/// A completion that only answers with an error.
pub struct Fail(pub String);

impl Completion for Fail {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        Err(RedisError::String(self.0.clone()))
    }
}

/// Applies a completion whose client is gone, on the main thread within about one tick.
pub fn defer(mut done: Box<dyn Completion>) {
    mainq::post(Box::new(move |ctx| done.apply(ctx)));
}

/// A finished job on its way to the reply callback, when its client was blocked (for the
/// LATENCY monitor: `None` for waits that are not database resolutions), and the timeout
/// timer to call off once the client is answered, unless it fired meanwhile.
struct Slot(
    Option<Box<dyn Completion>>,
    Option<Instant>,
    Option<(TimerId, Handle)>,
);

/// Clients blocked through a `Blocked` handle and not yet unblocked (`member.max-blocked-clients`
/// bounds it, see `limits.rs`).
static WAITING: AtomicU64 = AtomicU64::new(0);

/// How many clients wait on a `Blocked` handle now.
pub fn waiting() -> u64 {
    WAITING.load(Ordering::Relaxed)
}

/// The bound of the latest bounded wait, in ms (`member.db-timeout-ms` as the command layer
/// gives it): what an operator's `CLIENT UNBLOCK … TIMEOUT` reports to the LATENCY monitor.
static BOUND_MS: AtomicU64 = AtomicU64::new(0);

/// The server's handle of a blocked client, taken by exactly one party: the worker's
/// `finish`, the drop of an unfinished handle, or the module's timeout timer.
type Handle = Arc<Shared>;

/// What a `Blocked` handle and its timeout timer share.
struct Shared {
    bc: AtomicPtr<raw::RedisModuleBlockedClient>,
    /// The timeout timer fired (main thread): it is gone, and must not be stopped.
    fired: AtomicBool,
}

/// A client blocked on a database job.
pub struct Blocked {
    bc: Handle,
    fallback: Option<Box<dyn Completion>>,
    /// When the client was blocked, for waits bounded by a timeout (a database resolution):
    /// the reply callback reports slow ones to the LATENCY monitor (`latency.rs`). Unbounded
    /// waits (REBUILD SYNC, a CREATE's build) are not resolutions and are not reported.
    since: Option<Instant>,
    /// The timeout's timer, stopped on the main thread once the client is answered
    /// (`free_cb`): left to fire, each one would cost the server a context later.
    timer: Option<TimerId>,
}

// SAFETY: the server allows RedisModule_UnblockClient from any thread; the handle is taken
// (and so used) once, atomically.
unsafe impl Send for Blocked {}

impl Blocked {
    /// Blocks the calling client for at most `timeout` (zero: until finished). `fallback` is what the client gets if
    /// this handle is dropped without `finish` (worker panic, queue full).
    ///
    /// The caller must have checked that blocking is allowed (not in MULTI, Lua or functions).
    pub fn block(ctx: &Context, timeout: Duration, fallback: Box<dyn Completion>) -> Blocked {
        // SAFETY: ctx is the live command context; the callbacks match the API's signatures.
        // No server timeout (0): a bounded wait is timed below.
        let bc = unsafe {
            raw::RedisModule_BlockClient.unwrap()(
                ctx.ctx,
                Some(reply_cb),
                Some(timeout_cb),
                Some(free_cb),
                0,
            )
        };
        if !bc.is_null() {
            WAITING.fetch_add(1, Ordering::Relaxed);
        }
        let bc: Handle = Arc::new(Shared {
            bc: AtomicPtr::new(bc),
            fired: AtomicBool::new(false),
        });
        let since = (!timeout.is_zero()).then(Instant::now);
        if since.is_some() {
            BOUND_MS.store(
                timeout.as_millis().min(u64::MAX as u128) as u64,
                Ordering::Relaxed,
            );
        }
        let timer =
            since.map(|since| timer::after(ctx, timeout, timed_out, (Arc::clone(&bc), since)));
        Blocked {
            bc,
            fallback: Some(fallback),
            since,
            timer,
        }
    }

    /// The same client, answered with `fallback` instead if the handle is dropped unfinished
    /// (a handle passed on to a job that needs a different fallback).
    pub fn with_fallback(mut self, fallback: Box<dyn Completion>) -> Blocked {
        self.fallback = Some(fallback);
        self
    }

    /// Unblocks the client with `done`; its `apply` and `reply` run on the main thread. If
    /// the client already got its timeout reply, `done` is still applied (its effects, such
    /// as cache fills, stay right), later on the main thread.
    pub fn finish(mut self, done: Box<dyn Completion>) {
        self.unblock(done);
    }

    fn unblock(&mut self, done: Box<dyn Completion>) {
        self.fallback = None;
        if let Err(done) = unblock(&self.bc, done, self.since, self.timer) {
            // The timer answered first.
            defer(done);
        }
    }
}

/// Unblocks the client behind `bc` with `done`, unless someone did already: then `done` is
/// handed back undelivered.
fn unblock(
    bc: &Handle,
    done: Box<dyn Completion>,
    since: Option<Instant>,
    timer: Option<TimerId>,
) -> Result<(), Box<dyn Completion>> {
    let raw = bc.bc.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if raw.is_null() {
        return Err(done);
    }
    WAITING.fetch_sub(1, Ordering::Relaxed);
    let timer = timer.map(|id| (id, Arc::clone(bc)));
    let slot = Box::into_raw(Box::new(Slot(Some(done), since, timer))).cast::<c_void>();
    // SAFETY: raw came from BlockClient and is unblocked exactly once (swapped out above).
    unsafe { raw::RedisModule_UnblockClient.unwrap()(raw, slot) };
    Ok(())
}

impl Drop for Blocked {
    fn drop(&mut self) {
        if let Some(fb) = self.fallback.take() {
            self.unblock(fb);
        }
    }
}

/// The module's timeout of a bounded wait: the database did not answer in time. The job
/// still runs to its end, and its completion is applied when it does (`Blocked::unblock`).
fn timed_out(_ctx: &Context, (bc, since): (Handle, Instant)) {
    bc.fired.store(true, Ordering::Relaxed);
    if unblock(&bc, Box::new(TimedOut), Some(since), None).is_ok() {
        metrics::global(|m| m.db_timeouts += 1);
    }
}

/// The reply of a client whose database job did not end within `member.db-timeout-ms`.
struct TimedOut;

impl Completion for TimedOut {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        Err(RedisError::Str(error::DB_TIMEOUT))
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
                mainq::with_db0(&ctx, |ctx| {
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
                crate::server::latency::resolved(since.elapsed());
            }
        }
        None => {
            reply::send_error(&ctx, error::WORKER_LOST);
        }
    }
    raw::REDISMODULE_OK as c_int
}

/// Timeout callback: only an operator's `CLIENT UNBLOCK <id> TIMEOUT` reaches it (the server
/// never times these clients out, see the module docs). The job still runs to its end and its
/// `apply` happens later through `free_cb`.
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
    // Reported as the slowest resolution, the bound of the waits (the handle's start time is
    // not reachable here).
    crate::server::latency::resolved(Duration::from_millis(BOUND_MS.load(Ordering::Relaxed)));
    raw::REDISMODULE_OK as c_int
}

/// Frees the private data. If the reply callback did not run (timeout, disconnect), the
/// completion's effects are still applied, on the main-thread queue with a proper context.
///
/// # Safety
/// Called by the server on the main thread with the pointer we passed to UnblockClient.
unsafe extern "C" fn free_cb(ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    if privdata.is_null() {
        return;
    }
    // SAFETY: privdata is the Box<Slot> leaked in `unblock`, freed only here.
    let slot = unsafe { Box::from_raw(privdata.cast::<Slot>()) };
    if let (Some((id, shared)), false) = (&slot.2, ctx.is_null()) {
        // Answered before its timeout: the timer has nothing left to do. It and this callback
        // both run on the main thread, so a timer that has not fired by now is still there
        // (its id names no other timer).
        if !shared.fired.load(Ordering::Relaxed) {
            let _ = timer::cancel::<(Handle, Instant)>(&Context::new(ctx), *id);
        }
    }
    if let Some(done) = slot.0 {
        defer(done);
    }
}
