//! The nodes of the cluster as this node's server knows them: this node's id, another's
//! address, whether it is up, and the whole list (the cluster-wide commands ask every one).
//! Main thread; the only home of the module API's node queries.

use std::ffi::CString;
use std::os::raw::{c_char, c_int};

use redis_module::{raw, Context};

/// Length of a cluster node id (`REDISMODULE_NODE_ID_LEN`); ids are not NUL-terminated.
pub(super) const NODE_ID_LEN: usize = 40;

/// What the server knows of node `id`: its `ip:port` (what MOVED names) and its flags, or
/// `None` for a node it does not know.
fn info(ctx: &Context, id: &[u8]) -> Option<(String, c_int)> {
    let id = CString::new(id).ok()?;
    // The server copies NET_IP_STR_LEN (46) bytes, NUL included.
    let mut ip = [0 as c_char; 64];
    let (mut port, mut flags): (c_int, c_int) = (0, 0);
    // SAFETY: main thread; a NUL-terminated node id; `ip` holds at least NET_IP_STR_LEN bytes.
    let rc = unsafe {
        raw::RedisModule_GetClusterNodeInfo.unwrap()(
            ctx.ctx,
            id.as_ptr(),
            ip.as_mut_ptr(),
            std::ptr::null_mut(),
            &mut port,
            &mut flags,
        )
    };
    if rc != raw::REDISMODULE_OK as c_int {
        return None;
    }
    // SAFETY: the server wrote a NUL-terminated address into `ip`.
    let ip = unsafe { std::ffi::CStr::from_ptr(ip.as_ptr()) }.to_string_lossy();
    Some((format!("{ip}:{port}"), flags))
}

/// True while the cluster knows node `id` and marks it neither failing nor possibly failing.
pub(super) fn node_up(ctx: &Context, id: &[u8]) -> bool {
    let failing = (raw::REDISMODULE_NODE_PFAIL | raw::REDISMODULE_NODE_FAIL) as c_int;
    info(ctx, id).is_some_and(|(_, flags)| flags & failing == 0)
}

/// `ip:port` of node `id` as the cluster knows it (what MOVED names), else the id itself.
pub fn address(ctx: &Context, id: &str) -> String {
    info(ctx, id.as_bytes()).map_or_else(|| id.to_string(), |(address, _)| address)
}

/// One node of the cluster, as this node sees it now.
pub struct Seen {
    pub id: String,
    /// `ip:port`.
    pub address: String,
    pub primary: bool,
    pub myself: bool,
}

/// Every node this node knows of (itself included), in the server's order.
pub fn nodes(ctx: &Context) -> Vec<Seen> {
    let mut n: usize = 0;
    // SAFETY: main thread; the server returns `n` ids of NODE_ID_LEN bytes each (not
    // NUL-terminated), freed below with the API's own call.
    let list = unsafe { raw::RedisModule_GetClusterNodesList.unwrap()(ctx.ctx, &mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let ids: Vec<String> = (0..n)
        .map(|i| {
            // SAFETY: as above.
            let b = unsafe { std::slice::from_raw_parts((*list.add(i)).cast::<u8>(), NODE_ID_LEN) };
            String::from_utf8_lossy(b).into_owned()
        })
        .collect();
    // SAFETY: the list the server gave, freed once.
    unsafe { raw::RedisModule_FreeClusterNodesList.unwrap()(list) };
    ids.into_iter()
        .filter_map(|id| {
            let (address, flags) = info(ctx, id.as_bytes())?;
            Some(Seen {
                address,
                primary: flags & raw::REDISMODULE_NODE_MASTER as c_int != 0,
                myself: flags & raw::REDISMODULE_NODE_MYSELF as c_int != 0,
                id,
            })
        })
        .collect()
}

/// This node's cluster id.
pub fn my_id() -> String {
    // SAFETY: the server's own id, NODE_ID_LEN bytes, live for the server's life.
    let id = unsafe { raw::RedisModule_GetMyClusterID.unwrap()() };
    if id.is_null() {
        return String::new();
    }
    // SAFETY: as above.
    let b = unsafe { std::slice::from_raw_parts(id.cast::<u8>(), NODE_ID_LEN) };
    String::from_utf8_lossy(b).into_owned()
}
