//! What the server's `INFO` says of this node, read through the module API (no command
//! call): the replication id it shares with its primary, which tells a partial
//! resynchronization with the same primary from a new one; its run id and port, which name it
//! in the reports every node writes to the database.

use std::ffi::CStr;

use redis_module::{raw, Context};

/// The text of `field` in the `INFO` section `section`, `None` when the server does not say
/// or says nothing. Main thread.
fn info_field(ctx: &Context, section: &CStr, field: &CStr) -> Option<String> {
    // SAFETY: ctx is a live main-thread context; the info object is freed before returning;
    // section and field are NUL-terminated; the field's C string belongs to the info object
    // and is copied out before it is freed.
    unsafe {
        let info = raw::RedisModule_GetServerInfo.unwrap()(ctx.ctx, section.as_ptr());
        if info.is_null() {
            return None;
        }
        let value = raw::RedisModule_ServerInfoGetFieldC.unwrap()(info, field.as_ptr());
        let text = (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned());
        raw::RedisModule_FreeServerInfo.unwrap()(ctx.ctx, info);
        text.filter(|s| !s.is_empty())
    }
}

/// `master_replid`: the replication id this node follows (a replica's is its primary's once
/// synchronized). `None` when the server does not say. Main thread.
pub fn replid(ctx: &Context) -> Option<String> {
    info_field(ctx, c"replication", c"master_replid")
}

/// `run_id`: this server process's id, new at every start. Main thread.
pub fn run_id(ctx: &Context) -> Option<String> {
    info_field(ctx, c"server", c"run_id")
}

/// `tcp_port`: the port this server listens on (0 when it listens on none). Main thread.
pub fn tcp_port(ctx: &Context) -> Option<i32> {
    info_field(ctx, c"server", c"tcp_port").and_then(|p| p.parse().ok())
}
