//! The cluster-only data type `member-sl` (registered only when the server runs in cluster mode, so
//! standalone RDB files are unchanged). Its RDB aux field carries the node's module-memory
//! filters (`filter/store.rs`), written before the keyspace. Its values are the slot sentinels
//! earlier versions kept, one key `member:{T(s)}:owner` per owned slot `s`: they still load
//! from old datasets, and a primary deletes each one it finds in a slot it accepts
//! (`cluster::owner::poll`). Ownership is now known without a key per slot
//! (docs/cluster-placement.md, "Knowing which slots a node owns").

use std::ffi::CString;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::filter::value::FilterValue;

/// A slot sentinel: nothing but its identity.
#[derive(Debug)]
pub struct Sentinel {
    pub id: u64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Sentinel {
    pub fn new() -> Self {
        Sentinel {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl Default for Sentinel {
    fn default() -> Self {
        Self::new()
    }
}

const ENCVER: i32 = 1;

/// Aux field layout version (filters in module memory).
const AUX_ENCVER: i32 = 1;

pub static SENTINEL_TYPE: RedisType = RedisType::new(
    "member-sl",
    ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        free: Some(free),
        mem_usage: Some(mem_usage),
        digest: None,
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save2: None,
        aux_save_triggers: raw::Aux::Before as i32,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// # Safety
/// `rdb` is the server's IO handle.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, _value: *mut c_void) {
    raw::save_unsigned(rdb, 0);
}

/// # Safety
/// `rdb` is the server's IO handle.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if encver != ENCVER || raw::load_unsigned(rdb).is_err() {
        // SAFETY: rdb is the live handle of this callback.
        unsafe { crate::server::reply::log_io_error(rdb, "libmember: slot sentinel unreadable") };
        return std::ptr::null_mut();
    }
    Box::into_raw(Box::new(Sentinel::new())).cast()
}

/// An AOF rewrite writes a sentinel still in the keyspace (from an earlier version's dataset)
/// as `MEMBER._OWN <key>`, which deletes the key when the AOF loads.
///
/// # Safety
/// `aof` is the server's IO handle, `key` the key name.
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    _value: *mut c_void,
) {
    let cmd = CString::new("MEMBER._OWN").unwrap();
    let fmt = CString::new("s").unwrap();
    // SAFETY: "s" takes one RedisModuleString*.
    unsafe { raw::RedisModule_EmitAOF.unwrap()(aof, cmd.as_ptr(), fmt.as_ptr(), key) };
}

/// # Safety
/// `value` is a `Sentinel` we stored, freed exactly once by the server.
unsafe extern "C" fn free(value: *mut c_void) {
    drop(unsafe { Box::from_raw(value.cast::<Sentinel>()) });
}

unsafe extern "C" fn mem_usage(_value: *const c_void) -> usize {
    std::mem::size_of::<Sentinel>()
}

/// A COPY is a new value, of a new identity.
unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    _value: *const c_void,
) -> *mut c_void {
    Box::into_raw(Box::new(Sentinel::new())).cast()
}

/// Writes every module-memory filter: a count, then (name, payload) pairs.
///
/// # Safety
/// `rdb` is the server's IO handle.
unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    if when != raw::Aux::Before as c_int {
        return;
    }
    crate::filter::store::save_each(
        |n| raw::save_unsigned(rdb, n as u64),
        |name, payload| {
            raw::save_slice(rdb, name);
            raw::save_slice(rdb, payload);
        },
    );
}

/// Reads the filters back into module memory. A payload that does not verify is skipped
/// with a log line (its set rebuilds); a short read fails the load.
///
/// # Safety
/// `rdb` is the server's IO handle.
unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    let err = raw::Status::Err as c_int;
    if encver != AUX_ENCVER {
        // SAFETY: rdb is the live handle of this callback.
        unsafe {
            crate::server::reply::log_io_error(rdb, "libmember: filter aux data of unknown version")
        };
        return err;
    }
    if when != raw::Aux::Before as c_int {
        return raw::Status::Ok as c_int;
    }
    let Ok(n) = raw::load_unsigned(rdb) else {
        return err;
    };
    for _ in 0..n {
        let (Ok(name), Ok(payload)) = (raw::load_string_buffer(rdb), raw::load_string_buffer(rdb))
        else {
            return err;
        };
        match FilterValue::from_bytes(payload.as_ref()) {
            Ok(v) => crate::filter::store::restore(name.as_ref().to_vec(), v),
            Err(e) => {
                // SAFETY: rdb is the live handle of this callback.
                unsafe {
                    crate::server::reply::log_io_error(rdb, &format!("libmember: {e} (skipped)"))
                };
            }
        }
    }
    raw::Status::Ok as c_int
}
