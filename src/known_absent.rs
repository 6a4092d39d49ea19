//! Confirmed false positives: items the filter lets through but the database has just said
//! are not members. A hot false positive (a card number checked on every payment, a name
//! re-checked at each keystroke) would otherwise cost a database round trip every time,
//! forever: the same bits stay set until a rebuild.
//!
//! An entry lives inside the filter value it complements, so it can never outlive that
//! filter (a rebuild, a load or a FLUSHALL starts empty). It is dropped the moment the item
//! is added to that filter (MEMBER.ADD, a replicated ADD, the sync loop reading an outside
//! write), and in any case after the set's CACHE-TTL. Pure data: no server calls.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

/// Item hashes are already uniformly random: hashing them again is wasted work.
#[derive(Default)]
pub struct TakeLow64(u64);

impl Hasher for TakeLow64 {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for non-u128 keys (none here); fold the bytes in anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// Item hash → when the database's "absent" stops being trusted.
#[derive(Clone, Debug, Default)]
pub struct KnownAbsent {
    until: HashMap<u128, Instant, BuildHasherDefault<TakeLow64>>,
    /// When a full map may next be swept for expired entries (a sweep is O(entries), so at
    /// most once a second, however many inserts find it full).
    next_sweep: Option<Instant>,
}

/// How often a full map is swept for expired entries.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl KnownAbsent {
    /// True when the database said `hash` is absent and nothing has added it since.
    #[inline]
    pub fn contains(&self, hash: u128, now: Instant) -> bool {
        !self.is_empty() && self.until.get(&hash).is_some_and(|&t| now < t)
    }

    /// Remembers `hash` as absent until `until`, holding at most `cap` entries (0 disables).
    /// When full: expired entries go (swept at most once a second), else an arbitrary one
    /// does, so a stream of one-off false positives cannot crowd out a hot one for long.
    pub fn insert(&mut self, hash: u128, until: Instant, now: Instant, cap: usize) {
        if cap == 0 {
            return;
        }
        while self.until.len() >= cap && !self.until.contains_key(&hash) {
            if self.next_sweep.is_none_or(|t| now >= t) {
                self.next_sweep = Some(now + SWEEP_EVERY);
                self.until.retain(|_, t| now < *t);
                continue;
            }
            let Some(&victim) = self.until.keys().next() else {
                break;
            };
            self.until.remove(&victim);
        }
        self.until.insert(hash, until);
    }

    /// `hash` became (or may have become) a member.
    #[inline]
    pub fn remove(&mut self, hash: u128) {
        if !self.is_empty() {
            self.until.remove(&hash);
        }
    }

    pub fn len(&self) -> usize {
        self.until.len()
    }

    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }

    /// Approximate heap bytes (for MEMORY USAGE).
    pub fn bytes(&self) -> usize {
        // Key, value and one control byte per bucket.
        self.until.capacity() * (16 + std::mem::size_of::<Instant>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn remembers_until_removed_or_expired() {
        let now = Instant::now();
        let mut k = KnownAbsent::default();
        assert!(!k.contains(1, now));
        k.insert(1, now + Duration::from_secs(10), now, 100);
        k.insert(2, now + Duration::from_secs(1), now, 100);
        assert!(k.contains(1, now) && k.contains(2, now));
        k.remove(1);
        assert!(!k.contains(1, now));
        assert!(!k.contains(2, now + Duration::from_secs(2)), "expired");
    }

    #[test]
    fn bounded_and_can_be_off() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut k = KnownAbsent::default();
        for h in 0..10 {
            k.insert(h, later, now, 5);
        }
        assert_eq!(k.len(), 5);
        assert!(k.contains(9, now), "a full cache makes room for the newest");
        // Re-remembering a held item evicts nothing.
        k.insert(9, later, now, 5);
        assert_eq!(k.len(), 5);
        // Expired entries make room.
        let mut e = KnownAbsent::default();
        for h in 0..5 {
            e.insert(h, now + Duration::from_millis(1), now, 5);
        }
        let after = now + Duration::from_millis(2);
        e.insert(99, later, after, 5);
        assert!(e.contains(99, after));
        let mut off = KnownAbsent::default();
        off.insert(1, later, now, 0);
        assert_eq!(off.len(), 0);
    }
}
