//! The value this process writes into its exact-match keys (`keys::cache_fill`), and the
//! epoch in it that distrusts every entry written before at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The value this process writes into exact-match keys. Entries are trusted only when they
/// carry the current one: an entry restored from an RDB or AOF file may predate a DEL whose
/// invalidation was lost with the process (or came from another node, which fills and
/// invalidates on its own), so after a restart every entry is refilled from the database
/// before it is believed. A random part fixed per process, then the cache epoch in hex.
pub type Nonce = [u8; 48];

/// Bumped by [`distrust_cache`]: entries written before carry an older nonce.
static CACHE_EPOCH: AtomicU64 = AtomicU64::new(0);

/// The value to write now: the process's random part and the current epoch.
pub fn nonce() -> Nonce {
    static BASE: OnceLock<[u8; 32]> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let seed = format!("{t}:{}:{:p}", std::process::id(), &CACHE_EPOCH);
        let hex = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(seed.as_bytes()));
        hex.as_bytes().try_into().expect("32 hex digits")
    });
    let mut n = [0u8; 48];
    n[..32].copy_from_slice(base);
    let epoch = CACHE_EPOCH.load(Ordering::Relaxed);
    for (i, d) in n[32..].iter_mut().enumerate() {
        *d = b"0123456789abcdef"[((epoch >> (60 - 4 * i)) & 0xf) as usize];
    }
    n
}

/// Every exact-match entry written so far is believed no more; they are refilled from the
/// database as lookups need them. For the events that may bring back, all at once, entries
/// a DEL removed (SWAPDB, loading a snapshot), and for a write of another command onto an
/// exact-match key where the module cannot delete it (a replica, loading) or past
/// `foreign_writes`' bound: the bytes are the same as when the module wrote them, so only
/// the event can tell.
pub fn distrust_cache() {
    CACHE_EPOCH.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distrusting_changes_the_nonce_and_only_its_epoch_part() {
        let a = nonce();
        assert_eq!(a, nonce());
        distrust_cache();
        let b = nonce();
        assert_ne!(a, b);
        assert_eq!(a[..32], b[..32]);
    }
}
