//! The command layer: parse arguments into typed requests, hand them to the funnel or the
//! database, reply. No SQL here.
//!
//! Grouped by family, so a command's code is found by its name:
//! - `lookup/`: MEMBER.EXISTS and MEMBER.EXPLAIN (the funnel);
//! - `write.rs`: MEMBER.ADD and MEMBER.DEL;
//! - `batch/`: MEMBER.MEXISTS and MEMBER.MADD, their parts, where their answers go, and their
//!   split across a cluster's owners (`batch/wide.rs`);
//! - `admin/`: set administration: CREATE (and its attach options), ALTER, DROP, REBUILD (on
//!   every primary of a cluster: `admin/rebuild_wide.rs`), and the set settings they parse;
//! - `info/`: MEMBER.NODEINFO, MEMBER.INFO over a cluster (`info/wide.rs`) and the server's
//!   `INFO member` section;
//! - `forward.rs`, `forwarded.rs`: canonical forwarding over the cluster bus, outbound (whether
//!   an item is served elsewhere, and sending it there) and inbound (serving what another node
//!   sent);
//! - `table/`: the command table, the raw entry points of the hot path, registration, COMMAND
//!   INFO and COMMAND DOCS;
//! - `internal.rs`: the internal commands that carry derived effects to replicas and the AOF;
//! - `retry.rs`: asking the catalog for an unknown set, then running the call again.
//!
//! Each family's cluster-wide form sits beside its single-node form, so imports run one way:
//! the table on top, the families below it, forwarding and this file at the bottom.

pub mod admin;
pub mod batch;
pub mod forward;
pub mod forwarded;
pub mod info;
pub mod internal;
pub mod lookup;
pub mod retry;
pub mod table;
pub mod write;

use std::time::Duration;

use redis_module::{Context, RedisError, RedisString};

use crate::cluster::responder::Responder;
use crate::db::pool::Point;
use crate::db::DbErr;
use crate::server::block::{Blocked, Completion};
use crate::{config, model::error};

pub use crate::model::set_def::valid_set_name;
pub use crate::sets::limits::may_block;

fn err(msg: &'static str) -> RedisError {
    RedisError::Str(msg)
}

/// `ERR unknown option '…'`, the option escaped and bounded as every echoed argument is.
/// Only for commands that carry no item: see [`Shown`].
pub fn unknown_option(given: &[u8]) -> RedisError {
    RedisError::String(format!(
        "ERR unknown option '{}'",
        crate::server::reply::escape(given)
    ))
}

/// `ERR unknown option at argument N`: what the commands that carry items answer. A word in
/// an option's place there is as likely a misplaced item (`MEMBER.ADD s card merchant`), and
/// on a TOKENIZE set no item may come back in a reply, whatever the set: the parser runs
/// before the set is known, so these commands never echo it.
pub fn unknown_option_at(position: usize) -> RedisError {
    RedisError::String(format!("ERR unknown option at argument {position}"))
}

/// How an unknown option name is shown in its error.
#[derive(Clone, Copy)]
pub enum Shown {
    /// Escaped and bounded (set-wide commands: nothing there is an item).
    Text,
    /// By its position in the call only; the option pairs start at this argument (commands
    /// that carry items).
    Position(usize),
}

/// Validates a set name argument.
pub fn set_name(b: &[u8]) -> Result<String, RedisError> {
    if !valid_set_name(b) {
        return Err(err(error::BAD_SET_NAME));
    }
    Ok(String::from_utf8_lossy(b).into_owned())
}

/// One command argument as bytes: the server's `RedisString` in the module, plain byte
/// vectors or slices where no server runs (the fuzz targets and unit tests drive the same
/// parsers with those).
pub trait Arg: std::ops::Deref<Target = [u8]> {}
impl<A: std::ops::Deref<Target = [u8]>> Arg for A {}

/// `NAME value` option pairs after the positional arguments, each allowed at most once.
pub struct Options<A: Arg = RedisString> {
    pairs: Vec<(&'static str, A)>,
}

impl<A: Arg> Options<A> {
    /// Parses pairs whose names are `first` or one of `more` (case-insensitive); an unknown
    /// name is echoed (set-wide commands).
    pub fn parse(
        rest: impl Iterator<Item = A>,
        first: &'static str,
        more: &[&'static str],
    ) -> Result<Options<A>, RedisError> {
        Self::parse_shown(rest, first, more, Shown::Text)
    }

    /// `parse`, with an unknown name shown as `shown` says.
    pub fn parse_shown(
        rest: impl Iterator<Item = A>,
        first: &'static str,
        more: &[&'static str],
        shown: Shown,
    ) -> Result<Options<A>, RedisError> {
        let mut pairs: Vec<(&'static str, A)> = Vec::new();
        let mut rest = rest.enumerate();
        while let Some((at, name)) = rest.next() {
            let given: &[u8] = &name;
            let Some(opt) = std::iter::once(&first)
                .chain(more)
                .find(|a| a.as_bytes().eq_ignore_ascii_case(given))
            else {
                return Err(match shown {
                    Shown::Text => unknown_option(given),
                    Shown::Position(start) => unknown_option_at(start + at),
                });
            };
            let (_, value) = rest
                .next()
                .ok_or_else(|| RedisError::String(format!("ERR option {opt} needs a value")))?;
            if pairs.iter().any(|(n, _)| n == opt) {
                return Err(err(error::DUPLICATE_OPTION));
            }
            pairs.push((opt, value));
        }
        Ok(Options { pairs })
    }

    pub fn get(&self, name: &str) -> Option<&A> {
        self.pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// An integer option within `range`, or the fixed error `bad`.
    pub fn int(
        &self,
        name: &str,
        range: std::ops::RangeInclusive<i64>,
        bad: &'static str,
    ) -> Result<Option<i64>, RedisError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let n: i64 = std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(err(bad))?;
        if !range.contains(&n) {
            return Err(err(bad));
        }
        Ok(Some(n))
    }
}

/// `<set> <item> [SCOPE <scope>] [extra options]`: the shape of ADD, EXISTS, DEL, EXPLAIN.
pub struct ItemArgs<A: Arg = RedisString> {
    pub set: String,
    pub item: A,
    pub opts: Options<A>,
}

impl<A: Arg> ItemArgs<A> {
    pub fn parse(args: Vec<A>, extra: &[&'static str]) -> Result<ItemArgs<A>, RedisError> {
        if args.len() < 3 || args.len().is_multiple_of(2) {
            return Err(RedisError::WrongArity);
        }
        let mut it = args.into_iter().skip(1);
        let set = set_name(&it.next().unwrap())?;
        let item = it.next().unwrap();
        let opts = Options::parse_shown(it, "SCOPE", extra, Shown::Position(3))?;
        Ok(ItemArgs { set, item, opts })
    }

    pub fn scope(&self) -> &[u8] {
        self.opts.get("SCOPE").map(|s| &**s).unwrap_or(b"")
    }
}

/// `<set> [options] ITEMS <item> [<item> …]`: the shape of MEXISTS and MADD. The options come
/// first, so an item spelled like an option (or like `ITEMS`) is always an item.
pub struct ManyArgs<A: Arg = RedisString> {
    pub set: String,
    pub opts: Options<A>,
    pub items: Vec<A>,
}

impl<A: Arg> ManyArgs<A> {
    /// Parses `SCOPE` and the `extra` options, then everything after the first `ITEMS` in an
    /// option name's place as items (at least one).
    pub fn parse(args: Vec<A>, extra: &[&'static str]) -> Result<ManyArgs<A>, RedisError> {
        if args.len() < 4 {
            return Err(RedisError::WrongArity);
        }
        let mut at = 2;
        while at < args.len() && !args[at].eq_ignore_ascii_case(b"ITEMS") {
            at += 2;
        }
        if at + 1 >= args.len() {
            return Err(err(error::NO_ITEMS));
        }
        let mut it = args.into_iter();
        let set = set_name(&it.nth(1).unwrap())?;
        let opts =
            Options::parse_shown(it.by_ref().take(at - 2), "SCOPE", extra, Shown::Position(2))?;
        let items: Vec<A> = it.skip(1).collect();
        Ok(ManyArgs { set, opts, items })
    }

    pub fn scope(&self) -> &[u8] {
        self.opts.get("SCOPE").map(|s| &**s).unwrap_or(b"")
    }
}

pub fn block_timeout() -> Duration {
    Duration::from_millis(config::db_timeout_ms())
}

/// What a client waits for besides its statement: in a cluster, while a set's key rotates, a
/// write's reply waits for the owner of its twin's slot to apply the twin's effects
/// (docs/security.md, "In a cluster"). Lookups never wait (the defaults).
pub trait AskFirst {
    /// Whether the reply may have to wait: decided when the write is planned.
    fn may_ask_first(&self) -> bool {
        false
    }
    /// On the main thread, after `apply`: the requests to make first, each with the slot whose
    /// owner runs it; none to reply at once.
    fn ask_first(&self) -> Vec<(u16, crate::cluster::wire::Request)> {
        Vec::new()
    }
}

/// Where a reply goes once it may be given (a client here, another node, a part of a call).
pub type Deliver = Box<dyn FnOnce(&Context, redis_module::RedisResult) + Send>;

/// Main thread: applies `done`, then delivers its reply, after the requests it asks first have
/// been answered (`forward::answer_after`).
pub fn complete_asking<D: Completion + AskFirst>(ctx: &Context, done: &mut D, deliver: Deliver) {
    done.apply(ctx);
    let reply = done.reply(ctx);
    let asks = if reply.is_ok() {
        done.ask_first()
    } else {
        Vec::new()
    };
    if asks.is_empty() {
        return deliver(ctx, reply);
    }
    forward::answer_after(ctx, asks, reply, deliver);
}

/// A completion that carries the answer of one point query (a lookup or a write).
pub trait PointDone<T>: Completion + Clone + AskFirst {
    /// The (set, entity, scope) the query is about.
    fn target(&self) -> (&str, &str, &str);
    /// Stores the database's answer.
    fn answered(&mut self, res: Result<T, DbErr>);
    /// A write's twin (a rotating set's new form of it), made or deleted with it; a lookup's,
    /// asked beside it.
    fn twin(&self) -> Option<&str> {
        None
    }
}

/// Blocks the calling client and returns the point query whose answer completes `done` on the
/// main thread. If the query is dropped unanswered, the client gets `done` as it is (its
/// result preset to an error).
pub fn block_on_point<T: 'static, D: PointDone<T>>(ctx: &Context, done: D) -> Point<T> {
    let blocked = Blocked::block(ctx, block_timeout(), Box::new(done.clone()));
    point_for(blocked, done)
}

/// `block_on_point` for a client already blocked (waiting for the catalog, say).
pub fn point_for<T: 'static, D: PointDone<T>>(blocked: Blocked, done: D) -> Point<T> {
    let blocked = blocked.with_fallback(Box::new(done.clone()));
    if done.may_ask_first() {
        // Answered from the main thread, where the request to make first is decided.
        return point_remote(done, Responder::here(blocked));
    }
    let (set, entity, scope) = done.target();
    let (set, entity, scope) = (set.to_string(), entity.to_string(), scope.to_string());
    Point {
        set,
        entity,
        scope,
        twin: done.twin().map(str::to_string),
        reply: Box::new(move |res| {
            let mut done = done;
            done.answered(res);
            blocked.finish(Box::new(done));
        }),
    }
}

/// The point query of a request forwarded by another node (no client here): its answer
/// completes `done` on the main thread (effects applied exactly as for a local client) and
/// the reply goes back through `to`. Dropped unanswered, `done` completes as it is (its result
/// preset to an error), so an ADD's recent mark still ends.
pub fn point_remote<T: 'static, D: PointDone<T>>(done: D, to: Responder) -> Point<T> {
    let (set, entity, scope) = done.target();
    let (set, entity, scope) = (set.to_string(), entity.to_string(), scope.to_string());
    let twin = done.twin().map(str::to_string);
    let mut remote = Remote {
        done: Some(done),
        to: Some(to),
    };
    Point {
        set,
        entity,
        scope,
        twin,
        reply: Box::new(move |res| {
            if let Some(d) = remote.done.as_mut() {
                d.answered(res);
            }
            drop(remote);
        }),
    }
}

/// A forwarded request's completion on its way to the main thread (see `point_remote`).
struct Remote<D: Completion + AskFirst> {
    done: Option<D>,
    to: Option<Responder>,
}

impl<D: Completion + AskFirst> Drop for Remote<D> {
    fn drop(&mut self) {
        if let (Some(mut done), Some(to)) = (self.done.take(), self.to.take()) {
            crate::server::mainq::post(Box::new(move |ctx| {
                let deliver: Deliver = Box::new(move |ctx, reply| to.answer(ctx, reply));
                complete_asking(ctx, &mut done, deliver);
            }));
        }
    }
}

/// The reply of a set-wide write that answers OK or why not (MEMBER.CREATE, MEMBER.ALTER).
pub(super) struct Answer(pub(super) Result<(), String>);

impl crate::server::block::Completion for Answer {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> redis_module::RedisResult {
        match &self.0 {
            Ok(()) => Ok(redis_module::RedisValue::SimpleStringStatic("OK")),
            Err(e) => Err(RedisError::String(e.clone())),
        }
    }
}
