//! Puts the command table (`mod.rs`) into the server at module load: creates every command
//! with its entry point and flags, then declares its COMMAND INFO (`declare.rs`) and puts the
//! public ones into the `@member` ACL category. Owns the generic entry point every command but
//! the hot path runs through.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::{raw, Context, Status};

use crate::command::table::declare;
use crate::command::table::row::{Audience, Run};
use crate::command::table::{self, COMMANDS};
use crate::{hooks::redact, server::reply, sets::acl};

/// Creates every command of the table (firstkey 0: no key until `declare` says otherwise).
/// A command the server refuses fails the load, as the server then lacks part of the module.
pub fn create(ctx: &Context) -> Status {
    for c in COMMANDS {
        let f = match c.run {
            Run::Args(_) => entry,
            Run::Raw(f) => f,
        };
        let (Ok(name), Ok(flags)) = (CString::new(c.name), CString::new(c.flags)) else {
            return Status::Err;
        };
        // SAFETY: module load, main thread, the module's context; both strings are
        // NUL-terminated and the server copies them.
        let rc = unsafe {
            raw::RedisModule_CreateCommand.unwrap()(
                ctx.ctx,
                name.as_ptr(),
                Some(f),
                flags.as_ptr(),
                0,
                0,
                0,
            )
        };
        if rc != raw::REDISMODULE_OK as c_int {
            reply::log(
                ctx,
                reply::Level::Warning,
                &format!("libmember: could not create command {}", c.name),
            );
            return Status::Err;
        }
    }
    Status::Ok
}

/// What the server can be told after the commands exist: arity and routing (COMMAND INFO),
/// and the `@member` ACL category. Failures are logged; none fails the load.
pub fn declare(ctx: &Context) {
    declare::declare(ctx, COMMANDS);
    let public: Vec<&str> = COMMANDS
        .iter()
        .filter(|c| c.audience == Audience::Public)
        .map(|c| c.name)
        .collect();
    acl::declare_category(ctx, &public);
}

/// The command function of every `Run::Args` row: finds the row by the command's name
/// (argv[0]), decodes the arguments, and runs the row's handler inside `reply::guard` (which
/// sends the one reply) and, for commands with items, inside `redact::around`.
///
/// # Safety
/// Called by the server on the main thread with a valid context and `argc` arguments.
unsafe extern "C" fn entry(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let args = redis_module::decode_args(ctx, argv, argc);
    let row = args.first().and_then(|name| table::find(name.as_slice()));
    let Some((row, Run::Args(f))) = row.map(|r| (r, r.run)) else {
        // Only table rows are created with this entry point.
        reply::send_error(&context, crate::model::error::INTERNAL);
        return raw::REDISMODULE_OK as c_int;
    };
    // A change of the database's history a worker just saw is answered before any command
    // reads derived state (docs/failover.md): one atomic load when there is none.
    crate::upkeep::history::react(&context);
    // guard has replied (the answer or a contained panic's error); its NoReply is for wrappers.
    let _ = reply::guard(&context, row.name, || match row.items {
        Some(shape) => redact::around(&context, shape, args, |args| f(&context, args)),
        None => f(&context, args),
    });
    raw::REDISMODULE_OK as c_int
}
