//! The hot path's entry point: MEMBER.EXISTS registered with the raw command API, so its
//! arguments are read in place (no vector, no retained strings) before the funnel runs.
//! Every other command goes through the `redis_module!` wrappers; all of them, this one too,
//! run inside `reply::guard`. Arity and routing are declared in `command_info`. The item of a
//! tokenized set is redacted (`redact`) before the server logs the call.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::{raw, Context, Status};

use crate::command::lookup;
use crate::hooks::redact::{self, Shape};

/// Longest argument vector read in place: `MEMBER.EXISTS <set> <item> SCOPE <scope>`.
const MAX_ARGS: usize = 5;

/// # Safety
/// Called by the server on the main thread with a valid context and `argc` arguments.
unsafe extern "C" fn exists_cmd(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    // guard has replied (the answer or a contained panic's error); its NoReply is for wrappers.
    let _ = crate::server::reply::guard(&context, "MEMBER.EXISTS", || {
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
                redact::after(&context, Shape::Item, &buf[..argc], res.is_err());
            }
            res
        } else {
            None
        };
        fast.unwrap_or_else(|| {
            let args = redis_module::decode_args(ctx, argv, argc as c_int);
            redact::around(&context, Shape::Item, args, |args| {
                lookup::lookup(&context, args, false)
            })
        })
    });
    raw::REDISMODULE_OK as c_int
}

/// Registers MEMBER.EXISTS. Call from module load.
pub fn register(ctx: &Context) -> Status {
    let name = CString::new("member.exists").unwrap();
    let flags = CString::new("readonly fast").unwrap();
    // SAFETY: called during OnLoad with the module's context.
    let rc = unsafe {
        raw::RedisModule_CreateCommand.unwrap()(
            ctx.ctx,
            name.as_ptr(),
            Some(exists_cmd),
            flags.as_ptr(),
            0,
            0,
            0,
        )
    };
    if rc == raw::REDISMODULE_OK as c_int {
        Status::Ok
    } else {
        Status::Err
    }
}
