//! The main-thread queue: work that must touch keys but has no client to reply to (completions
//! of timed-out clients, finished rebuilds, the catalog load) runs here from a 10 ms timer.

use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use redis_module::Context;
use std::sync::OnceLock;

use crate::block::Completion;
use crate::keys;

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

/// Applies a completion whose client is gone.
pub fn defer(mut done: Box<dyn Completion>) {
    post(Box::new(move |ctx| done.apply(ctx)));
}

/// Starts the recurring timer. Call once from module load.
pub fn start(ctx: &Context) {
    ctx.create_timer(TICK, tick, ());
}

fn tick(ctx: &Context, _: ()) {
    keys::with_db0(ctx, |ctx| {
        // Bound the work per tick so the main thread never stalls on a burst.
        for task in queue().1.try_iter().take(10_000) {
            task(ctx);
        }

        crate::effects::flush_replication(ctx);
        crate::state::housekeeping(ctx);
    });
    ctx.create_timer(TICK, tick, ());
}
