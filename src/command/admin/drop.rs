//! MEMBER.DROP <set> [DELETE-DATA]: the catalog row (and with DELETE-DATA the table) goes in
//! one transaction; then this node forgets the set and replicates `MEMBER._DROP`. Every other
//! node forgets it at its next catalog check.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::{block_timeout, may_block, set_name};
use crate::db::{pool, sql, DbErr};
use crate::server::block::{Blocked, Completion};
use crate::{model::error, server::replication, sets::learn};

/// MEMBER.DROP <set> [DELETE-DATA] — `OK`, or `ERR no such set` when the catalog has none.
pub fn drop(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !(2..=3).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let name = set_name(&args[1])?;
    crate::sets::acl::check_set(ctx, &name, crate::sets::acl::Access::Write)?;
    let delete_data = match args.get(2) {
        None => false,
        Some(a) if a.as_slice().eq_ignore_ascii_case(b"DELETE-DATA") => true,
        Some(a) => return Err(crate::command::unknown_option(a.as_slice())),
    };
    may_block(ctx)?;
    let fallback = DropDone {
        name: name.clone(),
        result: Err(DbErr::Unavailable(error::WORKER_LOST.into())),
    };
    let blocked = Blocked::block(ctx, block_timeout(), Box::new(fallback));
    pool::run(move |db| {
        let result = sql::drop_set(db, &name, delete_data);
        blocked.finish(Box::new(DropDone { name, result }));
    });
    Ok(RedisValue::NoReply)
}

struct DropDone {
    name: String,
    /// Whether the catalog held the set, and a note for the server log.
    result: Result<(bool, Option<String>), DbErr>,
}

impl Completion for DropDone {
    /// Whether or not the catalog still held it, the set is gone from the catalog now: this
    /// node and its replicas forget whatever they held for it.
    fn apply(&mut self, ctx: &Context) {
        if let Ok((_, note)) = &self.result {
            if let Some(note) = note {
                crate::server::reply::log(ctx, crate::server::reply::Level::Warning, note);
            }
            learn::forget(ctx, &self.name);
            crate::command::admin::create::tell_the_cluster(ctx);
            replication::replicate(ctx, "MEMBER._DROP", &[self.name.as_bytes()]);
        }
    }

    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match &self.result {
            Ok((true, _)) => Ok(RedisValue::SimpleStringStatic("OK")),
            Ok((false, _)) => Err(RedisError::Str(error::UNKNOWN_SET)),
            Err(e) => Err(RedisError::String(e.reply_text())),
        }
    }
}
