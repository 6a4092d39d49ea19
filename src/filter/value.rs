//! A set's filter as the keyspace holds it (`FilterValue`): the Bloom gate, what it covers
//! (watermark, slots), where it was made, its confirmed false positives, and the envelopes
//! of its binary form. The server-facing callbacks are `data_type.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::filter::known_absent::KnownAbsent;
use crate::filter::origin::{self, NodeDb, Origin, Verdict};
use crate::filter::{Bloom, Coverage, Out};
use crate::model::slotset::{self, SlotSet};

/// A set's filter and what it covers. Whether it may answer "absent" is not stored here: the
/// set's state names the one value it trusts (`state::SetState::trusted`), so a value that
/// comes back to the key by any other way (RENAME, MOVE, SWAPDB, COPY, RESTORE) is not it.
#[derive(Debug)]
pub struct FilterValue {
    pub bloom: Bloom,
    pub cov: Coverage,
    /// False positives the database confirmed absent while this filter served. Not
    /// persisted, not copied: every new value starts empty.
    pub known_absent: KnownAbsent,
    /// Identity of this value, never reused: a fresh one for every value made (build, load,
    /// COPY's clone); kept while the server moves the value between keys and databases.
    pub id: u64,
    /// The set whose rows this filter was built from (persisted with it): a value found at
    /// another set's key (RESTORE of another set's DUMP, a COPY across sets) is never caught
    /// up and trusted there. `None` only for payloads written before this field existed.
    pub set: Option<String>,
    /// Cluster mode: the hash slots whose rows this filter holds completely (built, or filled
    /// by a slot fill, and followed by every sync pass since; see `slot_fill.rs`). A negative
    /// for an item of any other slot is not definitive. `None`: every slot (standalone, or a
    /// filter built from the whole table).
    pub slots: Option<SlotSet>,
    /// The database and catalog row it was built from (persisted with it, in the envelope of
    /// `filter_origin`): a value made elsewhere is never caught up and trusted here. `None`
    /// for payloads written before the envelope, or by a node that did not know its database.
    pub origin: Option<Origin>,
}

/// Envelope in front of a payload that names its set: tag, name length (1 byte), name.
const SET_TAG: &[u8; 4] = b"LMSN";
/// Envelope (after the set's) with the slots a cluster-mode filter covers: tag, bitmap.
const SLOTS_TAG: &[u8; 4] = b"LMSL";

/// Source of `FilterValue::id`.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Clone for FilterValue {
    /// A copy (COPY of the key) is a new value: same bits and coverage, a new identity,
    /// nothing remembered.
    fn clone(&self) -> Self {
        let mut v = FilterValue::new(self.bloom.clone(), self.cov);
        v.set = self.set.clone();
        v.slots = self.slots.clone();
        v.origin = self.origin;
        v
    }
}

impl FilterValue {
    fn new(bloom: Bloom, cov: Coverage) -> Self {
        FilterValue {
            bloom,
            cov,
            known_absent: KnownAbsent::default(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            set: None,
            slots: None,
            origin: None,
        }
    }

    /// A filter just built from the whole table of `set`, current up to `watermark`.
    pub fn built(bloom: Bloom, watermark: i64, set: &str) -> Self {
        let cov = Coverage {
            complete: true,
            watermark: Some(watermark),
        };
        let mut v = FilterValue::new(bloom, cov);
        v.set = Some(set.to_string());
        v
    }

    /// True when this value may serve `set`: built from its rows (or of unknown origin, from
    /// a payload older than the set name in it).
    pub fn belongs_to(&self, set: &str) -> bool {
        self.set.as_deref().is_none_or(|s| s == set)
    }

    /// Whether this value may be caught up and trusted at the key of `set`, whose catalog
    /// row is `set_id`, on a node whose database is `node` (`origin::judge`).
    pub fn verdict(&self, set: &str, node: NodeDb, set_id: Option<i64>) -> Verdict {
        if !self.belongs_to(set) {
            return Verdict::Foreign;
        }
        origin::judge(self.origin.as_ref(), node, set_id)
    }

    /// A filter that was never built from the whole table (only older payloads hold one now).
    #[cfg(test)]
    pub fn partial(bloom: Bloom) -> Self {
        let cov = Coverage {
            complete: false,
            watermark: None,
        };
        FilterValue::new(bloom, cov)
    }

    /// True when a negative from this filter is definitive, `trusted` being the identity the
    /// set trusts (`state::SetState::trusted`): built from the whole table, and the very
    /// value the module installed or caught up.
    #[inline]
    pub fn trusted(&self, trusted: Option<u64>) -> bool {
        self.cov.complete && trusted == Some(self.id)
    }

    /// `hash` became (or may have become) a member: its bits, and it is no longer known
    /// absent. Every add to a serving filter goes through here.
    pub fn add(&mut self, hash: u128) {
        self.bloom.add(hash);
        self.known_absent.added(hash);
    }

    /// The catch-up rule, the one place it is decided. A sync pass read `hashes`, every
    /// active row changed from `from` up to `horizon`; they are added, and if this value
    /// already covered `from` it now covers up to `horizon`: whatever its history (loaded
    /// from disk, moved back, copied over), it is current. Returns its identity then, for
    /// the set to trust; `None` when it is not (a partial filter, or one older than `from`).
    pub fn apply_sync(&mut self, hashes: &[u128], from: i64, horizon: i64) -> Option<u64> {
        for h in hashes {
            self.add(*h);
        }
        let covered = self.cov.watermark?;
        if from > covered {
            return None;
        }
        self.cov.watermark = Some(covered.max(horizon));
        self.cov.complete.then_some(self.id)
    }

    /// The persisted form: the versioned origin envelope (`origin::write`), the
    /// set-name envelope (when the set is known), the slots envelope (cluster mode), then the
    /// filter's own versioned payload (`Bloom::to_bytes`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0; self.payload_len()];
        self.write_into(&mut out);
        out
    }

    /// Length of `to_bytes`'s output.
    pub fn payload_len(&self) -> usize {
        let name = self.set.as_deref().unwrap_or("");
        origin::len(self.origin.as_ref())
            + if name.is_empty() {
                0
            } else {
                SET_TAG.len() + 1 + name.len()
            }
            + self
                .slots
                .as_ref()
                .map_or(0, |_| SLOTS_TAG.len() + slotset::BYTES)
            + self.bloom.serialized_len()
    }

    /// `to_bytes` into `buf`, exactly `payload_len` bytes (a server string made for it).
    pub fn write_into(&self, buf: &mut [u8]) {
        let len = self.payload_len();
        assert_eq!(buf.len(), len, "a payload buffer of the wrong size");
        let name = self.set.as_deref().unwrap_or("");
        let mut out = Out::new(buf);
        origin::write(self.origin.as_ref(), &mut out);
        if !name.is_empty() {
            out.extend_from_slice(SET_TAG);
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
        }
        if let Some(slots) = &self.slots {
            let mut words = Vec::with_capacity(slotset::BYTES);
            slots.write_to(&mut words);
            out.extend_from_slice(SLOTS_TAG);
            out.extend_from_slice(&words);
        }
        self.bloom.write_bytes(self.cov, &mut out);
        assert_eq!(out.len(), len, "a payload shorter than its length");
    }

    /// True when a negative of this filter is definitive for items of `slot` (cluster mode).
    #[inline]
    pub fn covers(&self, slot: u16) -> bool {
        self.slots.as_ref().is_none_or(|s| s.contains(slot))
    }

    /// Parses a serialized filter into a new value (a new identity: not trusted until the
    /// set is told to trust it). A payload of an envelope version this build does not read is
    /// refused; one from before the envelope loads with no origin.
    pub fn from_bytes(b: &[u8]) -> Result<Self, String> {
        let (origin, b) = origin::read(b)?;
        let (set, payload) = match b.strip_prefix(SET_TAG.as_slice()) {
            Some(rest) => {
                let (&len, rest) = rest
                    .split_first()
                    .ok_or("filter payload truncated in its set name")?;
                let len = len as usize;
                if rest.len() < len || !crate::model::set_def::valid_set_name(&rest[..len]) {
                    return Err("filter payload has a bad set name".into());
                }
                let name = String::from_utf8_lossy(&rest[..len]).into_owned();
                (Some(name), &rest[len..])
            }
            None => (None, b),
        };
        let (slots, payload) = match payload.strip_prefix(SLOTS_TAG.as_slice()) {
            Some(rest) => {
                let slots = SlotSet::read(rest).ok_or("filter payload truncated in its slots")?;
                (Some(slots), &rest[crate::model::slotset::BYTES..])
            }
            None => (None, payload),
        };
        let (bloom, cov) = Bloom::from_bytes(payload)?;
        let mut v = FilterValue::new(bloom, cov);
        v.set = set;
        v.slots = slots;
        v.origin = origin;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(watermark: i64) -> FilterValue {
        let mut b = Bloom::new(1000, 0.01);
        b.add(1);
        FilterValue::built(b, watermark, "s")
    }

    #[test]
    fn the_payload_names_its_set() {
        let v = built(100);
        let loaded = FilterValue::from_bytes(&v.to_bytes()).unwrap();
        assert_eq!(loaded.set.as_deref(), Some("s"));
        assert!(loaded.belongs_to("s") && !loaded.belongs_to("t"));
        assert_eq!(loaded.bloom, v.bloom);
        // A payload from before the envelope: origin unknown, accepted.
        let legacy = FilterValue::from_bytes(&v.bloom.to_bytes(v.cov)).unwrap();
        assert!(legacy.set.is_none() && legacy.belongs_to("t"));
        // A mangled name is refused, not guessed.
        let mut bad = v.to_bytes();
        bad[crate::filter::origin::len(None) + 5] = b'A';
        assert!(FilterValue::from_bytes(&bad).is_err());
        assert!(FilterValue::from_bytes(b"LMSN").is_err());
        assert!(FilterValue::from_bytes(b"LMSN\x05ab").is_err());
        assert_eq!(
            v.clone().set.as_deref(),
            Some("s"),
            "a COPY keeps its origin"
        );
    }

    #[test]
    fn the_payload_keeps_the_slots_it_covers() {
        let mut v = built(100);
        assert!(v.covers(7), "no slot set: every slot");
        v.slots = Some([7u16, 9000].into_iter().collect());
        let loaded = FilterValue::from_bytes(&v.to_bytes()).unwrap();
        assert_eq!(loaded.slots, v.slots);
        assert!(loaded.covers(7) && loaded.covers(9000) && !loaded.covers(8));
        assert_eq!(loaded.set.as_deref(), Some("s"));
        assert_eq!(
            v.clone().slots,
            v.slots,
            "a COPY covers what its source covers"
        );
        let bytes = v.to_bytes();
        assert!(FilterValue::from_bytes(&bytes[..10]).is_err());
    }

    #[test]
    fn only_the_trusted_identity_is_trusted() {
        let v = built(100);
        assert!(v.trusted(Some(v.id)));
        assert!(!v.trusted(None));
        assert!(!v.trusted(Some(v.id + 1)));
        let copy = v.clone();
        assert_ne!(copy.id, v.id, "a COPY is a new value");
        assert!(!copy.trusted(Some(v.id)));
        let loaded = FilterValue::from_bytes(&v.to_bytes()).unwrap();
        assert_ne!(loaded.id, v.id, "a load is a new value");
        let partial = FilterValue::partial(Bloom::new(10, 0.01));
        assert!(
            !partial.trusted(Some(partial.id)),
            "incomplete is never trusted"
        );
    }

    #[test]
    fn a_pass_from_at_or_before_the_watermark_catches_the_value_up() {
        let mut v = built(100);
        assert_eq!(v.apply_sync(&[7], 90, 200), Some(v.id));
        assert_eq!(v.cov.watermark, Some(200));
        assert!(v.bloom.contains(7));
        // A pass that started past what the value covers adds its rows but proves nothing.
        let mut old = built(50);
        assert_eq!(old.apply_sync(&[8], 100, 300), None);
        assert_eq!(old.cov.watermark, Some(50));
        assert!(old.bloom.contains(8));
        // Never backwards.
        let mut v = built(500);
        assert_eq!(v.apply_sync(&[], 400, 450), Some(v.id));
        assert_eq!(v.cov.watermark, Some(500));
        // A partial filter has no watermark to catch up from.
        let mut p = FilterValue::partial(Bloom::new(10, 0.01));
        assert_eq!(p.apply_sync(&[9], 0, 10), None);
        assert!(p.bloom.contains(9));
    }

    /// Property test of the fp-cache as the funnel uses it: a lookup asks the database (its
    /// `asked` time taken first), the answer "absent" is remembered; ADDs go through
    /// `FilterValue::add`. Whatever the interleaving, hash collisions (same pair, same
    /// last-add slot) and table size, an item is never answered "known absent" once added,
    /// unless the database was asked again after that add.
    mod props {
        use super::*;
        use proptest::prelude::*;
        use std::time::{Duration, Instant};

        #[derive(Clone, Debug)]
        enum Step {
            /// A lookup of item `i` starts: its database query is asked now.
            Ask(usize),
            /// The database answers that lookup "absent": remembered, at most `cap` entries.
            Absent(usize, usize),
            /// MEMBER.ADD (or a replicated ADD, or the sync loop) adds item `i`.
            Add(usize),
            /// A lookup checks the fp-cache.
            Check(usize),
        }

        fn step(items: usize) -> impl Strategy<Value = Step> {
            let cap = prop::sample::select(vec![0usize, 1, 2, 4, 64, 1024, 16384]);
            prop_oneof![
                (0..items).prop_map(Step::Ask),
                ((0..items), cap).prop_map(|(i, c)| Step::Absent(i, c)),
                (0..items).prop_map(Step::Add),
                (0..items).prop_map(Step::Check),
            ]
        }

        /// Hashes that collide a lot: low bits from a small range (the table's pair and the
        /// last-add slot come from them), a few high bits.
        fn items() -> impl Strategy<Value = Vec<u128>> {
            prop::collection::vec(
                (0u128..4096, 0u128..4).prop_map(|(lo, hi)| lo | (hi << 64)),
                1..8,
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            #[test]
            fn a_remembered_false_positive_is_never_answered_after_an_add(
                hashes in items(),
                steps in prop::collection::vec(step(8), 1..80),
            ) {
                let mut v = built(1);
                let n = hashes.len();
                // Per item: when its pending lookup was asked (and at which step), the step of
                // its last add, and the step at which the newest remembered answer was asked.
                let mut asked: Vec<Option<(Instant, usize)>> = vec![None; n];
                let mut added_at: Vec<Option<usize>> = vec![None; n];
                let mut remembered_ask: Vec<Option<usize>> = vec![None; n];
                for (t, s) in steps.into_iter().enumerate() {
                    match s {
                        Step::Ask(i) => asked[i % n] = Some((Instant::now(), t)),
                        Step::Absent(i, cap) => {
                            let i = i % n;
                            if let Some((at, when)) = asked[i].take() {
                                let now = Instant::now();
                                let until = now + Duration::from_secs(60);
                                v.known_absent.insert(hashes[i], at, until, now, cap);
                                remembered_ask[i] = remembered_ask[i].max(Some(when));
                            }
                        }
                        Step::Add(i) => {
                            let i = i % n;
                            v.add(hashes[i]);
                            added_at[i] = Some(t);
                        }
                        Step::Check(i) => {
                            let i = i % n;
                            let h = hashes[i];
                            if added_at[i].is_some() {
                                prop_assert!(v.bloom.contains(h), "an added item is in the filter");
                            }
                            if v.known_absent.contains(h) {
                                // Some item with this hash was answered absent by a lookup
                                // asked after every add of that hash.
                                let same: Vec<usize> = (0..n).filter(|&j| hashes[j] == h).collect();
                                let last_add = same.iter().filter_map(|&j| added_at[j]).max();
                                let newest_ask = same.iter().filter_map(|&j| remembered_ask[j]).max();
                                prop_assert!(newest_ask.is_some());
                                prop_assert!(
                                    last_add.is_none_or(|a| newest_ask.unwrap() > a),
                                    "known absent after an add (step {})", t
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
