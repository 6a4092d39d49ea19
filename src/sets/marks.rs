//! A set's recent-writes marks: an item's mark is held while ADDs of it are in flight, and for
//! the set's RECENT-TTL after the last one finished; while it is held, a filter negative for
//! the item is not believed (README, "The correctness contract").
//!
//! While a set's key rotates in a cluster, a write's twin lives in another node's slot, and
//! that node holds two timed marks for writes it does not run (`hold`, `hold_delete`,
//! docs/security.md, "A gap the cluster history checker found"): an ADD's, as above, and a
//! DEL's, while which the exact-match key is not believed either.
//!
//! Expired marks leave from a queue ordered by their times (a min-heap, one entry per mark at
//! most), so a sweep costs what expired since the last one. It used to walk every mark: at
//! 10 000 ADDs a second and the default RECENT-TTL of 10 s that is 100 000 marks, every
//! 100 ms, on the main thread (2 % of the server's CPU under an ADD load in a profile, and a
//! pause growing with the rate and the TTL).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

/// Hasher for keys that are already uniform hashes (the 128-bit canonical hash).
#[derive(Default)]
struct IdHasher(u64);
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
    /// Has an entry in the expiry queue.
    queued: bool,
    /// Made on a history of the database the node no longer follows (`distrust`): held
    /// only while its ADDs are in flight.
    cut: bool,
}

/// The marks of one set, by the item's canonical hash.
#[derive(Default)]
pub struct Marks {
    marks: IdMap<Mark>,
    /// Marks whose last ADD in flight ended, earliest time first: one entry per mark at most
    /// (an item written again and again keeps one), at the mark's time when it was queued. A
    /// mark held longer since is queued again at its new time when the old one comes up; an
    /// ALTER that shortens RECENT-TTL changes nothing here (the order is by time, not arrival).
    expiry: BinaryHeap<Reverse<(Instant, u128)>>,
    /// DELs in flight, by hash: held until then. Rare (a rotating set's DELs in a cluster),
    /// so a sweep walks them all.
    deleting: IdMap<Instant>,
}

impl Marks {
    /// An ADD of `hash` is starting: held until it ends, and `ttl` after. (Not queued here: a
    /// mark in flight is never dropped, and its end queues it.)
    pub fn begin(&mut self, hash: u128, ttl: Duration) {
        let m = Self::renewed(&mut self.marks, hash, Instant::now() + ttl);
        m.pending += 1;
    }

    /// `hash`'s mark (made if there is none), held at least `until` and on this history.
    fn renewed(marks: &mut IdMap<Mark>, hash: u128, until: Instant) -> &mut Mark {
        let m = marks.entry(hash).or_insert(Mark {
            pending: 0,
            until,
            queued: false,
            cut: false,
        });
        m.cut = false;
        m.until = m.until.max(until);
        m
    }

    /// Queues `hash`'s mark `m` for expiry when no ADD of it is in flight and it is not queued.
    fn queue(expiry: &mut BinaryHeap<Reverse<(Instant, u128)>>, hash: u128, m: &mut Mark) {
        if m.pending == 0 && !m.queued {
            m.queued = true;
            expiry.push(Reverse((m.until, hash)));
        }
    }

    /// An ADD of `hash` ended (its filter bit, if any, is set): held `ttl` from now. The last
    /// ADD in flight to end queues the mark, unless it is queued already.
    pub fn end(&mut self, hash: u128, ttl: Duration) {
        let now = Instant::now();
        if let Some(m) = self.marks.get_mut(&hash) {
            let until = if m.cut { now } else { now + ttl };
            m.pending = m.pending.saturating_sub(1);
            m.until = m.until.max(until);
            Self::queue(&mut self.expiry, hash, m);
        }
    }

    /// A write of `hash` another node runs is starting (its twin's ADD, here): held `time`
    /// from now, however it ends, counted with no ADD in flight.
    pub fn hold(&mut self, hash: u128, time: Duration) {
        let m = Self::renewed(&mut self.marks, hash, Instant::now() + time);
        Self::queue(&mut self.expiry, hash, m);
    }

    /// A DEL of `hash` is starting (a rotating set's, in a cluster): held `time` from now.
    pub fn hold_delete(&mut self, hash: u128, time: Duration) {
        let until = Instant::now() + time;
        let at = self.deleting.entry(hash).or_insert(until);
        *at = (*at).max(until);
    }

    /// True while a DEL of `hash` is held (`hold_delete`).
    #[inline]
    pub fn deleting(&self, hash: u128) -> bool {
        if self.deleting.is_empty() {
            return false;
        }
        self.deleting
            .get(&hash)
            .is_some_and(|&until| Instant::now() < until)
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

    /// The database's history changed (docs/failover.md): the marks of ended ADDs, which
    /// may be of writes the new history lost, are dropped; a mark whose ADD is in flight holds
    /// until that ADD ends, and not after (the set's filter is incomplete until rebuilt from
    /// the new history, so the mark protects nothing the database does not answer).
    pub fn distrust(&mut self) {
        let now = Instant::now();
        self.marks.retain(|_, m| m.pending > 0);
        self.expiry.clear();
        for m in self.marks.values_mut() {
            m.until = now;
            m.queued = false;
            m.cut = true;
        }
    }

    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }

    /// Drops the marks that expired by `now`. A mark whose ADD is still in flight stays (the
    /// end of that ADD queues it again); one held longer since it was queued is queued again
    /// at its new time.
    pub fn purge(&mut self, now: Instant) {
        if !self.deleting.is_empty() {
            self.deleting.retain(|_, until| *until > now);
        }
        while let Some(&Reverse((at, hash))) = self.expiry.peek() {
            if at > now {
                break;
            }
            self.expiry.pop();
            let Some(m) = self.marks.get_mut(&hash) else {
                continue;
            };
            if m.pending > 0 {
                m.queued = false;
            } else if m.until <= now {
                self.marks.remove(&hash);
            } else {
                self.expiry.push(Reverse((m.until, hash)));
            }
        }
        // After a burst, the memory goes back once every mark has gone (neither shrinks by
        // itself; shrinking a map that still holds marks would rehash them on the main thread).
        if self.marks.is_empty() && self.marks.capacity() > SHRINK_ABOVE {
            self.marks = IdMap::default();
        }
        if self.expiry.is_empty() && self.expiry.capacity() > SHRINK_ABOVE {
            self.expiry = BinaryHeap::new();
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
    fn distrusted_marks_hold_only_while_their_adds_are_in_flight() {
        let mut m = Marks::default();
        m.begin(1, TTL);
        m.end(1, TTL);
        m.begin(2, TTL);
        m.distrust();
        assert!(!m.holds(1), "an ended ADD of the old history");
        assert!(m.holds(2), "an ADD in flight");
        m.end(2, TTL);
        assert!(!m.holds(2), "held no longer once it ended");
        m.purge(Instant::now());
        assert!(m.is_empty());
        // A write of the new history is held for its TTL as always.
        m.begin(3, TTL);
        m.end(3, TTL);
        assert!(m.holds(3));
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
    fn a_shortened_ttl_drops_marks_when_due_whatever_the_order() {
        let mut m = Marks::default();
        m.begin(1, TTL);
        m.end(1, TTL);
        m.begin(2, Duration::from_secs(1));
        m.end(2, Duration::from_secs(1));
        // 2 ended after 1 but is due first: it goes first, 1 stays held.
        m.purge(Instant::now() + Duration::from_secs(2));
        assert_eq!(m.len(), 1);
        assert!(m.holds(1));
        assert!(!m.holds(2));
        m.purge(Instant::now() + TTL + Duration::from_millis(1));
        assert!(m.is_empty());
    }

    #[test]
    fn an_item_written_again_and_again_keeps_one_entry() {
        let mut m = Marks::default();
        for _ in 0..1000 {
            m.begin(5, TTL);
            m.end(5, TTL);
        }
        assert_eq!(m.expiry.len(), 1);
        // Held from its last write: queued again when its first time comes up.
        let first = m.expiry.peek().map(|r| r.0 .0).unwrap();
        m.begin(5, TTL + Duration::from_secs(5));
        m.end(5, TTL + Duration::from_secs(5));
        m.purge(first);
        assert!(m.holds(5));
        assert_eq!(m.expiry.len(), 1);
        m.purge(Instant::now() + TTL + Duration::from_secs(6));
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
    fn a_held_mark_lasts_its_time_with_no_write_in_flight() {
        let mut m = Marks::default();
        m.hold(9, TTL);
        assert!(m.holds(9));
        m.purge(Instant::now() + Duration::from_secs(1));
        assert!(m.holds(9), "held for its time");
        m.purge(Instant::now() + TTL + Duration::from_millis(1));
        assert!(m.is_empty(), "and then gone, with no end to wait for");
        // Held longer by a local ADD in flight, which a hold does not cut short.
        m.begin(4, TTL);
        m.hold(4, Duration::from_millis(1));
        m.purge(Instant::now() + 2 * TTL);
        assert!(m.holds(4));
        m.end(4, TTL);
        // And a hold outlives a local ADD's end.
        m.hold(4, 3 * TTL);
        m.purge(Instant::now() + 2 * TTL);
        assert!(m.holds(4));
    }

    #[test]
    fn a_delete_is_held_for_its_time_and_apart_from_adds() {
        let mut m = Marks::default();
        assert!(!m.deleting(8));
        m.hold_delete(8, TTL);
        assert!(m.deleting(8));
        assert!(!m.holds(8), "a DEL is no ADD's mark");
        m.purge(Instant::now() + Duration::from_secs(1));
        assert!(m.deleting(8));
        m.purge(Instant::now() + TTL + Duration::from_millis(1));
        assert!(!m.deleting(8));
        assert!(m.deleting.is_empty());
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
