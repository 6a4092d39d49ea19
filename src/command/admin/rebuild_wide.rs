//! MEMBER.REBUILD in cluster mode (docs/cluster-commands.md): the node that received it asks
//! every primary, itself included, to rebuild its slots of the set (`start`), and a primary
//! asked by another node does so (`serve`). The client is blocked once and gets one reply.

use std::cell::RefCell;
use std::rc::Rc;

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::cluster::bus::{self, Lost};
use crate::cluster::owner;
use crate::cluster::peers;
use crate::cluster::responder::Responder;
use crate::cluster::wire::{Answer, Rebuild};
use crate::command::block_timeout;
use crate::model::error;
use crate::server::block::{Blocked, Completion};
use crate::sets::{catalog_ask, state};
use crate::upkeep::rebuild::{self, Reason};
use crate::upkeep::rebuild_wait;

/// One cluster-wide call: the client and what is still awaited.
struct Gather {
    /// Taken by the one reply.
    blocked: Option<Blocked>,
    /// Primaries that have not answered yet.
    left: usize,
    /// Rows summed so far (SYNC).
    rows: u64,
    sync: bool,
}

type Shared = Rc<RefCell<Gather>>;

/// Asks every primary (this node included) to rebuild its slots of `set`, a set this node
/// knows; `blocked` gets `OK` once each has acknowledged (ASYNC) or the sum of the rows
/// their rebuilds loaded (SYNC), else the first failure, naming the primary's address. Each
/// primary runs a rebuild that starts after the call: one already running is let finish, and
/// a new one follows it (see `rebuild_now`). Main thread.
pub(in crate::command) fn start(ctx: &Context, blocked: Blocked, set: &str, sync: bool) {
    let me = peers::my_id();
    let mut others: Vec<String> = owner::primaries();
    others.retain(|id| *id != me);
    let g: Shared = Rc::new(RefCell::new(Gather {
        blocked: Some(blocked),
        left: others.len() + 1,
        rows: 0,
        sync,
    }));
    // ASYNC: a start is acknowledged within the database timeout (the asked node may first
    // query its catalog for the set). SYNC: the same for the acknowledgement, then as long
    // as the rebuild takes, while the cluster holds that node up.
    for id in others {
        let addr = peers::address(ctx, &id);
        let g = g.clone();
        let req = Rebuild {
            id: 0,
            set: set.to_string(),
            sync,
        };
        let then: bus::Then = Box::new(move |ctx, res| part(ctx, &g, heard(res, &addr)));
        bus::ask_rebuild(ctx, &id, req, block_timeout(), then);
    }
    if sync {
        let g = g.clone();
        let addr = peers::address(ctx, &me);
        rebuild_now(
            ctx,
            set,
            Some(Box::new(move |ctx, rows| {
                let rows = rows.map_err(|e| from(&e, &addr));
                part(ctx, &g, rows)
            })),
        );
    } else {
        rebuild_now(ctx, set, None);
        part(ctx, &g, Ok(0));
    }
}

/// Has this node run a rebuild of `set` that starts now, or, if one is running (auto-grow,
/// ALTER, a previous REBUILD), as soon as that one ends: so its rows include every row
/// committed before the call. `then` (SYNC) gets the rows of that rebuild, or why it failed.
fn rebuild_now(ctx: &Context, set: &str, then: Option<state::RebuildThen>) {
    if !rebuild::start(set, Reason::Manual) {
        let name = set.to_string();
        // Whatever the running one's outcome; if yet another started meanwhile, it started
        // after the call too, and is the one waited for.
        let after: state::RebuildThen = Box::new(move |ctx, _| {
            rebuild::start(&name, Reason::Manual);
            if let Some(then) = then {
                rebuild_wait::wait_then(ctx, &name, then);
            }
        });
        rebuild_wait::wait_then(ctx, set, after);
        return;
    }
    if let Some(then) = then {
        rebuild_wait::wait_then(ctx, set, then);
    }
}

/// One primary's part: a failure answers the client at once; the last success answers it with
/// `OK` or the rows summed.
fn part(_ctx: &Context, g: &Shared, res: Result<u64, String>) {
    let mut g = g.borrow_mut();
    let Some(_) = g.blocked.as_ref() else {
        return;
    };
    match res {
        Err(e) => {
            let blocked = g.blocked.take().unwrap();
            blocked.finish(Box::new(Reply(Err(e))));
        }
        Ok(rows) => {
            g.rows += rows;
            g.left -= 1;
            if g.left == 0 {
                let out = if g.sync { Some(g.rows) } else { None };
                g.blocked.take().unwrap().finish(Box::new(Reply(Ok(out))));
            }
        }
    }
}

/// What one primary's answer means for the call.
fn heard(res: Result<Answer, Lost>, addr: &str) -> Result<u64, String> {
    match res {
        Ok(Answer::Int(n)) => Ok(n.max(0) as u64),
        Ok(Answer::Error(e)) => Err(from(&e, addr)),
        Ok(Answer::Explain(..) | Answer::Started | Answer::Ints(_) | Answer::Fields(_)) => {
            Err(from(error::INTERNAL, addr))
        }
        Err(Lost::Timeout) => Err(format!(
            "{} primary {addr} did not answer MEMBER.REBUILD within member.db-timeout-ms; the \
             rebuilds that started go on",
            error::UNAVAILABLE
        )),
        Err(Lost::Unreachable) => Err(format!(
            "{} primary {addr} is not reachable over the cluster bus; the rebuilds that started \
             go on",
            error::UNAVAILABLE
        )),
        Err(Lost::Failed) => Err(format!(
            "{} primary {addr} failed before its rebuild ended; the rebuilds that started go on",
            error::UNAVAILABLE
        )),
    }
}

/// A primary's error line, its prefix kept first, naming the primary.
fn from(e: &str, addr: &str) -> String {
    format!("{e} (primary {addr})")
}

/// The client's one reply: `OK` (ASYNC), the rows summed (SYNC), or the first failure.
struct Reply(Result<Option<u64>, String>);

impl Completion for Reply {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match &self.0 {
            Ok(None) => Ok(RedisValue::SimpleStringStatic("OK")),
            Ok(Some(n)) => Ok(RedisValue::Integer(*n as i64)),
            Err(e) => Err(RedisError::String(e.clone())),
        }
    }
}

/// Another node's cluster-wide REBUILD: this primary rebuilds its slots of the set (after the
/// one running, if any: `rebuild_now`) and answers `0` at once, or with `sync` first `Started`,
/// then the rows loaded when it ends. A set not known here yet is learned in the background and
/// the call answered `TRYAGAIN` (a retry finds the rebuilds that started still running).
pub fn serve(ctx: &Context, req: Rebuild, to: Responder) {
    if !owner::is_primary() {
        return to.answer(ctx, Err(RedisError::Str(error::REBUILD_NOT_PRIMARY)));
    }
    if state::with(|r| r.serving(&req.set, false).is_none()) {
        let err = catalog_ask::learn_in_background(&req.set)
            .err()
            .unwrap_or(RedisError::Str(error::REBUILD_SET_BEING_LEARNED));
        return to.answer(ctx, Err(err));
    }
    if !req.sync {
        rebuild_now(ctx, &req.set, None);
        return to.answer(ctx, Ok(RedisValue::Integer(0)));
    }
    to.started(ctx);
    rebuild_now(
        ctx,
        &req.set,
        Some(Box::new(move |ctx, rows| {
            let res = rows
                .map(|n| RedisValue::Integer(n as i64))
                .map_err(RedisError::String);
            to.answer(ctx, res)
        })),
    );
}
