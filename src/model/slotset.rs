//! A set of hash slots, as a 16 384-bit bitmap (2 KiB). Pure.

use super::slot::SLOTS;

const WORDS: usize = SLOTS / 64;

/// Serialized size: the bitmap, little-endian words.
pub const BYTES: usize = SLOTS / 8;

#[derive(Clone, PartialEq, Eq)]
pub struct SlotSet(Box<[u64; WORDS]>);

impl std::fmt::Debug for SlotSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlotSet({} slots)", self.len())
    }
}

impl Default for SlotSet {
    fn default() -> Self {
        SlotSet(Box::new([0; WORDS]))
    }
}

impl SlotSet {
    pub fn all() -> Self {
        SlotSet(Box::new([u64::MAX; WORDS]))
    }

    #[inline]
    pub fn contains(&self, slot: u16) -> bool {
        let s = slot as usize;
        s < SLOTS && self.0[s / 64] & (1 << (s % 64)) != 0
    }

    pub fn insert(&mut self, slot: u16) {
        let s = slot as usize;
        if s < SLOTS {
            self.0[s / 64] |= 1 << (s % 64);
        }
    }

    pub fn remove(&mut self, slot: u16) {
        let s = slot as usize;
        if s < SLOTS {
            self.0[s / 64] &= !(1 << (s % 64));
        }
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// Adds every slot of `other`.
    pub fn union_with(&mut self, other: &SlotSet) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a |= b;
        }
    }

    /// Removes every slot of `other`.
    pub fn subtract(&mut self, other: &SlotSet) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a &= !b;
        }
    }

    /// Slots in `self` and not in `other`.
    pub fn minus(&self, other: &SlotSet) -> SlotSet {
        let mut out = self.clone();
        out.subtract(other);
        out
    }

    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (0..SLOTS as u16).filter(|s| self.contains(*s))
    }

    pub fn write_to(&self, out: &mut Vec<u8>) {
        for w in self.0.iter() {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// Reads [`BYTES`] bytes; `None` when fewer are given.
    pub fn read(b: &[u8]) -> Option<SlotSet> {
        let b = b.get(..BYTES)?;
        let mut set = SlotSet::default();
        for (w, chunk) in set.0.iter_mut().zip(b.chunks_exact(8)) {
            *w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        }
        Some(set)
    }
}

impl FromIterator<u16> for SlotSet {
    fn from_iter<I: IntoIterator<Item = u16>>(it: I) -> Self {
        let mut s = SlotSet::default();
        for slot in it {
            s.insert(slot);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations_and_round_trip() {
        let a: SlotSet = [0u16, 63, 64, 16383].into_iter().collect();
        assert_eq!(a.len(), 4);
        assert!(a.contains(63) && a.contains(16383) && !a.contains(1) && !a.contains(20000));
        let b: SlotSet = [63u16, 5].into_iter().collect();
        assert_eq!(a.minus(&b).iter().collect::<Vec<_>>(), vec![0, 64, 16383]);
        let mut u = a.clone();
        u.union_with(&b);
        assert_eq!(u.len(), 5);
        let mut bytes = Vec::new();
        u.write_to(&mut bytes);
        assert_eq!(bytes.len(), BYTES);
        assert_eq!(SlotSet::read(&bytes), Some(u));
        assert_eq!(SlotSet::read(&bytes[1..]), None);
        assert_eq!(SlotSet::all().len(), SLOTS);
        assert!(SlotSet::default().is_empty());
    }
}
