//! The filter as a Valkey data type (`member-bf`): RDB save/load and AOF rewrite of the
//! versioned form (`value.rs`, `bloom/format.rs`), MEMORY USAGE, DEBUG DIGEST-VALUE, COPY and
//! free, and the generation that tells when a filter key may have changed.

use std::ffi::CString;
use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::filter::value::FilterValue;

/// RDB encoding version of the type (the payload carries its own format version as well).
/// 2: the payload opens with its origin envelope (`filter_origin`). Version 1 values (no
/// envelope) still load, of unknown origin; a build that reads only 1 refuses a 2 with its
/// own clear message instead of failing inside the payload.
const ENCVER: i32 = 2;
/// The oldest encoding version this build loads.
const ENCVER_OLDEST: i32 = 1;

pub static FILTER_TYPE: RedisType = RedisType::new(
    "member-bf",
    ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        free: Some(free),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: Some(free_effort),
        unlink: Some(unlink),
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// Filters at least this large are freed on a thread of their own.
pub const FREE_LATER_BYTES: usize = 1 << 20;

/// Drops `old` here when small, else on a short-lived thread (the allocator is thread-safe).
pub fn free_later(old: Box<FilterValue>) {
    if old.bloom.bytes() < FREE_LATER_BYTES {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("member-free".into())
        .spawn(move || drop(old));
}

/// The server's lazy-free threshold counts allocations; a filter is one large block, so its
/// effort is given in 4 KiB pages: anything over 256 KiB is freed by UNLINK, FLUSHALL ASYNC,
/// lazy expiry and eviction on the lazy-free thread instead of the main one.
///
/// # Safety
/// `value` is a `FilterValue` we stored.
unsafe extern "C" fn free_effort(_key: *mut raw::RedisModuleString, value: *const c_void) -> usize {
    let v = unsafe { &*value.cast::<FilterValue>() };
    (v.bloom.bytes() + v.known_absent.bytes()) / 4096 + 1
}

/// # Safety
/// `value` is a `FilterValue` we stored; `rdb` is the server's IO handle.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let v = unsafe { &*value.cast::<FilterValue>() };
    raw::save_slice(rdb, &v.to_bytes());
}

/// Rewrites the filter as one `MEMBER._LOAD <key> <payload>` command.
///
/// # Safety
/// `aof` is the server's IO handle, `key` the key name, `value` a `FilterValue` we stored.
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let v = unsafe { &*value.cast::<FilterValue>() };
    let bytes = v.to_bytes();
    let cmd = CString::new("MEMBER._LOAD").unwrap();
    let fmt = CString::new("sb").unwrap();
    // SAFETY: "sb" takes a RedisModuleString* and a (char*, size_t) buffer.
    unsafe {
        raw::RedisModule_EmitAOF.unwrap()(
            aof,
            cmd.as_ptr(),
            fmt.as_ptr(),
            key,
            bytes.as_ptr().cast::<std::os::raw::c_char>(),
            bytes.len(),
        )
    };
}

/// A payload that cannot be verified fails the load with a log line; it never crashes.
/// A loaded filter (RDB, RESTORE, a replica's full sync) keeps its completeness and
/// watermark but is a new value no set trusts: rows may have landed in PostgreSQL after the
/// snapshot, so it answers "absent" only after the sync loop has read everything since its
/// watermark.
///
/// # Safety
/// `rdb` is the server's IO handle.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if !(ENCVER_OLDEST..=ENCVER).contains(&encver) {
        let msg = format!("libmember: filter encoding version {encver} is not supported");
        // SAFETY: rdb is the live handle of this callback.
        unsafe { crate::server::reply::log_io_error(rdb, &msg) };
        return std::ptr::null_mut();
    }
    let buf = match raw::load_string_buffer(rdb) {
        Ok(b) => b,
        Err(_) => {
            // SAFETY: rdb is the live handle of this callback.
            unsafe {
                crate::server::reply::log_io_error(rdb, "libmember: filter payload unreadable")
            };
            return std::ptr::null_mut();
        }
    };
    match FilterValue::from_bytes(buf.as_ref()) {
        Ok(v) => Box::into_raw(Box::new(v)).cast(),
        Err(e) => {
            // SAFETY: rdb is the live handle of this callback.
            unsafe { crate::server::reply::log_io_error(rdb, &format!("libmember: {e}")) };
            std::ptr::null_mut()
        }
    }
}

/// Changes whenever a filter key may have been deleted, overwritten, moved or replaced: the
/// filter type's `unlink` callback (which Valkey 8 and Redis 7.0 call for every delete,
/// expiry, eviction, RENAME, MOVE and overwrite of a key, before the value can be freed), the
/// FlushDB, SwapDB and Loading events (which replace a whole keyspace without a callback per
/// key) and `filter_store`'s own installs. A pointer remembered under an older generation is
/// never followed.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Called wherever a filter key may have changed (see `GENERATION`). Any thread.
pub fn keys_changed() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The current generation (see `GENERATION`).
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// A filter key was deleted, expired, evicted, renamed, moved or overwritten: pointers to
/// filter values remembered by sets are no longer followed (`store::Remembered`).
unsafe extern "C" fn unlink(_key: *mut raw::RedisModuleString, _value: *const c_void) {
    keys_changed();
}

/// # Safety
/// `value` is a `FilterValue` we stored, freed exactly once by the server.
unsafe extern "C" fn free(value: *mut c_void) {
    drop(unsafe { Box::from_raw(value.cast::<FilterValue>()) });
}

/// # Safety
/// `value` is a `FilterValue` we stored.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    let v = unsafe { &*value.cast::<FilterValue>() };
    v.bloom.bytes() + v.known_absent.bytes()
}

/// # Safety
/// `value` is a `FilterValue` we stored; `md` is the server's digest handle.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    let v = unsafe { &*value.cast::<FilterValue>() };
    let mut bytes = v.to_bytes();
    unsafe {
        raw::RedisModule_DigestAddStringBuffer.unwrap()(md, bytes.as_mut_ptr().cast(), bytes.len());
        raw::RedisModule_DigestEndSequence.unwrap()(md);
    }
}

/// # Safety
/// `value` is a `FilterValue` we stored.
unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    let v = unsafe { &*value.cast::<FilterValue>() };
    Box::into_raw(Box::new(v.clone())).cast()
}
