//! The one place text leaves the module: replies, log lines and contained panics. Anything
//! that may carry a client's bytes is escaped to printable ASCII here, and every command entry
//! point runs inside `guard`, so no input can panic across the FFI boundary.
//!
//! Why not the crate's helpers: `redis-module` 2.0.8 turns reply text into a C string by
//! casting each `char` to a byte (U+0100 becomes NUL and its `unwrap` aborts the server; `é`
//! becomes the lone byte 0xE9), and its logging passes the message as a printf format.

use std::ffi::CString;
use std::fmt::Write;
use std::os::raw::{c_char, c_long};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context, RedisError, RedisResult, RedisValue};

use crate::model::error;

/// Longest client-supplied text echoed in an error, in input bytes; the rest is cut with `...`.
pub const ECHO_MAX: usize = 64;

/// `bytes` as printable ASCII: printable ASCII stays (a backslash doubles), a valid UTF-8
/// character beyond ASCII becomes `\u{…}`, any other byte `\xNN`. At most `ECHO_MAX` input
/// bytes are shown. The result is always valid UTF-8, without NUL, CR or LF.
pub fn escape(bytes: &[u8]) -> String {
    let (shown, cut) = if bytes.len() > ECHO_MAX {
        (&bytes[..ECHO_MAX], true)
    } else {
        (bytes, false)
    };
    let mut out = String::with_capacity(shown.len() + 8);
    for chunk in shown.utf8_chunks() {
        escape_str_into(&mut out, chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if cut {
        out.push_str("...");
    }
    out
}

fn escape_str_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if c.is_ascii() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
}

/// Text the module composed (which may embed a database message or an item) made safe for a
/// RESP simple string or error line, or a log line: CR and LF become spaces, other control
/// and non-ASCII characters are escaped as in `escape` (backslashes kept as they are, so text
/// already escaped is unchanged).
pub fn line(s: &str) -> CString {
    // No NUL can be left: every control character was escaped by `printable`.
    CString::new(printable(s)).unwrap_or_default()
}

/// `line` as a `String`: printable ASCII only, never a NUL, CR or LF (for text the server
/// turns into a C string itself: INFO fields, a config setter's refusal).
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\r' | '\n' => out.push(' '),
            ' '..='~' => out.push(c),
            c if c.is_ascii() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    out
}

/// Sends `result` to the client, with every text escaped by `line`. Values the crate writes
/// without a C string conversion (integers, bulk strings) go through it unchanged.
pub fn send(ctx: &Context, result: RedisResult) {
    match result {
        Ok(v) => send_value(ctx, v),
        Err(RedisError::WrongArity) => {
            // SAFETY: ctx is the live context of a command or reply callback.
            unsafe { raw::RedisModule_WrongArity.unwrap()(ctx.ctx) };
        }
        Err(RedisError::WrongType) => send_error(ctx, &RedisError::WrongType.to_string()),
        Err(RedisError::String(s)) => send_error(ctx, &s),
        Err(RedisError::Str(s)) => send_error(ctx, s),
    }
}

/// Sends one error line (escaped).
pub fn send_error(ctx: &Context, msg: &str) {
    let msg = line(msg);
    // SAFETY: ctx is live; msg is a NUL-terminated string that outlives the call.
    unsafe { raw::RedisModule_ReplyWithError.unwrap()(ctx.ctx, msg.as_ptr()) };
}

fn send_value(ctx: &Context, v: RedisValue) {
    match v {
        RedisValue::SimpleStringStatic(s) => send_simple(ctx, s),
        RedisValue::SimpleString(s) => send_simple(ctx, &s),
        RedisValue::StaticError(s) => send_error(ctx, s),
        RedisValue::Array(items) => {
            // SAFETY: ctx is live; the array's elements follow.
            unsafe { raw::RedisModule_ReplyWithArray.unwrap()(ctx.ctx, items.len() as c_long) };
            for item in items {
                send_value(ctx, item);
            }
        }
        RedisValue::NoReply => {}
        // Integers, bulk strings and the like carry lengths, not C strings.
        other => {
            ctx.reply(Ok(other));
        }
    }
}

fn send_simple(ctx: &Context, s: &str) {
    let s = line(s);
    // SAFETY: ctx is live; s is a NUL-terminated string that outlives the call.
    unsafe { raw::RedisModule_ReplyWithSimpleString.unwrap()(ctx.ctx, s.as_ptr()) };
}

/// Runs a command handler (`name`: the command, in any case) with panics contained: the client gets exactly one reply (the
/// handler's, escaped, or `error::INTERNAL`), and the server keeps running. Returns `NoReply`
/// for the crate's command wrapper, which then sends nothing itself.
pub fn guard(ctx: &Context, name: &str, f: impl FnOnce() -> RedisResult) -> RedisResult {
    let result = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log(
            ctx,
            Level::Warning,
            &format!(
                "libmember: internal error in {} (contained)",
                name.to_ascii_uppercase()
            ),
        );
        Err(RedisError::Str(error::INTERNAL))
    });
    send(ctx, result);
    Ok(RedisValue::NoReply)
}

/// Log levels the server knows.
#[derive(Clone, Copy, Debug)]
pub enum Level {
    Notice,
    Warning,
}

impl Level {
    fn name(self) -> &'static [u8] {
        match self {
            Level::Notice => b"notice\0",
            Level::Warning => b"warning\0",
        }
    }
}

/// Writes one line to the server log, escaped, never interpreted as a printf format.
pub fn log(ctx: &Context, level: Level, msg: &str) {
    let msg = line(msg);
    // SAFETY: the level and "%s" are NUL-terminated literals; msg outlives the call.
    unsafe {
        raw::RedisModule_Log.unwrap()(
            ctx.ctx,
            level.name().as_ptr().cast::<c_char>(),
            c"%s".as_ptr(),
            msg.as_ptr(),
        )
    };
}

/// Reports a load error on an RDB handle (fails the load), escaped and not a printf format.
///
/// # Safety
/// `io` is the live IO handle the server passed to the data type callback.
pub unsafe fn log_io_error(io: *mut raw::RedisModuleIO, msg: &str) {
    let msg = line(msg);
    // SAFETY: io is the server's live IO handle; the strings outlive the call.
    unsafe {
        raw::RedisModule_LogIOError.unwrap()(
            io,
            Level::Warning.name().as_ptr().cast::<c_char>(),
            c"%s".as_ptr(),
            msg.as_ptr(),
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_keeps_printable_ascii() {
        assert_eq!(escape(b"SCOPE x-1_"), "SCOPE x-1_");
        assert_eq!(escape(b"a\\b"), "a\\\\b");
    }

    #[test]
    fn escape_turns_everything_else_into_ascii() {
        assert_eq!(escape("Ā".as_bytes()), "\\u{100}");
        assert_eq!(escape("😀".as_bytes()), "\\u{1f600}");
        assert_eq!(escape("é".as_bytes()), "\\u{e9}");
        assert_eq!(escape(b"\0\r\n\x7f"), "\\x00\\x0d\\x0a\\x7f");
        assert_eq!(escape(b"\xff\xfeok"), "\\xff\\xfeok");
    }

    #[test]
    fn escape_cuts_long_input() {
        let long = vec![b'a'; 1000];
        let e = escape(&long);
        assert_eq!(e.len(), ECHO_MAX + 3);
        assert!(e.ends_with("..."));
    }

    #[test]
    fn line_never_holds_nul_or_newlines() {
        for s in ["a\0b", "x\r\ny", "Ā܀😀", "100% %s %n"] {
            let c = line(s);
            let b = c.as_bytes();
            assert!(
                b.iter().all(|&x| (b' '..=b'~').contains(&x)),
                "{s:?} -> {c:?}"
            );
        }
        assert_eq!(line("ERR a\nb").to_str().unwrap(), "ERR a b");
        assert_eq!(line("it's \\x41").to_str().unwrap(), "it's \\x41");
    }

    #[test]
    fn every_code_point_ending_in_zero_is_escaped() {
        for cp in (0x100u32..0x11_0000).step_by(0x100) {
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            let s = c.to_string();
            assert!(!escape(s.as_bytes()).contains('\0'));
            assert!(!line(&s).as_bytes().contains(&0));
        }
    }
}
