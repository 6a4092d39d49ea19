//! MEMBER.REBUILD <set> [SYNC]: rebuild a set's filter from PostgreSQL off the main thread.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use super::{may_block, set_name};
use crate::block::Blocked;
use crate::rebuild::{self, RebuildReply, Reply};
use crate::{error, state};

/// MEMBER.REBUILD <set> [SYNC] — `OK` at once, or with SYNC the number of members loaded
/// once the new filter is in place (the client waits, the server does not).
pub fn rebuild(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !(2..=3).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let name = set_name(&args[1])?;
    let sync = match args.get(2) {
        None => false,
        Some(a) if a.as_slice().eq_ignore_ascii_case(b"SYNC") => true,
        Some(a) => {
            return Err(RedisError::String(format!(
                "ERR unknown option '{}'",
                crate::reply::escape(a.as_slice())
            )))
        }
    };
    state::with(|r| r.find(&name).map(|_| ()))?;
    if sync && !may_block(ctx) {
        return Err(RedisError::Str(error::NEEDS_BLOCKING));
    }
    if !rebuild::start(&name) {
        return Err(RedisError::Str(error::REBUILD_RUNNING));
    }
    if !sync {
        return Ok(RedisValue::SimpleStringStatic("OK"));
    }
    // No timeout: a rebuild takes as long as the table takes to stream.
    let waiter = Blocked::block(
        ctx,
        std::time::Duration::ZERO,
        Box::new(RebuildReply(Err(error::WORKER_LOST.into()), Reply::Rows)),
    );
    rebuild::wait(&name, waiter, Reply::Rows);
    Ok(RedisValue::NoReply)
}
