//! Requests another node forwarded here because this node holds the item's canonical slot (cluster
//! mode, docs/cluster-placement.md, "Canonical forwarding over the cluster bus"), inbound: the
//! holder runs the ordinary lookup or write for them and answers through the bus (`serve`), and
//! its part of a MEXISTS or MADD another node split (`serve_many`, docs/cluster-commands.md).
//! The sending sides are `forward.rs` and `batch/wide.rs`.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis_module::{Context, RedisError, RedisValue};

use crate::server::block::Completion;

use crate::cluster::bus;
use crate::cluster::owner;
use crate::cluster::responder::Responder;
use crate::cluster::wire::{Many, Op, Request};
use crate::command::batch::outlet::Outlet;
use crate::command::batch::parts::{decide_lookups, send_lookups, send_writes, writes};
use crate::command::lookup::{self, Step};
use crate::command::write::{self, Op as WriteOp};
use crate::command::{point_for, point_remote, PointDone};
use crate::db::pool::{self, Job, Point};
use crate::model::canon::{hash_parts, Canon};
use crate::model::error;
use crate::model::slot::keyslot;
use crate::server::replication;
use crate::sets::{catalog_ask, effects, state};

/// Runs a request forwarded by another node (or by this one for its own client, `bus::forward`):
/// the same lookup or write a local client gets, answered through `to`. A write only if this
/// node holds the canonical slot (else a `TRYAGAIN`); a lookup always, as for `serve_many`: the
/// funnel believes a filter negative only for a slot held long enough, and the database
/// answers the rest on any node.
pub fn serve(ctx: &Context, req: Request, to: Responder) {
    let write = !matches!(req.op, Op::Exists | Op::Explain);
    if write && (!owner::is_primary() || !owner::holds(keyslot(req.entity.as_bytes()))) {
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
                    pool::submit(Job::Lookup(point(*done, to)));
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
                Ok(Some(done)) => {
                    bus::SERVED.fetch_add(1, Ordering::Relaxed);
                    write::start(ctx, done, |done| point(done, to), req.expires_at);
                }
                Ok(None) => unknown(ctx, &req.set, to),
                Err(e) => to.answer(ctx, Err(e)),
            }
        }
        Op::TwinAdd | Op::TwinDel => {
            if !state::with(|r| r.serving(&req.set, false).is_some()) {
                return unknown(ctx, &req.set, to);
            }
            bus::SERVED.fetch_add(1, Ordering::Relaxed);
            let (command, args) = (
                if req.op == Op::TwinAdd {
                    "MEMBER._ADD"
                } else {
                    "MEMBER._DEL"
                },
                [
                    req.set.as_bytes(),
                    req.entity.as_bytes(),
                    req.scope.as_bytes(),
                ],
            );
            if req.op == Op::TwinAdd {
                effects::added(ctx, &req.set, &canon);
                // Held RECENT-TTL from now, as the writer's own mark is from its end.
                state::with(|r| {
                    if let Some(s) = r.sets.get_mut(&req.set) {
                        let ttl = Duration::from_secs(s.def.recent_ttl);
                        s.hold_recent(canon.hash, ttl);
                    }
                });
            } else {
                effects::removed(ctx, &req.set, &canon);
            }
            replication::replicate(ctx, command, &args);
            to.answer(ctx, Ok(RedisValue::Integer(1)));
        }
        Op::TwinBeginAdd | Op::TwinBeginDel => {
            // The longest hold any configuration asks for (`write::twin_hold`: 50 minutes
            // of timeouts and a day of RECENT-TTL) is well within a week; the bound keeps a
            // wrong value from overflowing (the wire's decoder refuses one not finite).
            let secs = req.expires_at.unwrap_or(0.0).clamp(0.0, 7.0 * 86_400.0);
            let time = Duration::from_secs_f64(secs);
            let held = state::with(|r| {
                // Marked even while a promotion holds the set back: the mark only sends
                // lookups to the database.
                let s = r.sets.get_mut(&req.set)?;
                if req.op == Op::TwinBeginAdd {
                    s.hold_recent(canon.hash, time);
                } else {
                    s.hold_delete(canon.hash, time);
                }
                Some(())
            });
            if held.is_none() {
                return unknown(ctx, &req.set, to);
            }
            bus::SERVED.fetch_add(1, Ordering::Relaxed);
            to.answer(ctx, Ok(RedisValue::Integer(1)));
        }
    }
}

/// Runs one part of a MEXISTS or MADD that another node split by slot owner: the same batch a
/// local client gets, answered through `to` with one integer per item, or one error for the
/// part. Lookups are decided whatever the slot's state (the funnel believes a negative only for
/// a slot held long enough, and the database answers any item); writes need every slot held,
/// else the part is refused whole (`TRYAGAIN`) and nothing is written.
pub fn serve_many(ctx: &Context, req: Many, to: Responder) {
    let write = req.op == Op::Add;
    let held = |e: &String| owner::holds(keyslot(e.as_bytes()));
    if write && (!owner::is_primary() || !req.items.iter().all(|(e, _)| held(e))) {
        bus::REFUSED.fetch_add(1, Ordering::Relaxed);
        return to.answer(ctx, Err(RedisError::Str(error::SLOT_MOVING)));
    }
    let canons: Vec<Canon> = req
        .items
        .iter()
        .map(|(e, s)| Canon {
            entity: Cow::Borrowed(e),
            scope: s,
            hash: hash_parts(e, s),
        })
        .collect();
    let planned = state::with(|r| {
        let epoch = r.epoch;
        let set = r.serving(&req.set, false)?;
        Some(if write {
            Err(writes(set, canons, req.expires_at))
        } else {
            Ok(decide_lookups(ctx, set, epoch, canons))
        })
    });
    let Some(planned) = planned else {
        return unknown(ctx, &req.set, to);
    };
    bus::SERVED.fetch_add(1, Ordering::Relaxed);
    let planned = match planned {
        Ok(done) => Ok(done),
        Err(Ok(done)) => Err(done),
        Err(Err(e)) => return to.answer(ctx, Err(e)),
    };
    match planned {
        Ok(mut done) if done.pending.is_empty() => to.answer(ctx, done.reply(ctx)),
        Ok(done) => send_lookups(
            Outlet::part(Box::new(move |ctx, r| to.answer(ctx, r))),
            done,
        ),
        Err(done) => send_writes(
            ctx,
            Outlet::part(Box::new(move |ctx, r| to.answer(ctx, r))),
            done,
        ),
    }
}

/// The point query whose answer completes `done` and goes to `to`: another node's request, or
/// one of this node's own clients, unblocked directly (see `bus::forward`).
fn point<T: 'static, D: PointDone<T>>(done: D, to: Responder) -> Point<T> {
    match to.into_local() {
        Ok(blocked) => point_for(blocked, done),
        Err(to) => point_remote(done, to),
    }
}

/// A forwarded request names a set this node does not serve yet: it learns it in the
/// background and the asking client is told to retry (or that no such set exists).
fn unknown(ctx: &Context, set: &str, to: Responder) {
    bus::REFUSED.fetch_add(1, Ordering::Relaxed);
    let err = catalog_ask::learn_in_background(set)
        .err()
        .unwrap_or(RedisError::Str(error::SET_BEING_LEARNED));
    to.answer(ctx, Err(err));
}
