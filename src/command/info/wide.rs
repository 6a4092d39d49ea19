//! MEMBER.INFO over a cluster (docs/cluster-commands.md): routed by the set name, the receiving
//! node asks every node the cluster knows, replicas included, for its MEMBER.NODEINFO fields of
//! the set (`bus::ask_info`) and answers once: the set's definition, totals over the nodes, and
//! each node's part. A node that does not answer within `member.db-timeout-ms` is listed as
//! unreachable instead of failing the call (INFO is for diagnosis). It runs from a timer just
//! after the command, as a split MEXISTS does, so its own part is read the way every other
//! node's is, outside any command.

use std::cell::RefCell;
use std::os::raw::c_long;
use std::rc::Rc;
use std::time::{Duration, Instant};

use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::cluster::bus::{self, Lost};
use crate::cluster::peers;
use crate::cluster::responder::Responder;
use crate::cluster::wire::{Answer, Info};
use crate::command::{block_timeout, info, may_block};
use crate::model::error;
use crate::server::block::{Blocked, Completion, Fail};
use crate::sets::{catalog_ask, keys, state};

/// The fields that define the set, the same on every node: shown once, from the receiving node.
const DEFINITION: &[&str] = &[
    "name",
    "table",
    "source",
    "source_column",
    "source_scope_column",
    "sync_mode",
    "source_updated_column",
    "source_lookback_ms",
    "normalize",
    "tokenize",
    "token_key_fp",
    "error_rate",
    "capacity",
    "cache_ttl",
    "recent_ttl",
];

/// Summed over the primaries that answered: their filters hold disjoint slots (a replica's is
/// a copy of its primary's).
const SUM_PRIMARIES: &[&str] = &[
    "filter_items",
    "filter_bytes",
    "filter_bits",
    "cluster_slots_owned",
    "cluster_slots_ready",
];

/// Summed over every node that answered: each counts what it served itself.
const SUM_ALL: &[&str] = &[
    "exists_calls",
    "path_bloom_negative",
    "path_recent",
    "path_cache_hit",
    "path_fp_cache",
    "path_db_hit",
    "path_db_miss",
    "false_positives",
    "lapsed_lookups",
    "filter_incomplete_lookups",
    "filter_withheld_lookups",
    "db_errors",
    "adds",
    "adds_new",
    "dels",
    "fp_cache_entries",
    "recent_marks",
];

/// MEMBER.INFO <set>: standalone, this node's fields (`info::nodeinfo`); in a cluster, every
/// node's.
pub fn info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !crate::server::cluster_mode::enabled() {
        return info::nodeinfo(ctx, args);
    }
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let name = crate::command::set_name(&args[1])?;
    crate::sets::acl::check_set(ctx, &name, crate::sets::acl::Access::Read)?;
    cluster(ctx, name)
}

/// MEMBER.INFO <set> in a cluster: blocks the client and gathers every node's part. A set this
/// node does not know is asked of the catalog first.
fn cluster(ctx: &Context, name: String) -> RedisResult {
    if state::with(|r| r.serving(&name, false).is_none()) {
        let (known, asked) = (name.clone(), name.clone());
        return crate::command::retry::after_catalog(
            ctx,
            &asked,
            block_timeout(),
            move |_| Ok(state::with(|r| r.serving(&known, true).is_some()).then_some(())),
            move |ctx, blocked, ()| start(ctx, blocked, name),
        );
    }
    may_block(ctx)?;
    // Each node's answer is bounded by member.db-timeout-ms; the server's, a second later,
    // is a backstop.
    let fallback = Box::new(Fail(error::WORKER_LOST.into()));
    let blocked = Blocked::block(ctx, block_timeout() + Duration::from_secs(1), fallback);
    ctx.create_timer(
        Duration::ZERO,
        |ctx, (name, blocked): (String, Blocked)| start(ctx, blocked, name),
        (name, blocked),
    );
    Ok(RedisValue::NoReply)
}

/// Answers another node's request for this node's fields of `req.set`.
pub fn serve(ctx: &Context, req: Info, to: Responder) {
    if state::with(|r| r.serving(&req.set, false).is_none()) {
        let err = catalog_ask::learn_in_background(&req.set)
            .err()
            .unwrap_or(RedisError::Str(error::SET_BEING_LEARNED));
        return to.answer(ctx, Err(err));
    }
    match info::fields(ctx, &req.set) {
        Ok(f) => to.fields(ctx, owned(f)),
        Err(e) => to.answer(ctx, Err(e)),
    }
}

fn owned(fields: Vec<(&'static str, String)>) -> Vec<(String, String)> {
    fields
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// One node's part as it stands.
enum Part {
    Waiting,
    Fields(Vec<(String, String)>),
    /// No answer (`unreachable`), or the node's error line.
    Failed(String),
}

struct Node {
    seen: peers::Seen,
    part: Part,
}

struct Gathering {
    definition: Vec<(String, String)>,
    nodes: Vec<Node>,
    blocked: Option<Blocked>,
}

/// Main thread only: the parts arrive in bus callbacks.
#[derive(Clone)]
struct Gather(Rc<RefCell<Gathering>>);

fn start(ctx: &Context, blocked: Blocked, name: String) {
    keys::with_db0(ctx, |ctx| {
        let own = match info::fields(ctx, &name) {
            Ok(f) => owned(f),
            Err(e) => return blocked.finish(Box::new(Fail(e.to_string()))),
        };
        let definition = own
            .iter()
            .filter(|(k, _)| DEFINITION.contains(&k.as_str()))
            .cloned()
            .collect();
        let nodes: Vec<Node> = peers::nodes(ctx)
            .into_iter()
            .map(|seen| Node {
                part: if seen.myself {
                    Part::Fields(own.clone())
                } else {
                    Part::Waiting
                },
                seen,
            })
            .collect();
        let asks: Vec<(usize, String)> = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.seen.myself)
            .map(|(i, n)| (i, n.seen.id.clone()))
            .collect();
        let gather = Gather(Rc::new(RefCell::new(Gathering {
            definition,
            nodes,
            blocked: Some(blocked),
        })));
        let deadline = Instant::now() + block_timeout();
        for (i, id) in asks {
            ask(ctx, id, name.clone(), i, gather.clone(), deadline);
        }
        gather.done_if_complete();
    })
}

/// Asks `node` for its fields of `set`; the answer goes into `gather` at `at`.
fn ask(ctx: &Context, node: String, set: String, at: usize, gather: Gather, deadline: Instant) {
    let then: bus::Then = Box::new(move |_, res| {
        let part = match res {
            Ok(Answer::Fields(f)) => Part::Fields(f),
            Ok(Answer::Error(e)) => Part::Failed(e),
            Ok(_) => Part::Failed(error::INTERNAL.into()),
            Err(Lost::Unreachable) => Part::Failed("unreachable".into()),
            Err(Lost::Timeout | Lost::Failed) => Part::Failed("timeout".into()),
        };
        gather.0.borrow_mut().nodes[at].part = part;
        gather.done_if_complete();
    });
    let send = Rc::new(move |ctx: &Context, timeout, then| {
        let req = Info {
            id: 0,
            set: set.clone(),
        };
        bus::ask_info(ctx, &node, req, timeout, then)
    });
    crate::command::retry::ask_while_learning(ctx, deadline, send, then);
}

impl Gather {
    /// Answers the client once every node's part is in.
    fn done_if_complete(&self) {
        let mut g = self.0.borrow_mut();
        if g.blocked.is_none() || g.nodes.iter().any(|n| matches!(n.part, Part::Waiting)) {
            return;
        }
        let blocked = g.blocked.take().expect("checked above");
        let reply = WideInfo {
            definition: std::mem::take(&mut g.definition),
            nodes: std::mem::take(&mut g.nodes),
        };
        drop(g);
        blocked.finish(Box::new(reply));
    }
}

/// The joined MEMBER.INFO of a cluster.
struct WideInfo {
    definition: Vec<(String, String)>,
    nodes: Vec<Node>,
}

impl WideInfo {
    /// The top-level fields: the definition, node counts and the totals.
    fn top(&self) -> Vec<(String, String)> {
        let mut out = self.definition.clone();
        let answered: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| matches!(n.part, Part::Fields(_)))
            .collect();
        out.push(("cluster_nodes".into(), self.nodes.len().to_string()));
        out.push(("cluster_nodes_answered".into(), answered.len().to_string()));
        let sum = |k: &str, only_primaries: bool| -> u64 {
            answered
                .iter()
                .filter(|n| n.seen.primary || !only_primaries)
                .filter_map(|n| match &n.part {
                    Part::Fields(f) => f.iter().find(|(x, _)| x == k)?.1.parse::<u64>().ok(),
                    _ => None,
                })
                .sum()
        };
        for k in SUM_PRIMARIES {
            out.push((k.to_string(), sum(k, true).to_string()));
        }
        for k in SUM_ALL {
            out.push((k.to_string(), sum(k, false).to_string()));
        }
        out
    }
}

impl Completion for WideInfo {
    fn apply(&mut self, _ctx: &Context) {}

    /// A map (RESP2: alternating names and values) of the top-level fields, then `nodes`: one
    /// map per node, `node_id`, `address`, `role`, `state` (`ok`, `unreachable`, `timeout` or
    /// the node's error line), then that node's own fields.
    fn reply(&mut self, ctx: &Context) -> RedisResult {
        let top = self.top();
        raw::reply_with_map(ctx.ctx, (top.len() + 1) as c_long);
        for (k, v) in top {
            ctx.reply(Ok(RedisValue::SimpleString(k)));
            ctx.reply(Ok(RedisValue::BulkString(v)));
        }
        ctx.reply(Ok(RedisValue::SimpleStringStatic("nodes")));
        raw::reply_with_array(ctx.ctx, self.nodes.len() as c_long);
        for n in &self.nodes {
            let (state, fields): (&str, &[(String, String)]) = match &n.part {
                Part::Fields(f) => ("ok", f),
                Part::Failed(e) => (e.as_str(), &[]),
                Part::Waiting => ("timeout", &[]),
            };
            let role = if n.seen.primary { "primary" } else { "replica" };
            let head = [
                ("node_id", n.seen.id.as_str()),
                ("address", n.seen.address.as_str()),
                ("role", role),
                ("state", state),
            ];
            raw::reply_with_map(ctx.ctx, (head.len() + fields.len()) as c_long);
            for (k, v) in head {
                ctx.reply(Ok(RedisValue::SimpleStringStatic(k)));
                ctx.reply(Ok(RedisValue::BulkString(v.to_string())));
            }
            for (k, v) in fields {
                ctx.reply(Ok(RedisValue::SimpleString(k.clone())));
                ctx.reply(Ok(RedisValue::BulkString(v.clone())));
            }
        }
        Ok(RedisValue::NoReply)
    }
}
