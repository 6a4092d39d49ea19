//! Members that lapsed since a set's filter was built: deleted (MEMBER.DEL, here or on the
//! primary), expired or marked inactive (a lookup found the row so). The filter still lets
//! them through, rightly: they were members when their bits were set. A lookup of one is
//! counted as a lapsed lookup, not as a false positive of the filter, so the measured
//! false-positive rate can be held against the set's ERROR.
//!
//! A small Bloom filter, made at the first lapse and dropped when a rebuild installs a filter
//! built without them; at most ~10 KB per set. It only sorts counters: at its own false-positive
//! rate (1 % at 8 192 lapses, more beyond) a true false positive is counted as lapsed.

use crate::filter::Bloom;

/// Lapses the filter is sized for; more are still recorded, at a higher rate.
const CAPACITY: u64 = 8192;
const RATE: f64 = 0.01;

#[derive(Default)]
pub struct Lapsed {
    seen: Option<Box<Bloom>>,
}

impl Lapsed {
    /// `hash` stopped being a member.
    pub fn note(&mut self, hash: u128) {
        self.seen
            .get_or_insert_with(|| Box::new(Bloom::new(CAPACITY, RATE)))
            .add(hash);
    }

    /// Whether `hash` lapsed since the filter was built (maybe: see the module's note).
    pub fn contains(&self, hash: u128) -> bool {
        self.seen.as_ref().is_some_and(|b| b.contains(hash))
    }

    /// A rebuild installed a filter without the lapsed members.
    pub fn clear(&mut self) {
        self.seen = None;
    }

    pub fn bytes(&self) -> usize {
        self.seen.as_ref().map_or(0, |b| b.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_cleared() {
        let mut l = Lapsed::default();
        assert!(!l.contains(7));
        assert_eq!(l.bytes(), 0);
        l.note(7);
        assert!(l.contains(7));
        assert!(l.bytes() > 0 && l.bytes() < 16 * 1024, "{}", l.bytes());
        l.clear();
        assert!(!l.contains(7));
    }
}
