//! The Valkey keys libmember owns, all under the reserved prefix `member:` in DB 0:
//! the filter `member:<set>:bloom` and the exact-match entries `member:<set>:hit:<entity>\0<scope>`.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_module::{raw, Context, RedisString};

use crate::canon::Canon;

/// Name of a set's filter key.
pub fn filter_key(set: &str) -> RedisString {
    RedisString::create(None, format!("member:{set}:bloom"))
}

/// Prefix of a set's exact-match keys.
pub fn cache_prefix(set: &str) -> Vec<u8> {
    format!("member:{set}:hit:").into_bytes()
}

/// Name of one membership's exact-match key.
pub fn cache_key(ctx: &Context, prefix: &[u8], canon: &Canon) -> RedisString {
    let mut k = Vec::with_capacity(prefix.len() + canon.entity.len() + 1 + canon.scope.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(&canon.key_bytes());
    RedisString::create_from_slice(ctx.ctx, &k)
}

/// The value this process writes into exact-match keys. Entries are trusted only when they
/// carry it: an entry restored from an RDB or AOF file may predate a DEL whose invalidation
/// was lost with the process (or came from another node, which fills and invalidates on its
/// own), so after a restart every entry is refilled from the database before it is believed.
fn boot_nonce() -> &'static str {
    static NONCE: OnceLock<String> = OnceLock::new();
    NONCE.get_or_init(|| {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let seed = format!("{t}:{}:{:p}", std::process::id(), &NONCE);
        format!("{:032x}", xxhash_rust::xxh3::xxh3_128(seed.as_bytes()))
    })
}

/// The value of the exact-match keys of one incarnation of a set in this process: the process's
/// nonce and the incarnation. A set dropped and created again under the same name starts a new
/// incarnation, so the old one's entries (left to expire by their TTL, never scanned for) are
/// not believed.
pub fn cache_tag(incarnation: u64) -> String {
    format!("{}:{incarnation:x}", boot_nonce())
}

/// True when this process cached a confirmed membership there for the set incarnation whose
/// tag is `tag` (an expired entry, or one written by an earlier process or incarnation, counts
/// as absent).
pub fn cache_hit(ctx: &Context, key: &RedisString, tag: &str) -> bool {
    matches!(ctx.open_key(key).read(), Ok(Some(v)) if v == tag.as_bytes())
}

/// Caches a confirmed membership for `ttl`, for the set incarnation whose tag is `tag`.
pub fn cache_fill(ctx: &Context, key: &RedisString, tag: &str, ttl: Duration) {
    let k = ctx.open_key_writable(key);
    if k.write(tag).is_ok() {
        let _ = k.set_expire(ttl);
    }
}

/// Drops a cached membership (after any ADD or DEL of it).
pub fn cache_invalidate(ctx: &Context, key: &RedisString) {
    let k = ctx.open_key_writable(key);
    if !k.is_empty() {
        let _ = k.delete();
    }
}

/// Runs `f` with DB 0 selected, restoring the caller's DB afterwards: libmember's keys live in
/// DB 0 whatever database the client has selected.
pub fn with_db0<R>(ctx: &Context, f: impl FnOnce(&Context) -> R) -> R {
    /// Puts the client's own DB back however `f` ends (a panic contained further up must
    /// not leave the client in DB 0).
    struct Restore<'a>(&'a Context, i32);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            if self.1 != 0 {
                // SAFETY: the same live context, on the main thread.
                unsafe { raw::RedisModule_SelectDb.unwrap()(self.0.ctx, self.1) };
            }
        }
    }
    // SAFETY: ctx is a live context with a client (command, reply callback or timer).
    let current = unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx.ctx) };
    if current != 0 {
        unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.ctx, 0) };
    }
    let _restore = Restore(ctx, current);
    f(ctx)
}
