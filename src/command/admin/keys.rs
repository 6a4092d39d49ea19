//! MEMBER.KEYS RELOAD | LIST: the node's ring of tokenization keys (docs/security.md, "Key
//! rings"). RELOAD reads the file `member.token-key-file` names again, the same path: the
//! server calls a config's setter only when its value changes, so a key file rewritten in
//! place (a secrets manager, a mounted secret) is loaded this way. Each node holds its own
//! ring: run it on every node, replicas included.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::config::token_key;
use crate::server::reply;
use crate::sets::state;

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
    Err(crate::command::unknown_option(action))
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
