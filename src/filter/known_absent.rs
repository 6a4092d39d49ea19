//! Confirmed false positives: items the filter lets through but the database has just said
//! are not members. A hot false positive (a card number checked on every payment, a name
//! re-checked at each keystroke) would otherwise cost a database round trip every time,
//! forever: the same bits stay set until a rebuild.
//!
//! An entry lives inside the filter value it complements, so it can never outlive that
//! filter (a rebuild, a load or a FLUSHALL starts empty). It is dropped the moment the item
//! is added to that filter (MEMBER.ADD, a replicated ADD, the sync loop reading an outside
//! write) or found present by a lookup, and in any case after the set's CACHE-TTL. And an
//! answer the database gave before such an add is never remembered after it: the time of the
//! last add is kept per hash slot, and a lookup only remembers if nothing hashing to its slot
//! was added since it was asked.
//!
//! The store is a two-way set-associative table indexed by the item hash: every operation is
//! O(1) on the main thread, whatever the size, and a full table simply overwrites. It starts
//! small and doubles up to the configured size; so do the last-add times, up to
//! [`ADDED_SLOTS`]. A set with a few false positives keeps about 3 KB here, not the 48 KB a
//! table and times allocated at full size took (for every set that had an ADD and a false
//! positive; thousands of small sets add up). Pure data: no server calls.

use std::time::Instant;

/// One remembered item; `until == None` is an empty slot.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    hash: u128,
    until: Option<Instant>,
}

impl Slot {
    fn live(&self, now: Instant) -> bool {
        self.until.is_some_and(|t| now < t)
    }
}

/// Slots allocated when the first entry arrives; the table doubles when half full.
const FIRST_SLOTS: usize = 64;

/// Most slots of the last-add times (one per hash slot; a shared slot only makes a remember
/// more cautious). They start at [`FIRST_ADDED`] and grow with the table.
const ADDED_SLOTS: usize = 1024;
const FIRST_ADDED: usize = 64;

#[derive(Clone, Debug, Default)]
pub struct KnownAbsent {
    /// A power of two long (or empty); item `h` may sit in the pair at `pair(h)`.
    slots: Vec<Slot>,
    /// Occupied slots (some may have expired).
    used: usize,
    /// When an item of each hash slot was last added (empty until the first add; a power of
    /// two long).
    added: Vec<Option<Instant>>,
}

impl KnownAbsent {
    fn pair(&self, hash: u128) -> usize {
        (hash as usize) & (self.slots.len() - 1) & !1
    }

    /// True when the database said `hash` is absent, nothing has added it since, and the
    /// entry has not expired. Reads the clock only when the item is held.
    #[inline]
    pub fn contains(&self, hash: u128) -> bool {
        if self.used == 0 {
            return false;
        }
        let i = self.pair(hash);
        self.slots[i..i + 2]
            .iter()
            .any(|s| s.hash == hash && s.until.is_some_and(|t| Instant::now() < t))
    }

    /// Remembers `hash` as absent until `until`, as the database answered a lookup asked at
    /// `asked` (skipped if an item of its slot was added since). Holds at most `cap` entries
    /// (rounded up to a power of two; 0 forgets everything and frees the table). When the
    /// item's pair is full of live entries, one of them (picked by the new item's hash) makes
    /// room.
    pub fn insert(&mut self, hash: u128, asked: Instant, until: Instant, now: Instant, cap: usize) {
        if cap == 0 {
            self.slots = Vec::new();
            self.used = 0;
            return;
        }
        if self.added_at(hash).is_some_and(|t| t >= asked) {
            return;
        }
        let max = cap.next_power_of_two().max(2);
        if self.slots.is_empty() {
            self.resize(FIRST_SLOTS.min(max));
        } else if self.slots.len() > max
            || (self.used * 2 >= self.slots.len() && self.slots.len() < max)
        {
            self.resize(if self.slots.len() > max {
                max
            } else {
                self.slots.len() * 2
            });
        }
        self.place(hash, until, now);
    }

    fn place(&mut self, hash: u128, until: Instant, now: Instant) {
        let i = self.pair(hash);
        let pick = match (&self.slots[i], &self.slots[i + 1]) {
            (a, _) if a.until.is_some() && a.hash == hash => i,
            (_, b) if b.until.is_some() && b.hash == hash => i + 1,
            (a, _) if !a.live(now) => i,
            (_, b) if !b.live(now) => i + 1,
            _ => i + ((hash >> 64) as usize & 1),
        };
        if self.slots[pick].until.is_none() {
            self.used += 1;
        }
        self.slots[pick] = Slot {
            hash,
            until: Some(until),
        };
    }

    /// When an item of `hash`'s slot was last added, if one was.
    fn added_at(&self, hash: u128) -> Option<Instant> {
        if self.added.is_empty() {
            return None;
        }
        self.added[hash as usize & (self.added.len() - 1)]
    }

    /// Grows the last-add times to `len` slots (a power of two, at most [`ADDED_SLOTS`]): each
    /// new slot keeps the time of the slot its hashes shared before, so no add is forgotten.
    fn grow_added(&mut self, len: usize) {
        let len = len.min(ADDED_SLOTS);
        let old = self.added.len();
        if old == 0 || len <= old {
            return;
        }
        self.added = (0..len).map(|i| self.added[i & (old - 1)]).collect();
    }

    /// Rebuilds the table at `len` slots, keeping what fits.
    fn resize(&mut self, len: usize) {
        self.grow_added(len);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); len]);
        self.used = 0;
        let now = Instant::now();
        for s in old {
            if let Some(t) = s.until.filter(|&t| now < t) {
                self.place(s.hash, t, now);
            }
        }
    }

    /// `hash` became (or may have become) a member: forgotten, and noted as added now.
    pub fn added(&mut self, hash: u128) {
        if self.added.is_empty() {
            self.added = vec![None; FIRST_ADDED.max(self.slots.len()).min(ADDED_SLOTS)];
        }
        let i = hash as usize & (self.added.len() - 1);
        self.added[i] = Some(Instant::now());
        self.remove(hash);
    }

    /// `hash` was found present: forgotten.
    #[inline]
    pub fn remove(&mut self, hash: u128) {
        if self.used == 0 {
            return;
        }
        let i = self.pair(hash);
        for s in &mut self.slots[i..i + 2] {
            if s.until.is_some() && s.hash == hash {
                s.until = None;
                self.used -= 1;
            }
        }
    }

    /// Entries that have not expired (a scan: for MEMBER.INFO, not the hot path).
    pub fn live(&self) -> usize {
        let now = Instant::now();
        self.slots.iter().filter(|s| s.live(now)).count()
    }

    /// Heap bytes (for MEMORY USAGE).
    pub fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.added.capacity() * std::mem::size_of::<Option<Instant>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn h(i: u64) -> u128 {
        crate::model::canon::hash_parts(&format!("fp-{i}"), "")
    }

    #[test]
    fn remembers_until_removed_or_expired() {
        let now = Instant::now();
        let mut k = KnownAbsent::default();
        assert!(!k.contains(h(1)));
        k.insert(h(1), now, now + Duration::from_secs(60), now, 100);
        k.insert(h(2), now, now + Duration::from_millis(30), now, 100);
        assert!(k.contains(h(1)) && k.contains(h(2)));
        assert!(!k.contains(h(3)));
        k.remove(h(1));
        assert!(!k.contains(h(1)));
        std::thread::sleep(Duration::from_millis(40));
        assert!(!k.contains(h(2)), "expired");
        assert_eq!(k.live(), 0);
    }

    #[test]
    fn bounded_grows_and_shrinks_and_can_be_off() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut k = KnownAbsent::default();
        for i in 0..100_000 {
            k.insert(h(i), now, later, now, 5000);
        }
        assert_eq!(k.slots.len(), 8192, "grown to the cap's power of two");
        assert!(k.live() <= 8192 && k.live() > 4000, "{}", k.live());
        assert!(k.contains(h(99_999)), "the newest always finds room");
        // A smaller cap shrinks the table at the next insert, keeping what fits.
        k.insert(h(100_000), now, later, now, 64);
        assert_eq!(k.slots.len(), 64);
        assert!(k.contains(h(100_000)));
        assert!(k.live() <= 64);
        // 0 turns it off and frees the table.
        k.insert(h(7), now, later, now, 0);
        assert_eq!((k.slots.len(), k.live(), k.bytes()), (0, 0, 0));
        assert!(!k.contains(h(7)));
    }

    #[test]
    fn an_answer_older_than_an_add_is_not_remembered() {
        let later = Instant::now() + Duration::from_secs(60);
        let mut k = KnownAbsent::default();
        let asked = Instant::now();
        k.added(h(1));
        k.insert(h(1), asked, later, Instant::now(), 100);
        assert!(!k.contains(h(1)), "asked before the add");
        let asked = Instant::now();
        k.insert(h(1), asked, later, asked, 100);
        assert!(k.contains(h(1)), "asked after the add");
        k.added(h(1));
        assert!(!k.contains(h(1)), "an add forgets it");
    }

    #[test]
    fn an_add_before_the_times_grew_still_counts_after() {
        let later = Instant::now() + Duration::from_secs(60);
        let mut k = KnownAbsent::default();
        let asked = Instant::now();
        k.added(h(1));
        assert_eq!(k.added.len(), FIRST_ADDED);
        // The table grows past the times' first size, and the times with it.
        let now = Instant::now();
        for i in 100..1100 {
            k.insert(h(i), now, later, now, 5000);
        }
        assert_eq!(k.added.len(), ADDED_SLOTS);
        k.insert(h(1), asked, later, Instant::now(), 5000);
        assert!(
            !k.contains(h(1)),
            "asked before the add, which the grown times keep"
        );
        // A set with a few false positives keeps little.
        let mut small = KnownAbsent::default();
        small.added(h(1));
        small.insert(h(2), now, later, now, 5000);
        assert!(small.bytes() <= 4096, "{}", small.bytes());
    }

    #[test]
    fn a_pair_of_live_entries_makes_room_and_updates_in_place() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut k = KnownAbsent::default();
        k.insert(h(1), now, later, now, 2);
        assert_eq!(k.slots.len(), 2);
        k.insert(h(1), now, later, now, 2);
        assert_eq!(k.used, 1, "same item, same slot");
        k.insert(h(2), now, later, now, 2);
        k.insert(h(3), now, later, now, 2);
        assert!(k.contains(h(3)));
        assert_eq!(k.used, 2);
    }
}
