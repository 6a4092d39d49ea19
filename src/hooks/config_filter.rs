//! The one room of the command filter: it takes the passwords of member.pg-url and
//! member.pg-rebuild-url out of CONFIG SET's arguments before the server records them
//! (SLOWLOG, MONITOR, crash reports' argv), tells `acl::cache` before a command that may
//! change ACL rules runs, and tells `cluster::owner` before a `CLUSTER` command that may give
//! this node a slot runs (`model::slot_change`).
//!
//! The server's own redaction of SENSITIVE configs does not reach module configs (Valkey 8.0,
//! Redis 7.0: the value shows in SLOWLOG), and a config's setter has no client to redact
//! from. So the filter replaces the value with its masked form and hands the password to
//! `pg_link` (the setter, which runs next, takes it back).

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context};

use crate::config::conninfo::{ConnInfo, MASK};
use crate::config::pg_link::{self, UNREADABLE};
use crate::model::slot_change::SlotChange;

/// Registers the filter (module load).
pub fn register(ctx: &Context) {
    // SAFETY: the module context of OnLoad; the callback is a plain extern "C" fn.
    unsafe {
        if let Some(f) = raw::RedisModule_RegisterCommandFilter {
            f(ctx.ctx, Some(filter), 0);
        }
    }
}

/// # Safety
/// Called by the server on the main thread with a live filter context, before every command.
unsafe extern "C" fn filter(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // A panic must not cross into the server; the command then runs unfiltered.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded from the server's call.
        unsafe { run(fctx) }
    }));
}

/// # Safety
/// As [`filter`].
unsafe fn run(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // SAFETY: fctx is live for this call; the arguments it returns live as long.
    let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.unwrap()(fctx) };
    let arg = |i: c_int| -> &[u8] {
        // SAFETY: 0 <= i < argc; the string outlives this call.
        unsafe {
            let s = raw::RedisModule_CommandFilterArgGet.unwrap()(fctx, i);
            let mut len = 0;
            let p = raw::RedisModule_StringPtrLen.unwrap()(s, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    };
    let name = if argc >= 1 { arg(0) } else { &[][..] };
    if crate::sets::acl::cache::changes_rules(name) {
        crate::sets::acl::cache::rules_may_change();
    }
    // A command that may give this node a slot: the node must stop believing its filter for a
    // slot leaving before the migration's first ASK, and accept afresh any slot that may come
    // to it (cluster::owner). On a replica this runs as the primary's replicated SETSLOT
    // arrives.
    if argc >= 2 && name.eq_ignore_ascii_case(b"cluster") {
        let args: Vec<&[u8]> = (0..argc).map(arg).collect();
        match crate::model::slot_change::slot_change(&args) {
            Some(SlotChange::Migrating { slot, timeout_ms }) => {
                crate::cluster::owner::setslot_migrating(slot, timeout_ms);
                crate::cluster::owner::unaccept(Some(&[(slot, slot)]));
            }
            Some(SlotChange::Slots(ranges)) => crate::cluster::owner::unaccept(Some(&ranges)),
            None => {}
        }
    }
    if argc < 4 || !name.eq_ignore_ascii_case(b"config") || !arg(1).eq_ignore_ascii_case(b"set") {
        pg_link::stash_clear();
        return;
    }
    let mut stash = Vec::new();
    for i in (2..argc - 1).step_by(2) {
        let Some(name) = pg_link::NAMES
            .into_iter()
            .find(|n| arg(i).eq_ignore_ascii_case(n.as_bytes()))
        else {
            continue;
        };
        // A value too long for the config is not read: the setter refuses it (had its password
        // been taken out, the rest might have fit, and the password been kept at any size).
        let value = arg(i + 1);
        if value.len() > crate::config::text::MAX_TEXT {
            stash.push((name, Err(crate::config::text::TOO_LONG)));
            // SAFETY: fctx is live; i + 1 < argc.
            unsafe { replace(fctx, i + 1, UNREADABLE) };
            continue;
        }
        let shown = match std::str::from_utf8(value).map(ConnInfo::parse) {
            Ok(Ok(info)) => match info.password() {
                None | Some(MASK) => continue,
                Some(p) => {
                    stash.push((name, Ok(p.to_string())));
                    info.masked()
                }
            },
            Ok(Err(e)) => {
                stash.push((name, Err(e)));
                UNREADABLE.to_string()
            }
            Err(_) => {
                stash.push((name, Err("not UTF-8")));
                UNREADABLE.to_string()
            }
        };
        // SAFETY: fctx is live; i + 1 < argc.
        unsafe { replace(fctx, i + 1, &shown) };
    }
    pg_link::stash(stash);
}

/// Replaces argument `i` of the filtered command with `text`.
///
/// # Safety
/// As [`filter`]; `i` is below the argument count.
unsafe fn replace(fctx: *mut raw::RedisModuleCommandFilterCtx, i: c_int, text: &str) {
    // SAFETY: a new string without a context, owned by the server from here on.
    unsafe {
        let s = raw::RedisModule_CreateString.unwrap()(
            std::ptr::null_mut(),
            text.as_ptr().cast(),
            text.len(),
        );
        raw::RedisModule_CommandFilterArgReplace.unwrap()(fctx, i, s);
    }
}
