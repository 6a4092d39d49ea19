//! Requests another node forwarded here because this node holds the item's canonical slot (cluster
//! mode, docs/cluster-placement.md, "Canonical forwarding over the cluster bus"), inbound: the
//! holder runs the ordinary lookup or write for them and answers through the bus (`serve`). The
//! sending side is `forward.rs`.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use redis_module::{Context, RedisError};

use super::lookup::{self, Step};
use super::point_remote;
use super::write::{self, Op as WriteOp};
use crate::cluster::bus::{self, Responder};
use crate::cluster::owner;
use crate::cluster::wire::{Op, Request};
use crate::db::pool::{self, Job};
use crate::model::canon::{hash_parts, Canon};
use crate::model::error;
use crate::model::slot::keyslot;
use crate::sets::catalog;

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
