//! Items whose canonical form hashes to a slot another node holds (cluster mode, "Canonical
//! forwarding over the cluster bus" in docs/cluster-placement.md), outbound: the receiving node
//! forwards them there (`elsewhere`, `start`) and its client gets the holder's answer. The holder's
//! side is `forwarded.rs`.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::cluster::bus;
use crate::cluster::owner;
use crate::cluster::wire::{Answer, Op, Request};
use crate::command::{block_timeout, may_block};
use crate::model::canon::Canon;
use crate::model::error;
use crate::model::slot::keyslot;
use crate::server::block::{Blocked, Fail};

/// A request for the node that holds the item's canonical slot.
pub(in crate::command) struct Elsewhere {
    slot: u16,
    req: Request,
}

/// `Some` when `canon`, sent by the client as `raw`, belongs to another slot than the one the
/// command was routed by: in cluster mode, the two forms hash to different slots. The holder
/// of the canonical slot answers: another node over the bus, or this one from a timer just
/// after the command (`bus::forward`). Sets with `NORMALIZE none` never get here (the forms
/// are equal).
pub(in crate::command) fn elsewhere(
    raw: &[u8],
    canon: &Canon,
    set: &str,
    op: Op,
    expires_at: Option<f64>,
) -> Option<Elsewhere> {
    if !crate::server::cluster_mode::enabled() || raw == canon.entity.as_bytes() {
        return None;
    }
    let slot = keyslot(canon.entity.as_bytes());
    if slot == keyslot(raw) {
        return None;
    }
    Some(Elsewhere {
        slot,
        req: Request {
            id: 0,
            op,
            set: set.to_string(),
            entity: canon.entity.to_string(),
            scope: canon.scope.to_string(),
            expires_at,
        },
    })
}

/// Blocks the calling client and forwards `e`; the client gets the holder's answer.
pub(in crate::command) fn block_and_start(ctx: &Context, e: Elsewhere) -> RedisResult {
    may_block(ctx)?;
    // The bus times the request out itself (with its own error); the server's timeout, a
    // second later, is only a backstop.
    let fallback = Box::new(Fail(error::WORKER_LOST.into()));
    let timeout = block_timeout() + Duration::from_secs(1);
    start(ctx, Blocked::block(ctx, timeout, fallback), e);
    Ok(RedisValue::NoReply)
}

/// Delivers `reply` once the owner of each slot has run its request, a rotating set's twin
/// effect (`AskFirst`); `TWIN_UNCONFIRMED` instead if any refuses, cannot be sent its request
/// or does not answer within `member.db-timeout-ms`, or no node serves its slot. The writes
/// were made either way (their twins reach those owners through the change log), but none is
/// acknowledged.
pub(in crate::command) fn answer_after(
    ctx: &Context,
    asks: Vec<(u16, Request)>,
    reply: RedisResult,
    deliver: crate::command::Deliver,
) {
    let then = Box::new(move |ctx: &Context, confirmed: bool| match confirmed {
        true => deliver(ctx, reply),
        false => deliver(ctx, Err(RedisError::Str(error::TWIN_UNCONFIRMED))),
    });
    when_answered(ctx, asks, block_timeout(), then);
}

/// What `when_answered` calls: with whether every owner ran its request.
pub(in crate::command) type Answered = Box<dyn FnOnce(&Context, bool)>;

/// Calls `then` once, on the main thread: with `true` once the owner of each slot has run its
/// request, with `false` as soon as one refuses, cannot be sent its request or does not answer
/// within `timeout`, or no node serves its slot.
pub(in crate::command) fn when_answered(
    ctx: &Context,
    asks: Vec<(u16, Request)>,
    timeout: Duration,
    then: Answered,
) {
    if asks.is_empty() {
        return then(ctx, true);
    }
    let left = Rc::new(RefCell::new(Some((asks.len(), then))));
    for (slot, req) in asks {
        let left = Rc::clone(&left);
        let answered = move |ctx: &Context, confirmed: bool| {
            let mut cell = left.borrow_mut();
            let Some((n, _)) = cell.as_mut() else {
                return;
            };
            *n -= 1;
            if *n == 0 || !confirmed {
                if let Some((_, then)) = cell.take() {
                    drop(cell);
                    then(ctx, confirmed);
                }
            }
        };
        match owner::node_of(slot) {
            Some(node) => {
                let then = Box::new(move |ctx: &Context, res: Result<Answer, bus::Lost>| {
                    answered(ctx, matches!(res, Ok(Answer::Int(_))))
                });
                bus::ask(ctx, &node, req, timeout, then);
            }
            None => answered(ctx, false),
        }
    }
}

/// A write's statement, run on a worker once its twins' owners have marked it begun
/// (`Some(db)`), or told it may not run (`None`): an owner did not mark it within half of
/// `member.db-timeout-ms` (the client's other half is the statement's), or no worker took it
/// within `member.db-timeout-ms` of the ask (the owners' marks are timed from then).
pub(in crate::command) type Statement = Box<dyn FnOnce(Option<&mut crate::db::Db>) + Send>;

/// Asks each owner in `asks` to mark its twin's write begun, then runs `statement` as
/// [`Statement`] says (docs/security.md, "A gap the cluster history checker found").
pub(in crate::command) fn once_begun(
    ctx: &Context,
    asks: Vec<(u16, Request)>,
    statement: Statement,
) {
    let start_by = std::time::Instant::now() + block_timeout();
    let then = Box::new(move |_: &Context, marked: bool| {
        if !marked {
            return statement(None);
        }
        crate::db::pool::run(move |db| match std::time::Instant::now() > start_by {
            true => statement(None),
            false => statement(Some(db)),
        });
    });
    when_answered(ctx, asks, block_timeout() / 2, then);
}

/// Forwards `e` for a client already blocked (waiting for the catalog, say). A slot this node
/// answers for itself (a primary's own, a replica's primary's) is served here, just after the
/// command.
pub(in crate::command) fn start(ctx: &Context, blocked: Blocked, e: Elsewhere) {
    if owner::owns(e.slot) {
        return bus::serve_here(ctx, blocked, e.req);
    }
    match owner::node_of(e.slot) {
        Some(node) => bus::forward(ctx, &node, blocked, e.req, block_timeout()),
        None => blocked.finish(Box::new(Fail(error::NO_OWNER.into()))),
    }
}
