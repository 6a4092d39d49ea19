//! MEMBER.KEYS RELOAD | LIST | NODES: the node's ring of tokenization keys (docs/security.md,
//! "Key rings"). RELOAD reads the file `member.token-key-file` names again, the same path: the
//! server calls a config's setter only when its value changes, so a key file rewritten in
//! place (a secrets manager, a mounted secret) is loaded this way. Each node holds its own
//! ring: run it on every node, replicas included. NODES shows every node's ring as the node
//! last reported it to the database (`upkeep/node_report.rs`).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::{block_timeout, may_block};
use crate::config::token_key;
use crate::db::{pool, sql, DbErr};
use crate::model::error;
use crate::server::block::{Blocked, Completion};
use crate::server::reply;
use crate::sets::state;
use crate::upkeep::node_report;

pub fn keys(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, action] = args.as_slice() else {
        return Err(RedisError::WrongArity);
    };
    let action = action.as_slice();
    if action.eq_ignore_ascii_case(b"RELOAD") {
        let n = token_key::reload().map_err(RedisError::String)?;
        let [_, (_, ring)] = token_key::ring_fields();
        reply::log(
            ctx,
            reply::Level::Notice,
            &format!("libmember: key ring reloaded from member.token-key-file: {n} key(s), {ring}"),
        );
        return Ok(RedisValue::Integer(n as i64));
    }
    if action.eq_ignore_ascii_case(b"LIST") {
        return Ok(RedisValue::Array(list()));
    }
    if action.eq_ignore_ascii_case(b"NODES") {
        may_block(ctx)?;
        let fallback = NodesDone(Err(DbErr::Unavailable(error::WORKER_LOST.into())));
        let blocked = Blocked::block(ctx, block_timeout(), Box::new(fallback));
        pool::run(move |db| {
            let seen = sql::nodes(db, node_report::FRESH);
            blocked.finish(Box::new(NodesDone(seen)));
        });
        return Ok(RedisValue::NoReply);
    }
    Err(crate::command::unknown_option(action))
}

/// The nodes heard from within `node_report::FRESH`, by run id: one array each, `[run id,
/// port, primary|replica, milliseconds since its report, [[key id, fingerprint], …]]`.
struct NodesDone(Result<Vec<sql::NodeSeen>, DbErr>);

impl Completion for NodesDone {
    fn apply(&mut self, _ctx: &Context) {}

    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        let seen = self
            .0
            .as_ref()
            .map_err(|e| RedisError::String(e.reply_text()))?;
        Ok(RedisValue::Array(
            seen.iter()
                .map(|n| {
                    let ring = n
                        .ring
                        .iter()
                        .map(|(id, fp)| {
                            RedisValue::Array(vec![
                                RedisValue::BulkString(id.clone()),
                                RedisValue::BulkString(fp.clone()),
                            ])
                        })
                        .collect();
                    RedisValue::Array(vec![
                        RedisValue::BulkString(n.node.clone()),
                        RedisValue::Integer(n.port.into()),
                        RedisValue::BulkString(n.role.clone()),
                        RedisValue::Integer(n.seen_ms_ago),
                        RedisValue::Array(ring),
                    ])
                })
                .collect(),
        ))
    }
}

/// One entry a key, in the ring's order: its id, its fingerprint, `current` (new sets are
/// created under it) or `kept`, and how many sets this node serves under it.
fn list() -> Vec<RedisValue> {
    let used = state::tokenized_keys();
    token_key::entries()
        .into_iter()
        .enumerate()
        .map(|(i, (id, fp))| {
            let sets = used.iter().filter(|(_, u)| *u == fp).count();
            RedisValue::Array(vec![
                RedisValue::BulkString(id),
                RedisValue::BulkString(fp),
                RedisValue::SimpleStringStatic(if i == 0 { "current" } else { "kept" }),
                RedisValue::Integer(sets as i64),
            ])
        })
        .collect()
}
