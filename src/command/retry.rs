//! The one "ask the catalog, then run again" step: a command on a set this node does not know
//! (yet) blocks only its own client while the catalog is asked, then runs as if the call had
//! just arrived, with the set confirmed. And its twin across the cluster: a node asked about a
//! set it is still learning is asked again (`ask_while_learning`).

use std::rc::Rc;
use std::time::{Duration, Instant};

use redis_module::{Context, RedisError, RedisResult};

use crate::cluster::bus;
use crate::cluster::wire::Answer;
use crate::model::error;
use crate::server::block::{Blocked, Fail};
use crate::sets::catalog_ask;

/// Asks the catalog about `set`, waiting at most `timeout` (zero: no limit), then runs
/// `again` on the main thread. `again` returns what the command makes of the call now that the
/// set is known (`Some`), which `go` carries on with the blocked client; `None` when the
/// catalog does not hold the set either (the client gets "no such set"), or the error the
/// client gets. A set the catalog does not hold is answered at once (`catalog_ask::ask`).
pub fn after_catalog<T: 'static>(
    ctx: &Context,
    set: &str,
    timeout: Duration,
    again: impl FnOnce(&Context) -> Result<Option<T>, RedisError> + 'static,
    go: impl FnOnce(&Context, Blocked, T) + 'static,
) -> RedisResult {
    let then: catalog_ask::Then = Box::new(move |ctx, blocked| match again(ctx) {
        Ok(Some(known)) => go(ctx, blocked, known),
        Ok(None) => blocked.finish(Box::new(Fail(error::UNKNOWN_SET.into()))),
        Err(e) => blocked.finish(Box::new(Fail(e.to_string()))),
    });
    catalog_ask::ask(ctx, set, timeout, then)
}

/// Sends one request to another node within the given time, its answer to the given `Then`
/// (`bus::ask_many`, `bus::ask_info` with their request).
pub type Asker = Rc<dyn Fn(&Context, Duration, bus::Then)>;

/// How long before a node still learning a set is asked again.
const LEARNING_RETRY: Duration = Duration::from_millis(20);

/// Sends a request to another node with `send` (given the time left until `deadline`) and
/// hands its answer, or why none came, to `then`. A node that answers it is still learning the
/// set from the catalog (its own query takes one database round trip) is asked again every
/// 20 ms until `deadline`, so the first cluster-wide call after a CREATE does not fail. Main
/// thread.
pub fn ask_while_learning(ctx: &Context, deadline: Instant, send: Asker, then: bus::Then) {
    let timeout = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let again = Rc::clone(&send);
    send(
        ctx,
        timeout,
        Box::new(move |ctx, res| match res {
            Ok(Answer::Error(e))
                if e == error::SET_BEING_LEARNED && Instant::now() + LEARNING_RETRY < deadline =>
            {
                ctx.create_timer(
                    LEARNING_RETRY,
                    move |ctx, (send, then)| ask_while_learning(ctx, deadline, send, then),
                    (again, then),
                );
            }
            res => then(ctx, res),
        }),
    );
}
