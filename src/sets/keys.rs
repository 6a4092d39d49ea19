//! The Valkey keys libmember owns, all under the reserved prefix `member:` in DB 0: the filter
//! `member:<set>:bloom` and the exact-match entries `member:<set>:hit:<entity>\0<scope>`
//! (in cluster mode `member:{<tag>}:<set>:hit:<entity>\0<scope>`, in the item's slot).

use std::time::Duration;

use redis_module::{Context, RedisString};

use super::cache_epoch::nonce;
use crate::model::canon::Canon;
use crate::model::slot;
/// Runs `f` with DB 0 selected (see `mainq::with_db0`).
pub use crate::server::mainq::with_db0;

/// Name of a set's filter key.
pub fn filter_key(set: &str) -> RedisString {
    RedisString::create(None, filter_key_name(set))
}

/// The text of [`filter_key`]: `member:<set>:bloom`.
pub fn filter_key_name(set: &str) -> String {
    format!("member:{set}:bloom")
}

/// Every key libmember owns starts with this.
const ROOT: &[u8] = b"member:";

/// Prefix of a set's exact-match keys in standalone mode, `member:<set>:hit:` (the set part
/// of their names in cluster mode, see [`cache_key_bytes`]).
pub fn cache_prefix(set: &str) -> Vec<u8> {
    format!("member:{set}:hit:").into_bytes()
}

/// Name of one membership's exact-match key (see [`cache_key_bytes`]).
pub fn cache_key(ctx: &Context, prefix: &[u8], canon: &Canon) -> RedisString {
    let k = cache_key_bytes(prefix, canon, cluster_mode(ctx));
    RedisString::create_from_slice(ctx.ctx, &k)
}

/// Name of one membership's exact-match key, from the set's [`cache_prefix`]:
/// `member:<set>:hit:<entity>\0<scope>` standalone. In a cluster, `member:{<tag>}:<set>:hit:…`
/// where `<tag>` is the short tag of the canonical entity's slot (the scope takes no part, as
/// clients route by the item alone): the entry lives in the slot of the item it is about, on
/// the node that answers for that item, and migrates with it when the slot is resharded.
pub fn cache_key_bytes(prefix: &[u8], canon: &Canon, in_cluster: bool) -> Vec<u8> {
    let tag = in_cluster.then(|| slot::tag_for_slot(slot::keyslot(canon.entity.as_bytes())));
    let tagged = tag.map_or(0, |t| t.len() + 3);
    let mut k =
        Vec::with_capacity(prefix.len() + tagged + canon.entity.len() + 1 + canon.scope.len());
    match (tag, prefix.strip_prefix(ROOT)) {
        (Some(tag), Some(rest)) => {
            k.extend_from_slice(ROOT);
            k.push(b'{');
            k.extend_from_slice(tag.as_bytes());
            k.extend_from_slice(b"}:");
            k.extend_from_slice(rest);
        }
        _ => k.extend_from_slice(prefix),
    }
    k.extend_from_slice(canon.entity.as_bytes());
    k.push(0);
    k.extend_from_slice(canon.scope.as_bytes());
    k
}

/// True when the server runs in cluster mode (fixed at start-up, so read once).
fn cluster_mode(_ctx: &Context) -> bool {
    crate::server::cluster_mode::enabled()
}

/// True when `key` names an exact-match entry, standalone (`member:<set>:hit:…`) or cluster
/// form (`member:{<tag>}:<set>:hit:…`).
pub fn is_cache_key(key: &[u8]) -> bool {
    let Some(mut rest) = key.strip_prefix(ROOT) else {
        return false;
    };
    if let Some(tagged) = rest.strip_prefix(b"{") {
        let Some(close) = tagged.iter().position(|b| *b == b'}') else {
            return false;
        };
        let Some(after) = tagged[close + 1..].strip_prefix(b":") else {
            return false;
        };
        if close == 0 {
            return false;
        }
        rest = after;
    }
    rest.iter()
        .position(|b| *b == b':')
        .is_some_and(|i| rest[i..].starts_with(b":hit:"))
}

/// The value the exact-match keys of one incarnation of a set hold in this process now: the
/// nonce (process and cache epoch), `:`, the incarnation in hex. A set dropped and created
/// again under the same name starts a new incarnation, so the old one's entries (left to
/// expire by their TTL, never scanned for) are not believed.
type Tag = [u8; 65];

fn tag(incarnation: u64) -> Tag {
    let mut t = [0u8; 65];
    t[..48].copy_from_slice(&nonce());
    t[48] = b':';
    for (i, d) in t[49..].iter_mut().enumerate() {
        *d = b"0123456789abcdef"[((incarnation >> (60 - 4 * i)) & 0xf) as usize];
    }
    t
}

/// True when this process cached a confirmed membership there for this incarnation of the set
/// since the cache was last distrusted (an expired entry, one written by an earlier process or
/// incarnation, or one another command wrote since, counts as absent).
pub fn cache_hit(ctx: &Context, key: &RedisString, incarnation: u64) -> bool {
    matches!(ctx.open_key(key).read(), Ok(Some(v)) if v == tag(incarnation).as_slice())
        && !crate::sets::foreign_writes::untrusted(key.as_slice())
}

/// Caches a confirmed membership for `ttl`, for this incarnation of the set.
pub fn cache_fill(ctx: &Context, key: &RedisString, incarnation: u64, ttl: Duration) {
    let t = tag(incarnation);
    let Ok(value) = std::str::from_utf8(&t) else {
        return; // hex digits and ':' only: cannot happen
    };
    let k = ctx.open_key_writable(key);
    if k.write(value).is_ok() {
        let _ = k.set_expire(ttl);
    }
    crate::sets::foreign_writes::rewritten(key.as_slice());
}

/// Drops a cached membership (after any ADD or DEL of it).
pub fn cache_invalidate(ctx: &Context, key: &RedisString) {
    let k = ctx.open_key_writable(key);
    if !k.is_empty() {
        let _ = k.delete();
    }
    crate::sets::foreign_writes::rewritten(key.as_slice());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_are_recognized() {
        assert!(is_cache_key(b"member:s:hit:alice\0"));
        assert!(is_cache_key(b"member:a_1:hit:"));
        assert!(!is_cache_key(b"member:s:bloom"));
        assert!(!is_cache_key(b"member:s:bloom:hit:x"));
        assert!(!is_cache_key(b"hits_saved"));
        assert!(!is_cache_key(b"member:"));
        // Cluster form.
        assert!(is_cache_key(b"member:{a1}:s:hit:alice\0"));
        assert!(is_cache_key(b"member:{Zz9}:a_1:hit:"));
        assert!(!is_cache_key(b"member:{a1}:s:bloom"));
        assert!(!is_cache_key(b"member:{}:s:hit:x"));
        assert!(!is_cache_key(b"member:{a1:s:hit:x"));
        assert!(!is_cache_key(b"member:{a1}s:hit:x"));
    }

    fn canon<'a>(entity: &'a str, scope: &'a str) -> Canon<'a> {
        Canon {
            entity: std::borrow::Cow::Borrowed(entity),
            scope,
            hash: 0,
        }
    }

    #[test]
    fn standalone_cache_keys_keep_their_names() {
        let p = cache_prefix("s");
        assert_eq!(
            cache_key_bytes(&p, &canon("alice", ""), false),
            b"member:s:hit:alice\0"
        );
        assert_eq!(
            cache_key_bytes(&p, &canon("a", "m1"), false),
            b"member:s:hit:a\0m1"
        );
    }

    #[test]
    fn cluster_cache_keys_live_in_the_slot_of_their_entity() {
        let p = cache_prefix("s");
        for (entity, scope) in [
            ("alice", ""),
            ("alice", "merchant-7"),
            ("{user1000}.following", ""),
            ("}{", "x"),
            ("{}", ""),
            ("ünïcödé", ""),
        ] {
            let k = cache_key_bytes(&p, &canon(entity, scope), true);
            let want = slot::keyslot(entity.as_bytes());
            assert_eq!(slot::keyslot(&k), want, "{entity:?}");
            let tag = slot::tag_for_slot(want);
            let name = format!("member:{{{tag}}}:s:hit:{entity}\0{scope}").into_bytes();
            assert_eq!(k, name);
            assert!(is_cache_key(&k));
        }
    }
}
