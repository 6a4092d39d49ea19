//! The one "ask the catalog, then run again" step: a command on a set this node does not know
//! (yet) blocks only its own client while the catalog is asked, then runs as if the call had
//! just arrived, with the set confirmed.

use std::time::Duration;

use redis_module::{Context, RedisError, RedisResult};

use crate::model::error;
use crate::server::block::{Blocked, Fail};
use crate::sets::catalog;

/// Asks the catalog about `set`, waiting at most `timeout` (zero: no limit), then runs
/// `again` on the main thread. `again` returns what the command makes of the call now that the
/// set is known (`Some`), which `go` carries on with the blocked client; `None` when the
/// catalog does not hold the set either (the client gets "no such set"), or the error the
/// client gets. A set the catalog does not hold is answered at once (`catalog::ask`).
pub fn after_catalog<T: 'static>(
    ctx: &Context,
    set: &str,
    timeout: Duration,
    again: impl FnOnce(&Context) -> Result<Option<T>, RedisError> + 'static,
    go: impl FnOnce(&Context, Blocked, T) + 'static,
) -> RedisResult {
    let then: catalog::Then = Box::new(move |ctx, blocked| match again(ctx) {
        Ok(Some(known)) => go(ctx, blocked, known),
        Ok(None) => blocked.finish(Box::new(Fail(error::UNKNOWN_SET.into()))),
        Err(e) => blocked.finish(Box::new(Fail(e.to_string()))),
    });
    catalog::ask(ctx, set, timeout, then)
}
