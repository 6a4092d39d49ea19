//! MEMBER.MEXISTS and MEMBER.MADD over a cluster, outbound (docs/cluster-commands.md): the
//! receiving node splits a call's items by the primary serving each canonical slot, decides its
//! own through the funnel (`batch/mod.rs`), asks every other owner for its part with one cluster-bus
//! message, and answers its client once, with the whole array in the order given or one error,
//! never a partial array. Runs outside the command (`batch::defer`). The owner's side is
//! `forwarded::serve_many`.

use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::cluster::bus::{self, Lost};
use crate::cluster::owner;
use crate::cluster::peers;
use crate::cluster::wire::{Answer, Many, Op};
use crate::command::batch::outlet::Outlet;
use crate::command::batch::parts::{
    decide_lookups, send_lookups, send_writes, writes, Kind, ManyLookups, ManyWrites,
};
use crate::command::block_timeout;
use crate::command::retry::ask_while_learning;
use crate::model::canon::Canon;
use crate::model::error;
use crate::model::slot::keyslot;
use crate::server::block::{Blocked, Completion, Fail};
use crate::sets::state;

/// A call split among owners: this node's part (positions in the call, and the part) and one
/// request per other owner (its node id, the positions it answers for, the request).
pub(in crate::command) struct Wide {
    len: usize,
    /// No part is acknowledged after this: `member.db-timeout-ms` from the split, when this
    /// node checked that it holds its own items' slots (the bound the handover grace counts
    /// on, docs/cluster-placement.md).
    deadline: Instant,
    local: Option<(Vec<usize>, Local)>,
    remote: Vec<(String, Vec<usize>, Many)>,
}

/// This node's part of a split call.
enum Local {
    Lookups(ManyLookups),
    Writes(ManyWrites),
}

/// Splits `canons` by the owner of each canonical slot (as last polled): this node's part
/// (maybe all of them) and one request per other owner. A write refuses at once (nothing marked, nothing sent) if
/// one of its own slots is moving or a slot has no owner; a lookup of an item whose slot has
/// no known owner is decided here (the database answers it on any node).
pub(in crate::command) fn split(
    ctx: &Context,
    set: &mut state::SetState,
    epoch: u64,
    canons: Vec<Canon>,
    kind: Kind,
) -> Result<Wide, RedisError> {
    let write = matches!(kind, Kind::Writes(_));
    let deadline = Instant::now() + block_timeout();
    let ids = owner::primaries();
    let me = peers::my_id();
    let mut local = Vec::new();
    // Positions of the items of each other primary, by its place in `ids`.
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); ids.len()];
    for (i, c) in canons.iter().enumerate() {
        let slot = keyslot(c.entity.as_bytes());
        let node = if owner::owns(slot) {
            None
        } else {
            owner::primary_index(slot).filter(|&n| ids[n] != me)
        };
        match node {
            Some(n) => groups[n].push(i),
            None if !write => local.push(i),
            None if !owner::owns(slot) => return Err(RedisError::Str(error::MANY_NO_OWNER)),
            None if !owner::holds(slot) => return Err(RedisError::Str(error::MANY_MOVING)),
            None => local.push(i),
        }
    }
    let groups: Vec<(String, Vec<usize>)> = ids
        .into_iter()
        .zip(groups)
        .filter(|(_, at)| !at.is_empty())
        .collect();
    let len = canons.len();
    let mut canons: Vec<Option<Canon>> = canons.into_iter().map(Some).collect();
    let mut take = |at: &[usize]| -> Vec<Canon> {
        at.iter()
            .map(|&i| canons[i].take().expect("each position once"))
            .collect()
    };
    let (op, expires_at) = match kind {
        Kind::Lookups => (Op::Exists, None),
        Kind::Writes(at) => (Op::Add, at),
    };
    let remote = groups
        .into_iter()
        .map(|(node, at)| {
            let items = take(&at)
                .into_iter()
                .map(|c| (c.entity.into_owned(), c.scope.to_string()))
                .collect();
            let req = Many {
                id: 0,
                op,
                set: set.def.name.clone(),
                expires_at,
                items,
            };
            (node, at, req)
        })
        .collect();
    let local = match local.is_empty() {
        true => None,
        false => {
            let mine = take(&local);
            let part = match kind {
                Kind::Lookups => Local::Lookups(decide_lookups(ctx, set, epoch, mine)),
                Kind::Writes(at) => Local::Writes(writes(set, mine, at)?),
            };
            Some((local, part))
        }
    };
    Ok(Wide {
        len,
        deadline,
        local,
        remote,
    })
}

/// Blocks the calling client for a split call. Each owner's answer is bounded by
/// `member.db-timeout-ms` (its own error); the server's timeout, a second later, is a
/// backstop.
pub(in crate::command) fn block(ctx: &Context) -> Blocked {
    let fallback = Box::new(Fail(error::WORKER_LOST.into()));
    Blocked::block(ctx, block_timeout() + Duration::from_secs(1), fallback)
}

impl Wide {
    /// Sends every other owner its part and starts this node's; `blocked` gets the joined
    /// answer. Main thread.
    pub(in crate::command) fn start(self, ctx: &Context, blocked: Blocked) {
        let parts = self.remote.len() + usize::from(self.local.is_some());
        let deadline = self.deadline;
        let join = Join::new(self.len, parts, blocked, deadline);
        for (node, at, req) in self.remote {
            ask(ctx, node, at, req, join.clone(), deadline);
        }
        let Some((at, local)) = self.local else {
            return;
        };
        let then = move |_: &Context, r: RedisResult| join.part(&at, ints(r));
        match local {
            Local::Lookups(mut done) if done.pending.is_empty() => then(ctx, done.reply(ctx)),
            Local::Lookups(done) => send_lookups(Outlet::part(Box::new(then)), done),
            Local::Writes(done) => send_writes(ctx, Outlet::part(Box::new(then)), done),
        }
    }
}

/// Asks `node` for the items at `at`; the answer goes into `join`.
fn ask(ctx: &Context, node: String, at: Vec<usize>, req: Many, join: Join, deadline: Instant) {
    let to = node.clone();
    let then: bus::Then = Box::new(move |ctx, res| match res {
        Ok(Answer::Ints(v)) => join.part(&at, Ok(v)),
        Ok(Answer::Error(e)) => join.part(&at, Err(e)),
        Ok(_) => join.part(&at, Err(error::INTERNAL.into())),
        Err(lost) => {
            let text = match lost {
                Lost::Unreachable => error::MANY_UNREACHABLE,
                Lost::Timeout | Lost::Failed => error::MANY_TIMEOUT,
            };
            join.part(&at, Err(format!("{text} ({})", peers::address(ctx, &to))));
        }
    });
    let send = Rc::new(move |ctx: &Context, timeout, then| {
        bus::ask_many(ctx, &node, req.clone(), timeout, then)
    });
    ask_while_learning(ctx, deadline, send, then);
}

/// The integers of a part's reply, or its error line.
fn ints(r: RedisResult) -> Result<Vec<i64>, String> {
    match r {
        Ok(RedisValue::Array(v)) => v
            .into_iter()
            .map(|x| match x {
                RedisValue::Integer(n) => Ok(n),
                _ => Err(error::INTERNAL.to_string()),
            })
            .collect(),
        Ok(_) => Err(error::INTERNAL.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The answers of a split call as its parts arrive. The client is answered once: at the first
/// error, or with the whole array when the last part arrives. Main thread only (shared with
/// parts that cross a worker, hence the lock, never held across anything but this struct).
#[derive(Clone)]
struct Join(Arc<Mutex<Joining>>);

struct Joining {
    answers: Vec<i64>,
    left: usize,
    /// A part answered later is a timeout (a remote one is dropped by the bus before).
    deadline: Instant,
    /// `None` once answered.
    blocked: Option<Blocked>,
}

impl Join {
    fn new(len: usize, parts: usize, blocked: Blocked, deadline: Instant) -> Join {
        Join(Arc::new(Mutex::new(Joining {
            answers: vec![0; len],
            left: parts,
            deadline,
            blocked: Some(blocked),
        })))
    }

    /// One part's answer for the items at `at`.
    fn part(&self, at: &[usize], r: Result<Vec<i64>, String>) {
        let done = {
            let mut j = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if j.blocked.is_none() {
                return;
            }
            let r = match r {
                Ok(_) if Instant::now() > j.deadline => Err(error::DB_TIMEOUT.to_string()),
                r => r,
            };
            match r {
                Ok(v) if v.len() == at.len() => {
                    for (&i, n) in at.iter().zip(v) {
                        j.answers[i] = n;
                    }
                    j.left -= 1;
                    (j.left == 0).then(|| {
                        let answers = std::mem::take(&mut j.answers);
                        (j.blocked.take(), Ok(answers))
                    })
                }
                Ok(_) => Some((j.blocked.take(), Err(error::INTERNAL.to_string()))),
                Err(e) => Some((j.blocked.take(), Err(e))),
            }
        };
        if let Some((Some(blocked), answer)) = done {
            blocked.finish(Box::new(Joined(answer)));
        }
    }
}

/// The joined answer of a split call.
struct Joined(Result<Vec<i64>, String>);

impl Completion for Joined {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match &self.0 {
            Ok(v) => Ok(RedisValue::Array(
                v.iter().map(|&n| RedisValue::Integer(n)).collect(),
            )),
            Err(e) => Err(RedisError::String(e.clone())),
        }
    }
}
