//! A set's recent-writes marks: an item's mark is held while ADDs of it are in flight, and for
//! the set's RECENT-TTL after the last one finished; while it is held, a filter negative for
//! the item is not believed (README, "The correctness contract").
//!
//! Expired marks leave in the order their times were set, from a queue, so a sweep costs
//! what expired since the last one. It used to walk every mark: at 10 000 ADDs a second and
//! the default RECENT-TTL of 10 s that is 100 000 marks, every 100 ms, on the main thread
//! (2 % of the server's CPU under an ADD load in a profile, and a pause growing with the rate
//! and the TTL).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

/// Hasher for keys that are already uniform hashes (the 128-bit canonical hash).
#[derive(Default)]
pub struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ *b as u64;
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64 ^ (v >> 64) as u64;
    }
}

type IdMap<V> = HashMap<u128, V, BuildHasherDefault<IdHasher>>;

#[derive(Clone, Copy, Debug)]
struct Mark {
    /// ADDs of the item in flight.
    pending: u32,
    /// Held at least until then.
    until: Instant,
}

/// The marks of one set, by the item's canonical hash.
#[derive(Default)]
pub struct Marks {
    marks: IdMap<Mark>,
    /// The time of each mark whose last ADD in flight ended, with its item, in the order they
    /// ended. With one TTL the times only grow; after an ALTER shortened it, a later entry may
    /// be due before an earlier one and then leaves with it (kept longer in memory, never
    /// held longer: `holds` reads the mark's own time).
    expiry: VecDeque<(Instant, u128)>,
}

impl Marks {
    /// An ADD of `hash` is starting: held until it ends, and `ttl` after. (Not queued: a mark
    /// in flight is never dropped, and its end queues it.)
    pub fn begin(&mut self, hash: u128, ttl: Duration) {
        let until = Instant::now() + ttl;
        let m = self.marks.entry(hash).or_insert(Mark { pending: 0, until });
        m.pending += 1;
        m.until = m.until.max(until);
    }

    /// An ADD of `hash` ended (its filter bit, if any, is set): held `ttl` from now. The last
    /// ADD in flight to end queues the mark for its time.
    pub fn end(&mut self, hash: u128, ttl: Duration) {
        let until = Instant::now() + ttl;
        if let Some(m) = self.marks.get_mut(&hash) {
            m.pending = m.pending.saturating_sub(1);
            m.until = m.until.max(until);
            if m.pending == 0 {
                self.expiry.push_back((m.until, hash));
            }
        }
    }

    /// True when a write of `hash` is in flight or ended within its TTL.
    #[inline]
    pub fn holds(&self, hash: u128) -> bool {
        if self.marks.is_empty() {
            return false;
        }
        self.marks
            .get(&hash)
            .is_some_and(|m| m.pending > 0 || Instant::now() < m.until)
    }

    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }

    /// Drops the marks that expired by `now`. A mark whose ADD is still in flight stays; the
    /// end of that ADD queues it again.
    pub fn purge(&mut self, now: Instant) {
        while let Some(&(at, hash)) = self.expiry.front() {
            if at > now {
                break;
            }
            self.expiry.pop_front();
            if self
                .marks
                .get(&hash)
                .is_some_and(|m| m.pending == 0 && m.until <= now)
            {
                self.marks.remove(&hash);
            }
        }
        // After a burst, the memory goes back once every mark has gone (neither shrinks by
        // itself; shrinking a map that still holds marks would rehash them on the main thread).
        if self.marks.is_empty() && self.marks.capacity() > SHRINK_ABOVE {
            self.marks = IdMap::default();
        }
        if self.expiry.is_empty() && self.expiry.capacity() > SHRINK_ABOVE {
            self.expiry = VecDeque::new();
        }
    }
}

/// Capacity (marks) over which an emptied map or queue gives its memory back.
const SHRINK_ABOVE: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn a_mark_is_held_while_in_flight_and_for_its_ttl_after() {
        let mut m = Marks::default();
        m.begin(1, TTL);
        let now = Instant::now();
        // In flight: held even past its time.
        m.purge(now + 2 * TTL);
        assert!(m.holds(1));
        m.end(1, TTL);
        m.purge(Instant::now());
        assert!(m.holds(1));
        m.purge(Instant::now() + TTL + Duration::from_millis(1));
        assert!(!m.holds(1));
        assert!(m.is_empty());
    }

    #[test]
    fn a_mark_renewed_by_a_later_write_outlives_the_first_time() {
        let mut m = Marks::default();
        m.begin(7, Duration::from_secs(1));
        m.end(7, Duration::from_secs(1));
        m.begin(7, TTL);
        m.end(7, TTL);
        m.purge(Instant::now() + Duration::from_secs(2));
        assert!(m.holds(7));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn a_shortened_ttl_drops_marks_no_earlier_than_due() {
        let mut m = Marks::default();
        m.begin(1, TTL);
        m.end(1, TTL);
        m.begin(2, Duration::from_secs(1));
        m.end(2, Duration::from_secs(1));
        // 2 is due first but queued behind 1: it stays in memory until 1 is due, and is not
        // held (`holds` reads its own time).
        let later = Instant::now() + Duration::from_secs(2);
        m.purge(later);
        assert_eq!(m.len(), 2);
        assert!(m.holds(1));
        m.purge(Instant::now() + TTL + Duration::from_millis(1));
        assert!(m.is_empty());
    }

    #[test]
    fn a_ttl_shortened_while_in_flight_still_lets_the_mark_go() {
        let mut m = Marks::default();
        m.begin(3, TTL);
        m.end(3, Duration::from_secs(1));
        m.purge(Instant::now() + TTL + Duration::from_millis(1));
        assert!(m.is_empty());
    }

    #[test]
    fn a_sweep_costs_what_expired() {
        let mut m = Marks::default();
        for h in 0..10_000u128 {
            m.begin(h, TTL);
            m.end(h, TTL);
        }
        m.purge(Instant::now());
        // Nothing was due: the sweep stopped at the queue's front.
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.expiry.len(), 10_000);
        m.purge(Instant::now() + TTL + Duration::from_millis(1));
        assert!(m.is_empty());
        assert!(m.expiry.is_empty());
        // And the burst's memory went back.
        assert!(m.marks.capacity() <= SHRINK_ABOVE);
        assert!(m.expiry.capacity() <= SHRINK_ABOVE);
    }
}
