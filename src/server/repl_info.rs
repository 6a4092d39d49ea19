//! What the server's `INFO replication` says of this node's link, read through the module
//! API (no command call): the replication id it shares with its primary, which tells a
//! partial resynchronization with the same primary from a new one.

use std::ffi::CStr;

use redis_module::{raw, Context};

/// `master_replid`: the replication id this node follows (a replica's is its primary's once
/// synchronized). `None` when the server does not say. Main thread.
pub fn replid(ctx: &Context) -> Option<String> {
    // SAFETY: ctx is a live main-thread context; the info object is freed before returning;
    // the field name is a NUL-terminated literal; the field's C string belongs to the info
    // object and is copied out before it is freed.
    unsafe {
        let info = raw::RedisModule_GetServerInfo.unwrap()(ctx.ctx, c"replication".as_ptr());
        if info.is_null() {
            return None;
        }
        let field = raw::RedisModule_ServerInfoGetFieldC.unwrap()(info, c"master_replid".as_ptr());
        let id = (!field.is_null()).then(|| CStr::from_ptr(field).to_string_lossy().into_owned());
        raw::RedisModule_FreeServerInfo.unwrap()(ctx.ctx, info);
        id.filter(|s| !s.is_empty())
    }
}
