//! Waiting for a set's running rebuild: MEMBER.REBUILD SYNC's client, a CREATE's or an
//! ALTER's, or another node's cluster-wide call; each hears the outcome exactly once, when the
//! rebuild ends (`rebuild::finish`) or at once when none runs.

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::model::set_upkeep::Reply;
use crate::server::block::{Blocked, Completion};
use crate::sets::state::{self, Rebuild, RebuildWaiter};

/// The reply of a rebuild's waiter: members loaded (or OK), or why the rebuild failed.
pub struct RebuildReply(pub Result<u64, String>, pub Reply);

impl Completion for RebuildReply {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match (&self.0, self.1) {
            (Ok(n), Reply::Rows) => Ok(RedisValue::Integer(*n as i64)),
            (Ok(_), Reply::Ok | Reply::OkOrRetry | Reply::Altered) => {
                Ok(RedisValue::SimpleStringStatic("OK"))
            }
            (Err(e), _) => Err(RedisError::String(e.clone())),
        }
    }
}

/// Makes `waiter` get the outcome of the running rebuild of `name`. With no rebuild running
/// (it ended in between, or there is no such set) the waiter hears so at once.
pub fn wait(name: &str, waiter: Blocked, kind: Reply) {
    if let Some(RebuildWaiter::Client(w)) = enlist(name, RebuildWaiter::Client(waiter), kind) {
        w.finish(Box::new(RebuildReply(
            Err(crate::model::error::WORKER_LOST.into()),
            kind,
        )));
    }
}

/// `wait` for a caller without a client (another node's cluster-wide REBUILD SYNC): `then`
/// gets the rows loaded or why not, on the main thread, exactly once.
pub fn wait_then(ctx: &Context, name: &str, then: state::RebuildThen) {
    wait_as(ctx, name, RebuildWaiter::Then(then), Reply::Rows);
}

pub(super) fn wait_as(ctx: &Context, name: &str, waiter: RebuildWaiter, kind: Reply) {
    if let Some(w) = enlist(name, waiter, kind) {
        tell(ctx, w, Err(crate::model::error::WORKER_LOST.into()), kind);
    }
}

/// Adds `waiter` to the running rebuild of `name`; hands it back when none runs.
fn enlist(name: &str, waiter: RebuildWaiter, kind: Reply) -> Option<RebuildWaiter> {
    state::with(|r| {
        if let Some(s) = r.sets.get_mut(name) {
            if let Rebuild::Running { waiters, .. } = &mut s.rebuild {
                waiters.push((waiter, kind));
                return None;
            }
        }
        Some(waiter)
    })
}

/// Gives a waiter its rebuild's outcome.
pub(super) fn tell(ctx: &Context, w: RebuildWaiter, rows: Result<u64, String>, kind: Reply) {
    match w {
        RebuildWaiter::Client(w) => w.finish(Box::new(RebuildReply(rows, kind))),
        RebuildWaiter::Then(f) => f(ctx, rows),
    }
}
