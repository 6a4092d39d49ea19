//! MEMBER.REBUILD <set> [SYNC|ASYNC]: rebuild a set's filter from PostgreSQL off the main
//! thread; in cluster mode on every primary (`rebuild_wide.rs`).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use std::time::Duration;

use crate::command::retry::after_catalog;
use crate::command::{block_timeout, may_block, set_name};
use crate::server::block::Fail;
use crate::server::block::{Blocked, Completion};
use crate::upkeep::rebuild::{self, Reply};
use crate::upkeep::rebuild_wait::{self, RebuildReply};
use crate::{model::error, sets::state};

/// MEMBER.REBUILD <set> [SYNC|ASYNC] — `OK` at once (ASYNC, the default), or with SYNC the
/// number of members loaded once the new filter is in place (the client waits, the server
/// does not). In cluster mode every primary rebuilds its slots: `OK` once each has a rebuild
/// running, or with SYNC the sum of their rows.
pub fn rebuild(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !(2..=3).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let name = set_name(&args[1])?;
    crate::sets::acl::check_set(ctx, &name, crate::sets::acl::Access::Write)?;
    let sync = match args.get(2) {
        None => false,
        Some(a) if a.as_slice().eq_ignore_ascii_case(b"SYNC") => true,
        Some(a) if a.as_slice().eq_ignore_ascii_case(b"ASYNC") => false,
        Some(a) => return Err(crate::command::unknown_option(a.as_slice())),
    };
    if crate::server::cluster_mode::enabled() {
        return everywhere(ctx, name, sync);
    }
    if state::with(|r| r.serving(&name, false).is_none()) {
        // A set this node does not know: ask the catalog first (only this client waits; with
        // SYNC as long as the rebuild takes).
        let timeout = if sync {
            Duration::ZERO
        } else {
            block_timeout()
        };
        let asked = name.clone();
        return after_catalog(
            ctx,
            &name,
            timeout,
            |_| Ok(Some(())),
            move |_, blocked, ()| {
                if !rebuild::start(&asked, rebuild::Reason::Manual) {
                    blocked.finish(Box::new(Fail(error::REBUILD_RUNNING.into())));
                } else if sync {
                    rebuild_wait::wait(&asked, blocked.with_fallback(lost()), Reply::Rows);
                } else {
                    blocked.finish(Box::new(Started));
                }
            },
        );
    }
    if sync {
        may_block(ctx)?;
    }
    if !rebuild::start(&name, rebuild::Reason::Manual) {
        return Err(RedisError::Str(error::REBUILD_RUNNING));
    }
    if !sync {
        return Ok(RedisValue::SimpleStringStatic("OK"));
    }
    // No timeout: a rebuild takes as long as the table takes to stream.
    let waiter = Blocked::block(ctx, Duration::ZERO, lost());
    rebuild_wait::wait(&name, waiter, Reply::Rows);
    Ok(RedisValue::NoReply)
}

/// Cluster mode: the client waits (once) while every primary rebuilds; a set this node does
/// not know is asked of the catalog first, so an unknown set fails before any node is asked.
fn everywhere(ctx: &Context, name: String, sync: bool) -> RedisResult {
    may_block(ctx)?;
    if state::with(|r| r.serving(&name, false).is_none()) {
        let asked = name.clone();
        // No client timeout: the catalog query ends within its statement timeout, and each
        // primary's part is timed by the cluster bus.
        return after_catalog(
            ctx,
            &name,
            Duration::ZERO,
            |_| Ok(Some(())),
            move |ctx, blocked, ()| {
                crate::command::admin::rebuild_wide::start(
                    ctx,
                    blocked.with_fallback(lost()),
                    &asked,
                    sync,
                )
            },
        );
    }
    // No server timeout: each primary's part is timed by the cluster bus.
    let blocked = Blocked::block(ctx, Duration::ZERO, lost());
    crate::command::admin::rebuild_wide::start(ctx, blocked, &name, sync);
    Ok(RedisValue::NoReply)
}

/// What a REBUILD SYNC caller gets if its rebuild ends without answering it.
fn lost() -> Box<RebuildReply> {
    Box::new(RebuildReply(Err(error::WORKER_LOST.into()), Reply::Rows))
}

/// MEMBER.REBUILD without SYNC, for a client that waited for the catalog: the rebuild started.
struct Started;

impl Completion for Started {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        Ok(RedisValue::SimpleStringStatic("OK"))
    }
}
