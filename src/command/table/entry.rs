//! The hot path's entry points: MEMBER.EXISTS's and MEMBER.MEXISTS's raw command functions
//! (their rows in `mod.rs`), so their arguments are read in place (no retained strings)
//! before the funnel runs. Every other command goes through the generic entry point in
//! `register.rs`; all of them, these too, run inside `reply::guard`. The items of a tokenized
//! set are redacted (`redact`, where the row's `items` says) before the server logs the call.

use std::os::raw::c_int;

use redis_module::{raw, Context};

use crate::command::{batch, lookup};
use crate::hooks::redact::{self, Shape};

/// Longest argument vector read in place: `MEMBER.EXISTS <set> <item> SCOPE <scope>`.
const MAX_ARGS: usize = 5;

/// Where MEMBER.EXISTS's item sits: its row in `mod.rs` says the same (`items`), for the
/// generic readers of the table.
pub const ITEMS: Shape = Shape::Item;
/// Its name as registered (its row's `name`).
pub const NAME: &str = "member.exists";

/// MEMBER.EXISTS's command function.
///
/// # Safety
/// Called by the server on the main thread with a valid context and `argc` arguments.
pub unsafe extern "C" fn entry(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    // A new history of the database is answered before the filter is read (docs/failover.md).
    crate::upkeep::history::react(&context);
    // guard has replied (the answer or a contained panic's error); its NoReply is for wrappers.
    let _ = crate::server::reply::guard(&context, NAME, || {
        let argc = argc.max(0) as usize;
        let fast = if argc <= MAX_ARGS {
            let mut buf: [&[u8]; MAX_ARGS] = [&[]; MAX_ARGS];
            // SAFETY: argv holds argc live strings for the duration of this call.
            let args = unsafe { std::slice::from_raw_parts(argv, argc) };
            // The command's name (argument 0) is never read.
            for (slot, &a) in buf.iter_mut().zip(args).skip(1) {
                let mut len = 0;
                let p = unsafe { raw::RedisModule_StringPtrLen.unwrap()(a, &mut len) };
                *slot = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
            }
            redact::begin();
            let res = lookup::exists_fast(&context, &buf[..argc]);
            if let Some(res) = &res {
                redact::after(&context, ITEMS, &buf[..argc], res.is_err());
            }
            res
        } else {
            None
        };
        fast.unwrap_or_else(|| {
            let args = redis_module::decode_args(ctx, argv, argc as c_int);
            redact::around(&context, ITEMS, args, |args| {
                lookup::lookup(&context, args, false)
            })
        })
    });
    raw::REDISMODULE_OK as c_int
}

/// Where MEMBER.MEXISTS's items sit (its row's `items`).
pub const MANY_ITEMS: Shape = Shape::Many;
/// MEMBER.MEXISTS's name as registered (its row's `name`).
pub const MANY_NAME: &str = "member.mexists";

/// MEMBER.MEXISTS's command function: each argument read once, in place. Through the generic
/// entry point a call of 100 items retained and freed each of its strings, and read each twice
/// (redaction's positions, then the items), before its first probe.
///
/// # Safety
/// Called by the server on the main thread with a valid context and `argc` arguments.
pub unsafe extern "C" fn mexists_entry(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let _ = crate::server::reply::guard(&context, MANY_NAME, || {
        // SAFETY: argv holds argc live strings for the duration of this call.
        let args = unsafe { std::slice::from_raw_parts(argv, argc.max(0) as usize) };
        let args: Vec<&[u8]> = args
            .iter()
            .map(|&a| {
                let mut len = 0;
                let p = unsafe { raw::RedisModule_StringPtrLen.unwrap()(a, &mut len) };
                unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
            })
            .collect();
        redact::begin();
        let res = batch::mexists(&context, &args);
        redact::after(&context, MANY_ITEMS, &args, res.is_err());
        res
    });
    raw::REDISMODULE_OK as c_int
}
