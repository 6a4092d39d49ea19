//! Main-thread timers that can be called off. The server keeps every module timer until it
//! fires, and one that fires still costs a context with a temporary client; worse, while one is
//! due within the next millisecond the server's timer event is not brought forward for a new
//! one, so a timer meant to fire at once (a deferred call) waits up to a millisecond behind it.
//! Timeouts that are no longer needed (a blocked client answered, a forwarded request
//! answered) are therefore stopped, not left to fire. `redis_module`'s `stop_timer` cannot
//! free the data its own `create_timer` stored, so both sides are here.

use std::os::raw::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis_module::{raw, Context};

/// A timer's identity, as the server gives it.
pub type TimerId = raw::RedisModuleTimerID;

/// Timers made by [`after`] that have neither fired nor been stopped (INFO `timers_waiting`):
/// about the requests in flight, never a backlog of finished ones.
static WAITING: AtomicU64 = AtomicU64::new(0);

/// How many timers made here wait to fire now.
pub fn waiting() -> u64 {
    WAITING.load(Ordering::Relaxed)
}

/// What a timer carries: its callback and data.
struct Entry<T> {
    callback: fn(&Context, T),
    data: T,
}

/// Runs `callback(ctx, data)` on the main thread after `period`. Main thread only.
pub fn after<T: 'static>(
    ctx: &Context,
    period: Duration,
    callback: fn(&Context, T),
    data: T,
) -> TimerId {
    let entry = Box::into_raw(Box::new(Entry { callback, data })).cast::<c_void>();
    let ms = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
    WAITING.fetch_add(1, Ordering::Relaxed);
    // SAFETY: main thread, live context; `fire::<T>` takes back exactly this box.
    unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, ms, Some(fire::<T>), entry) }
}

/// Calls off a timer made by [`after`] with the same `T`, and returns its data; `None` when it
/// already fired (or was stopped). Main thread only, with a context of this module.
pub fn cancel<T: 'static>(ctx: &Context, id: TimerId) -> Option<T> {
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: main thread; the server hands back the pointer stored at creation, which only
    // `after::<T>` made (callers pass the `T` they created the timer with).
    let ok = unsafe { raw::RedisModule_StopTimer.unwrap()(ctx.ctx, id, &mut data) }
        == raw::REDISMODULE_OK as i32;
    if !ok || data.is_null() {
        return None;
    }
    // SAFETY: see above; the server no longer holds the pointer.
    let entry = unsafe { Box::from_raw(data.cast::<Entry<T>>()) };
    WAITING.fetch_sub(1, Ordering::Relaxed);
    Some(entry.data)
}

/// # Safety
/// Called by the server on the main thread with the pointer stored by `after::<T>`.
unsafe extern "C" fn fire<T: 'static>(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    // SAFETY: the box made in `after::<T>`, handed back once.
    let entry = unsafe { Box::from_raw(data.cast::<Entry<T>>()) };
    WAITING.fetch_sub(1, Ordering::Relaxed);
    let ctx = Context::new(ctx);
    // A panic must not unwind into the server.
    let _ = catch_unwind(AssertUnwindSafe(|| (entry.callback)(&ctx, entry.data)));
}
