//! The main-thread queue: work that must touch keys but has no client to reply to (completions
//! of timed-out clients, finished rebuilds, the catalog load) runs here from a 10 ms timer,
//! followed by the upkeep that module load hands to [`start`]. Every main-thread entry runs
//! with DB 0 selected ([`with_db0`]). The threads that rebuild or fill filters run at a lower
//! priority than the server ([`yield_to_the_server`]).

use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use redis_module::{raw, Context};
use std::sync::OnceLock;

/// A piece of work for the main thread.
pub type Task = Box<dyn FnOnce(&Context) + Send>;

const TICK: Duration = Duration::from_millis(10);

static QUEUE: OnceLock<(Sender<Task>, Receiver<Task>)> = OnceLock::new();

fn queue() -> &'static (Sender<Task>, Receiver<Task>) {
    QUEUE.get_or_init(unbounded)
}

/// Queues `task` to run on the main thread within about one tick. Callable from any thread.
pub fn post(task: Task) {
    let _ = queue().0.send(task);
}

/// The upkeep that runs after the queued tasks on every tick, set by `start`.
static UPKEEP: OnceLock<fn(&Context)> = OnceLock::new();

/// Runs `f` with DB 0 selected, restoring the caller's DB afterwards: libmember's keys live in
/// DB 0 whatever database the client has selected.
pub fn with_db0<R>(ctx: &Context, f: impl FnOnce(&Context) -> R) -> R {
    /// Puts the client's own DB back however `f` ends (a panic contained further up must
    /// not leave the client in DB 0).
    struct Restore<'a>(&'a Context, i32);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            if self.1 != 0 {
                // SAFETY: the same live context, on the main thread.
                unsafe { raw::RedisModule_SelectDb.unwrap()(self.0.ctx, self.1) };
            }
        }
    }
    // SAFETY: ctx is a live context with a client (command, reply callback or timer).
    let current = unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx.ctx) };
    if current != 0 {
        unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.ctx, 0) };
    }
    let _restore = Restore(ctx, current);
    f(ctx)
}

/// Starts the recurring timer, which runs the queued tasks and then `upkeep` on every tick.
/// Call once from module load.
pub fn start(ctx: &Context, upkeep: fn(&Context)) {
    let _ = UPKEEP.set(upkeep);
    ctx.create_timer(TICK, tick, ());
}

fn tick(ctx: &Context, _: ()) {
    with_db0(ctx, |ctx| {
        // Bound the work per tick so the main thread never stalls on a burst.
        for task in queue().1.try_iter().take(10_000) {
            // A panicking task must not unwind into the server (that aborts it); it is lost,
            // and whatever it owned (a blocked client's completion) answers by being dropped.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task(ctx))).is_err() {
                crate::server::reply::log(
                    ctx,
                    crate::server::reply::Level::Warning,
                    "libmember: internal error in a main-thread task (contained)",
                );
            }
        }

        // Upkeep is contained the same way: a panic there must not take the server down,
        // and the timer is re-armed whatever happens.
        let upkeep = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Some(upkeep) = UPKEEP.get() {
                upkeep(ctx);
            }
        }));
        if upkeep.is_err() {
            crate::server::reply::log(
                ctx,
                crate::server::reply::Level::Warning,
                "libmember: internal error in housekeeping (contained)",
            );
        }
    });
    ctx.create_timer(TICK, tick, ());
}

/// What runs just before the server sleeps, set by `batch_per_iteration`.
static BEFORE_SLEEP: OnceLock<fn()> = OnceLock::new();

/// Runs the flush that `batch_per_iteration` was handed just before the server sleeps, so one
/// iteration's database work reaches the workers in one envelope and one wake-up.
///
/// # Safety
/// Called by the server on the main thread for the event-loop event we subscribed to.
unsafe extern "C" fn before_sleep(
    _ctx: *mut redis_module::raw::RedisModuleCtx,
    _eid: redis_module::raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut std::os::raw::c_void,
) {
    if subevent == redis_module::raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP {
        if let Some(flush) = BEFORE_SLEEP.get() {
            flush();
        }
    }
}

/// Makes `flush` run just before the server sleeps, at the end of every event-loop iteration
/// (`pool::flush`, which sends the iteration's database jobs). True when subscribed: then
/// `pool::submit` may batch per iteration; otherwise it must keep sending each job at once.
pub fn batch_per_iteration(ctx: &Context, flush: fn()) -> bool {
    let _ = BEFORE_SLEEP.set(flush);
    let event = redis_module::raw::RedisModuleEvent {
        id: redis_module::raw::REDISMODULE_EVENT_EVENTLOOP,
        dataver: 1,
    };
    // SAFETY: module load, with the module's context and a callback of the right type.
    let rc = unsafe {
        redis_module::raw::RedisModule_SubscribeToServerEvent.unwrap()(
            ctx.ctx,
            event,
            Some(before_sleep),
        )
    };
    rc == redis_module::raw::REDISMODULE_OK as i32
}

/// The nice value of the threads that rebuild or fill filters and report here: measured with
/// `make bench ARGS="--only rebuild"`, PINGs of another client slower than 2 ms during a 1 M
/// rebuild went from 10–13 per rebuild to 1–8 (the worst one, 4–5 ms, is the machine's own:
/// an idle server shows it too).
const NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority to [`NICE`] (Linux keeps one per thread,
/// and the threads it starts inherit it): where the server and a rebuild share a few CPUs, the
/// server's clients should wait for a rebuild less than the rebuild waits for them. Best
/// effort.
pub fn yield_to_the_server() {
    // Elsewhere the same call would renice the whole server, for good.
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on the calling thread (who = 0) with a constant value.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, NICE);
    }
}
