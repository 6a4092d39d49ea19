//! Items whose canonical form hashes to a slot another node holds (cluster mode, step 5 of
//! docs/cluster-placement.md): the receiving node forwards them there (`elsewhere`, `start`);
//! the holder runs the ordinary lookup or write for them and answers (`serve`).

use std::borrow::Cow;
use std::time::Duration;

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use super::lookup::{self, Step};
use super::write::{self, Op as WriteOp};
use super::{block_timeout, may_block, point_remote};
use crate::block::Blocked;
use crate::canon::{hash_parts, Canon};
use crate::catalog::{self, Fail};
use crate::cluster::bus::{self, Responder};
use crate::cluster::slot::keyslot;
use crate::cluster::wire::{Op, Request};
use crate::cluster::{self, owner};
use crate::db::pool::{self, Job};
use crate::error;
use std::sync::atomic::Ordering;

/// A request for the node that holds the item's canonical slot.
pub(super) struct Elsewhere {
    slot: u16,
    req: Request,
}

/// `Some` when `canon`, sent by the client as `raw`, belongs to a slot of another node: in
/// cluster mode, the two forms hash to different slots and this node does not own the
/// canonical one. Sets with `NORMALIZE none` never get here (the forms are equal).
pub(super) fn elsewhere(
    raw: &[u8],
    canon: &Canon,
    set: &str,
    op: Op,
    expires_at: Option<f64>,
) -> Option<Elsewhere> {
    if !cluster::enabled() || raw == canon.entity.as_bytes() {
        return None;
    }
    let slot = keyslot(canon.entity.as_bytes());
    if slot == keyslot(raw) || owner::owns(slot) {
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
pub(super) fn block_and_start(ctx: &Context, e: Elsewhere) -> RedisResult {
    may_block(ctx)?;
    // The bus times the request out itself (with its own error); the server's timeout, a
    // second later, is only a backstop.
    let fallback = Box::new(Fail(error::WORKER_LOST.into()));
    let timeout = block_timeout() + Duration::from_secs(1);
    start(ctx, Blocked::block(ctx, timeout, fallback), e);
    Ok(RedisValue::NoReply)
}

/// Forwards `e` for a client already blocked (waiting for the catalog, say).
pub(super) fn start(ctx: &Context, blocked: Blocked, e: Elsewhere) {
    match owner::node_of(e.slot) {
        Some(node) => bus::forward(ctx, &node, blocked, e.req, block_timeout()),
        None => blocked.finish(Box::new(Fail(error::NO_OWNER.into()))),
    }
}

/// Runs a request forwarded by another node, if this node holds the canonical slot (else a
/// `TRYAGAIN`): the same lookup or write a local client gets, answered through `to`.
pub fn serve(ctx: &Context, req: Request, to: Responder) {
    if !owner::is_primary() || !owner::holds(ctx, keyslot(req.entity.as_bytes())) {
        bus::REFUSED.fetch_add(1, Ordering::Relaxed);
        return to.answer(ctx, Err(RedisError::Str(error::SLOT_MOVING)));
    }
    let canon = Canon {
        entity: Cow::Borrowed(&req.entity),
        scope: &req.scope,
        hash: hash_parts(&req.entity, &req.scope),
    };
    match req.op {
        Op::Exists | Op::Explain => {
            let explain = req.op == Op::Explain;
            match lookup::decide_canonical(ctx, &req.set, canon, explain) {
                Step::Done(present, path) => {
                    bus::SERVED.fetch_add(1, Ordering::Relaxed);
                    to.answer(ctx, Ok(lookup::reply(explain, present, path)));
                }
                Step::Db(done) => {
                    bus::SERVED.fetch_add(1, Ordering::Relaxed);
                    pool::submit(Job::Lookup(point_remote(*done, to)));
                }
                Step::Unknown => unknown(ctx, &req.set, to),
                Step::Forward(_) => to.answer(ctx, Err(RedisError::Str(error::INTERNAL))),
            }
        }
        Op::Add | Op::Del => {
            let op = if req.op == Op::Add {
                WriteOp::Add
            } else {
                WriteOp::Del
            };
            match write::prepare_canonical(&req.set, canon, op) {
                Some(done) => {
                    bus::SERVED.fetch_add(1, Ordering::Relaxed);
                    let point = point_remote(write::begin(done), to);
                    write::send(point, op, req.expires_at);
                }
                None => unknown(ctx, &req.set, to),
            }
        }
    }
}

/// A forwarded request names a set this node does not serve yet: it learns it in the
/// background and the asking client is told to retry (or that no such set exists).
fn unknown(ctx: &Context, set: &str, to: Responder) {
    bus::REFUSED.fetch_add(1, Ordering::Relaxed);
    let err = catalog::learn_in_background(set)
        .err()
        .unwrap_or(RedisError::Str(error::SET_BEING_LEARNED));
    to.answer(ctx, Err(err));
}
