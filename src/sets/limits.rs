//! Bounded resources: whether a client may wait on the database and how many may, how many
//! sets a node takes from CREATE, how long a rebuild's journal may grow, and how much memory a
//! new filter may claim under `maxmemory`. Each is checked before anything is allocated,
//! answered with an error that names the limit, and shown with its use in `INFO member`.

use std::os::raw::c_int;
use std::sync::atomic::Ordering;

use redis_module::{raw, Context, ContextFlags, RedisError};

use crate::config;

/// The current budget: bytes the server may still allocate before `maxmemory` (`u64::MAX`
/// without a limit), as `refresh_memory_budget` last measured it.
pub use crate::server::transient::memory_budget;

/// Reads `used_memory` and `maxmemory` from the server and stores what is left. Main thread.
pub fn refresh_memory_budget(ctx: &Context) -> u64 {
    // SAFETY: ctx is a live main-thread context; the info object is freed before returning;
    // the field names are NUL-terminated literals.
    let budget = unsafe {
        let info = raw::RedisModule_GetServerInfo.unwrap()(ctx.ctx, c"memory".as_ptr());
        if info.is_null() {
            return memory_budget();
        }
        let mut err: c_int = 0;
        let used = raw::RedisModule_ServerInfoGetFieldUnsigned.unwrap()(
            info,
            c"used_memory".as_ptr(),
            &mut err,
        );
        let used_ok = err == 0;
        let max = raw::RedisModule_ServerInfoGetFieldUnsigned.unwrap()(
            info,
            c"maxmemory".as_ptr(),
            &mut err,
        );
        let max_ok = err == 0;
        raw::RedisModule_FreeServerInfo.unwrap()(ctx.ctx, info);
        match (used_ok, max_ok) {
            (true, true) if max > 0 => max.saturating_sub(used),
            _ => u64::MAX,
        }
    };
    crate::server::transient::measured(budget);
    budget
}

/// Refuses settings whose filter would not fit under `member.max-filter-bytes` (a smaller
/// one would break the promised rate): `members` at `error_rate`. The reason, without the
/// `ERR ` prefix.
pub fn check_filter_size(members: u64, error_rate: f64) -> Result<(), String> {
    crate::filter::check_size(members, error_rate, config::max_filter_bytes())
        .map_err(|e| e.to_string())
}

/// Refuses calls that would need to block where the server forbids it (MULTI/EXEC, Lua,
/// functions), or past `member.max-blocked-clients`.
pub fn may_block(ctx: &Context) -> Result<(), RedisError> {
    if ctx
        .get_flags()
        .intersects(ContextFlags::MULTI | ContextFlags::LUA | ContextFlags::DENY_BLOCKING)
    {
        return Err(RedisError::Str(crate::model::error::NEEDS_BLOCKING));
    }
    admit_blocked()
}

/// Refuses to block one more client on the database past `member.max-blocked-clients`.
pub fn admit_blocked() -> Result<(), RedisError> {
    let max = config::MAX_BLOCKED_CLIENTS.load(Ordering::Relaxed).max(1) as u64;
    if crate::server::block::waiting() >= max {
        return Err(RedisError::String(format!(
            "{} {max} clients already wait on the database (member.max-blocked-clients)",
            crate::model::error::UNAVAILABLE
        )));
    }
    Ok(())
}

/// Refuses a CREATE of a set new to this node past `member.max-sets`.
pub fn admit_set(known: usize) -> Result<(), RedisError> {
    let max = config::MAX_SETS.load(Ordering::Relaxed).max(1) as usize;
    if known >= max {
        return Err(RedisError::String(format!(
            "ERR this node already holds {known} sets (member.max-sets {max})"
        )));
    }
    Ok(())
}

/// Most adds a running rebuild may journal (`member.max-journal`).
pub fn max_journal() -> usize {
    config::MAX_JOURNAL.load(Ordering::Relaxed).max(1) as usize
}
