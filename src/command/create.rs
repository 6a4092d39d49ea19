//! MEMBER.CREATE: the catalog row and table in PostgreSQL, then (for a set new to this node)
//! the filter built from the rows already there, all before the reply.

use std::sync::atomic::AtomicU64;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use super::internal;
use super::{block_timeout, may_block, set_name, Options};
use crate::block::{Blocked, Completion};
use crate::canon::Normalize;
use crate::config::{self, parse_error_rate};
use crate::db::sql::Built;
use crate::db::{pool, sql, DbErr};
use crate::filter_type::{self, FilterValue};
use crate::state::{self, SetDef};
use crate::{error, keys};

const OPTIONS: [&str; 5] = ["ERROR", "CAPACITY", "CACHE-TTL", "RECENT-TTL", "NORMALIZE"];

fn parse(args: Vec<RedisString>) -> Result<(SetDef, [bool; 5]), RedisError> {
    if args.len() < 2 || !args.len().is_multiple_of(2) {
        return Err(RedisError::WrongArity);
    }
    let mut it = args.into_iter().skip(1);
    let name = set_name(&it.next().unwrap())?;
    let o = Options::parse(it, OPTIONS[0], &OPTIONS[1..])?;
    let error_rate = match o.get("ERROR") {
        Some(v) => std::str::from_utf8(v.as_slice())
            .ok()
            .and_then(parse_error_rate)
            .ok_or(RedisError::Str(error::BAD_ERROR_RATE))?,
        None => config::DEFAULT_ERROR_RATE.get(),
    };
    let capacity = o
        .int(
            "CAPACITY",
            1..=config::DEFAULT_CAPACITY_MAX,
            error::BAD_CAPACITY,
        )?
        .unwrap_or_else(|| config::DEFAULT_CAPACITY.load(std::sync::atomic::Ordering::Relaxed));
    let cache_ttl = o
        .int(
            "CACHE-TTL",
            config::CACHE_TTL_MIN..=config::CACHE_TTL_MAX,
            error::BAD_CACHE_TTL,
        )?
        .unwrap_or_else(|| config::CACHE_TTL.load(std::sync::atomic::Ordering::Relaxed));
    let recent_ttl = o
        .int(
            "RECENT-TTL",
            config::RECENT_TTL_MIN..=config::RECENT_TTL_MAX,
            error::BAD_RECENT_TTL,
        )?
        .unwrap_or_else(|| config::RECENT_TTL.load(std::sync::atomic::Ordering::Relaxed));
    let normalize = match o.get("NORMALIZE") {
        Some(v) => Normalize::parse(v.as_slice()).ok_or(RedisError::Str(error::BAD_NORMALIZE))?,
        None => Normalize::None,
    };
    let explicit = OPTIONS.map(|n| o.get(n).is_some());
    Ok((
        SetDef {
            name,
            error_rate,
            capacity: capacity as u64,
            cache_ttl: cache_ttl as u64,
            recent_ttl: recent_ttl as u64,
            normalize,
        },
        explicit,
    ))
}

/// MEMBER.CREATE <set> [ERROR <rate>] [CAPACITY <n>] [CACHE-TTL <s>] [RECENT-TTL <s>]
/// [NORMALIZE none|lower|username]
pub fn create(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (def, explicit) = parse(args)?;
    if !may_block(ctx) {
        return Err(RedisError::Str(error::NEEDS_BLOCKING));
    }
    let build = state::with(|r| !r.sets.contains_key(&def.name));
    let fallback = CreateDone {
        result: Err(DbErr::Unavailable(error::WORKER_LOST.into())),
    };
    let blocked = Blocked::block(ctx, block_timeout(), Box::new(fallback));
    pool::run(move |db| {
        let progress = AtomicU64::new(0);
        let result = sql::create_set(db, &def, &explicit, build, &progress);
        blocked.finish(Box::new(CreateDone { result }));
    });
    Ok(RedisValue::NoReply)
}

struct CreateDone {
    result: Result<(SetDef, Option<Built>), DbErr>,
}

impl Completion for CreateDone {
    fn apply(&mut self, ctx: &Context) {
        let (def, built) = match &mut self.result {
            Ok(done) => done,
            Err(e) => {
                // A set table the module may not attach the change log to is refused loudly:
                // it could not keep its sync bound (docs/sync.md).
                if e.reply_text().contains("change-log triggers") {
                    ctx.log_warning(&format!(
                        "libmember: MEMBER.CREATE refused: {}",
                        e.reply_text()
                    ));
                }
                return;
            }
        };
        let newly = state::with(|r| !r.sets.contains_key(&def.name));
        state::register(def.clone());
        internal::replicate_set(ctx, def);
        if let (true, Some(b)) = (newly, built.take()) {
            let key = keys::filter_key(&def.name);
            let v = FilterValue::built(b.bloom, b.watermark);
            internal::replicate_filter(ctx, &key, &v);
            filter_type::install(ctx, &key, v);
        }
    }

    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match &self.result {
            Ok(_) => Ok(RedisValue::SimpleStringStatic("OK")),
            Err(e) => Err(RedisError::String(e.reply_text())),
        }
    }
}
