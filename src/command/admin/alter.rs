//! MEMBER.ALTER: changes a set's ERROR, CAPACITY, CACHE-TTL or RECENT-TTL in the catalog (on a
//! worker); a new ERROR or CAPACITY rebuilds the filter in the background, the old one serving.

use std::time::Duration;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::admin::settings::Given;
use crate::command::Answer;
use crate::command::{block_timeout, may_block, set_name};
use crate::db::sql::{self, Altered};
use crate::db::{pool, DbErr};
use crate::server::block::Blocked;
use crate::sets::state::{self, Rebuild, SetChange, SetDef};
use crate::upkeep::rebuild::Reply;
use crate::upkeep::rebuild_wait;
use crate::{filter::store, model::error, server::mainq, sets::keys, sets::learn, sets::limits};

/// A parsed MEMBER.ALTER.
#[derive(Debug)]
struct Request {
    name: String,
    change: SetChange,
    sync: bool,
}

fn parse(mut args: Vec<RedisString>) -> Result<Request, RedisError> {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let sync = args.len() % 2 == 1
        && args
            .last()
            .is_some_and(|a| a.as_slice().eq_ignore_ascii_case(b"SYNC"));
    if sync {
        args.pop();
    }
    if args.len() % 2 == 1 {
        return Err(RedisError::WrongArity);
    }
    let name = set_name(&args[1])?;
    // Refused by name, whatever the value: these two can never change.
    for opt in args.iter().skip(2).step_by(2) {
        let opt = opt.as_slice();
        if opt.eq_ignore_ascii_case(b"NORMALIZE") {
            return Err(RedisError::Str(error::ALTER_NORMALIZE));
        }
        if opt.eq_ignore_ascii_case(b"TOKENIZE") {
            return Err(RedisError::Str(error::ALTER_TOKENIZE));
        }
    }
    let change = Given::parse(args.into_iter().skip(2))?.change;
    if change.is_empty() {
        return Err(RedisError::Str(error::ALTER_NOTHING));
    }
    Ok(Request { name, change, sync })
}

/// MEMBER.ALTER <set> [ERROR <rate>] [CAPACITY <n>] [CACHE-TTL <s>] [RECENT-TTL <s>] [SYNC]
///
/// `OK` once the catalog row holds the new settings (every node learns them at its next
/// catalog check, replicas through `MEMBER._SET`). A new ERROR or CAPACITY starts a rebuild
/// with them; the old filter serves until the new one is swapped in. With `SYNC` the client
/// (not the server) waits for that swap.
pub fn alter(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if crate::command::admin::rotate::asks(&args) {
        return crate::command::admin::rotate::rotate_key(ctx, args);
    }
    let Request { name, change, sync } = parse(args)?;
    crate::sets::acl::check_set(ctx, &name, crate::sets::acl::Access::Write)?;
    may_block(ctx)?;
    // The new filter must fit, for CAPACITY or for the members this node's filter holds now,
    // under the ceiling and in what maxmemory leaves: checked against the stored settings the
    // change applies to, before anything is written.
    let budget = limits::refresh_memory_budget(ctx);
    let items = state::with(|r| r.sets.get(&name).map(|s| s.filter_key.clone()))
        .and_then(|k| keys::with_db0(ctx, |ctx| store::with(ctx, &k, |f| f.bloom.items())))
        .unwrap_or(0);
    let check = move |d: &SetDef| -> Result<(), String> {
        let members = d.capacity.max(items);
        crate::sets::limits::check_filter_size(members, d.error_rate)?;
        crate::server::transient::check_memory(
            crate::filter::bytes_for(members, d.error_rate),
            budget,
        )
    };
    // Without SYNC the reply waits for the catalog step only, bounded like any database call;
    // with SYNC for the rebuild too, like MEMBER.REBUILD SYNC.
    let timeout = if sync {
        Duration::ZERO
    } else {
        block_timeout()
    };
    let blocked = Blocked::block(
        ctx,
        timeout,
        Box::new(Answer(Err(error::WORKER_LOST.into()))),
    );
    let step = Step {
        name,
        sync,
        removals: state::with(|r| r.catalog.removals),
        blocked: Some(blocked),
        result: None,
    };
    pool::run(move |db| {
        let mut step = step;
        step.result = Some(sql::alter_set(db, &step.name, &change, &check));
    });
    Ok(RedisValue::NoReply)
}

/// The catalog step in flight. However it ends (done, dropped unrun, panicked), its result
/// reaches the main thread exactly once, with the client's handle.
struct Step {
    name: String,
    sync: bool,
    /// `Catalog::removals` when the step was sent.
    removals: u64,
    blocked: Option<Blocked>,
    result: Option<Result<Option<Altered>, DbErr>>,
}

impl Drop for Step {
    fn drop(&mut self) {
        let (name, sync, removals) = (std::mem::take(&mut self.name), self.sync, self.removals);
        let blocked = self.blocked.take();
        let res = self
            .result
            .take()
            .unwrap_or_else(|| Err(DbErr::Unavailable(error::WORKER_LOST.into())));
        mainq::post(Box::new(move |ctx| {
            if let Some(blocked) = blocked {
                done(ctx, &name, sync, removals, blocked, res)
            }
        }));
    }
}

/// Main thread: the catalog was changed (or not). The new definition is applied here and
/// replicated, even when the client has timed out meanwhile.
fn done(
    ctx: &Context,
    name: &str,
    sync: bool,
    removals: u64,
    blocked: Blocked,
    res: Result<Option<Altered>, DbErr>,
) {
    let altered = match res {
        Ok(Some(a)) => a,
        Ok(None) => return blocked.finish(Box::new(Answer(Err(error::UNKNOWN_SET.into())))),
        Err(e) => return blocked.finish(Box::new(Answer(Err(e.reply_text())))),
    };
    let resized = altered.before.filter_differs(&altered.row.def);
    let applied = apply(ctx, &altered, removals);
    let running = state::with(|r| {
        r.sets
            .get(name)
            .is_some_and(|s| matches!(s.rebuild, Rebuild::Running { .. }))
    });
    if sync && applied && resized && running {
        rebuild_wait::wait(name, blocked, Reply::Altered);
    } else {
        blocked.finish(Box::new(Answer(Ok(()))));
    }
}

/// Makes this node (and its replicas) hold the altered definition, unless what it holds now
/// is newer: the set was dropped here since the step was sent (a DROP that came after), or
/// this node already holds a later incarnation of the name (a catalog row created after the
/// altered one: row identities are creation times). True when applied.
fn apply(ctx: &Context, altered: &Altered, removals: u64) -> bool {
    let row = &altered.row;
    let version = altered.version.unwrap_or(0);
    let (current, newer) = state::with(|r| match r.sets.get(&row.def.name) {
        Some(s) => (
            s.catalog_id.is_none_or(|held| held <= row.id),
            s.catalog_id == Some(row.id) && s.altered_version > version,
        ),
        None => (r.catalog.removals == removals, false),
    });
    if !current {
        return false;
    }
    // A later ALTER of this row was applied first (the two answers crossed on their way to
    // the main thread): its definition already holds this one's change.
    if newer {
        return true;
    }
    // Starts the rebuild when ERROR or CAPACITY changed (`learn::learn`).
    learn::learn_row(ctx, row.clone());
    crate::command::admin::create::tell_the_cluster(ctx);
    crate::server::replication::replicate_set(ctx, &row.def, Some(row.id));
    state::with(|r| {
        if let Some(s) = r.sets.get_mut(&row.def.name) {
            s.altered_version = s.altered_version.max(version);
        }
    });
    true
}
