//! The Bloom gate as plain Rust: sizing, probing, fill estimates and a versioned binary form.
//! No server calls here; `filter_type.rs` wraps it as a Valkey data type.

use xxhash_rust::xxh3::xxh3_64;

/// Magic and version in front of every serialized filter.
const MAGIC: &[u8; 4] = b"LMBF";
/// Version 2: the watermark is a transaction id (docs/sync.md). Version 1 held a timestamp
/// (µs) that cannot be converted: such a payload loads as incomplete, with no watermark, so it
/// never answers "absent" and is rebuilt.
pub const FORMAT_VERSION: u16 = 2;
/// The version whose watermark was a timestamp.
const FORMAT_V1_TIMESTAMP: u16 = 1;
const HEADER_LEN: usize = 4 + 2 + 2 + 8 + 8 + 8 + 8 + 8 + 1 + 8 + 8;

/// What a filter knows about its own coverage of the table, persisted with its bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coverage {
    /// Built from the whole table (CREATE, rebuild), not just from writes seen since.
    pub complete: bool,
    /// Sync watermark, a transaction id (`xid8`): every active row written by a transaction
    /// with a smaller id is in the filter (docs/sync.md).
    pub watermark: Option<i64>,
}

/// Largest filter we will allocate or load: 8 GiB of bits.
pub const MAX_BITS: u64 = 1 << 36;

/// Bits and hash count for `capacity` items at false-positive rate `fpr`:
/// m = -n ln p / (ln 2)^2 rounded up to whole 64-bit words, k = round(m/n ln 2).
pub fn size_for(capacity: u64, fpr: f64) -> (u64, u32) {
    let n = capacity.max(1) as f64;
    let ln2 = std::f64::consts::LN_2;
    let m = (-(n * fpr.ln()) / (ln2 * ln2)).ceil().max(64.0);
    let m = ((m as u64).div_ceil(64) * 64).min(MAX_BITS);
    let k = ((m as f64 / n) * ln2).round().clamp(1.0, 30.0) as u32;
    (m, k)
}

/// Bytes of the bit array a filter for `capacity` items at `fpr` needs, without the
/// `MAX_BITS` cap that `size_for` applies: what a size check must compare.
pub fn bytes_for(capacity: u64, fpr: f64) -> u64 {
    if !(fpr > 0.0 && fpr < 1.0) {
        return u64::MAX;
    }
    let n = capacity.max(1) as f64;
    let ln2 = std::f64::consts::LN_2;
    let m = (-(n * fpr.ln()) / (ln2 * ln2)).ceil().max(64.0);
    if !m.is_finite() || m >= (u64::MAX / 2) as f64 {
        return u64::MAX;
    }
    (m as u64).div_ceil(64) * 8
}

/// Why a filter could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// It would need `needed` bytes, more than the ceiling `max` allows.
    TooLarge { needed: u64, max: u64 },
    /// The allocator refused `bytes`.
    NoMemory { bytes: u64 },
}

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SizeError::TooLarge { needed, max } => write!(
                f,
                "the filter would need {needed} bytes ({:.2} GiB), more than member.max-filter-bytes \
                 ({max} bytes); lower CAPACITY or raise ERROR (or the ceiling)",
                *needed as f64 / (1u64 << 30) as f64
            ),
            SizeError::NoMemory { bytes } => {
                write!(f, "out of memory allocating a filter of {bytes} bytes")
            }
        }
    }
}

/// A Bloom filter over 128-bit item hashes (see `canon::hash_parts`), using enhanced double
/// hashing: one hash per item, k positions derived from its two halves.
#[derive(Clone, Debug, PartialEq)]
pub struct Bloom {
    bits: Vec<u64>,
    k: u32,
    /// Number of `add` calls that set at least one new bit (an estimate of distinct items).
    items: u64,
    /// Number of bits set, kept exact so fill and FPR estimates are O(1).
    ones: u64,
    /// Capacity and rate the filter was sized for.
    capacity: u64,
    fpr: f64,
}

/// How many items ahead `add_many` prefetches.
const PREFETCH_AHEAD: usize = 8;

/// A hint to bring `w`'s cache line in; nothing else (a no-op off x86-64).
#[inline(always)]
fn prefetch(w: &u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache; `w` is a valid reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (w as *const u64).cast::<i8>(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
}

#[inline]
fn reduce(x: u64, m: u64) -> u64 {
    ((x as u128 * m as u128) >> 64) as u64
}

/// Refuses a filter for `capacity` items at `fpr` that would not fit in `max_bytes` (nor in
/// `MAX_BITS`), before anything is allocated.
pub fn check_size(capacity: u64, fpr: f64, max_bytes: u64) -> Result<(), SizeError> {
    let needed = bytes_for(capacity, fpr);
    let max = max_bytes.min(MAX_BITS / 8);
    if needed > max {
        return Err(SizeError::TooLarge { needed, max });
    }
    Ok(())
}

impl Bloom {
    /// A filter for `capacity` items at `fpr`, if it fits in `max_bytes` (and `MAX_BITS`) and
    /// the allocator grants it: never a smaller filter than the rate needs, never an abort.
    pub fn try_new(capacity: u64, fpr: f64, max_bytes: u64) -> Result<Self, SizeError> {
        check_size(capacity, fpr, max_bytes)?;
        let needed = bytes_for(capacity, fpr);
        let (m, k) = size_for(capacity, fpr);
        let words = (m / 64) as usize;
        let mut bits: Vec<u64> = Vec::new();
        bits.try_reserve_exact(words)
            .map_err(|_| SizeError::NoMemory { bytes: needed })?;
        bits.resize(words, 0);
        Ok(Bloom {
            bits,
            k,
            items: 0,
            ones: 0,
            capacity,
            fpr,
        })
    }

    /// A filter for `capacity` items at `fpr`, capped at `MAX_BITS` (tests and small sizes;
    /// anything sized from user input goes through `try_new`).
    pub fn new(capacity: u64, fpr: f64) -> Self {
        let (m, k) = size_for(capacity, fpr);
        Bloom {
            bits: vec![0; (m / 64) as usize],
            k,
            items: 0,
            ones: 0,
            capacity,
            fpr,
        }
    }

    #[inline]
    fn positions(&self, hash: u128) -> impl Iterator<Item = u64> {
        let m = self.bits.len() as u64 * 64;
        let mut h1 = hash as u64;
        let mut h2 = (hash >> 64) as u64 | 1;
        (0..self.k).map(move |i| {
            let p = reduce(h1, m);
            h1 = h1.wrapping_add(h2);
            h2 = h2.wrapping_add(i as u64);
            p
        })
    }

    /// Sets the item's bits. Returns true when at least one bit was new.
    pub fn add(&mut self, hash: u128) -> bool {
        let mut new = 0;
        for p in self.positions(hash) {
            let (w, b) = ((p / 64) as usize, p % 64);
            let mask = 1u64 << b;
            // Branch-free: whether a bit is new is a coin toss the predictor cannot learn.
            let old = self.bits[w];
            self.bits[w] = old | mask;
            new += (old & mask == 0) as u64;
        }
        self.ones += new;
        if new > 0 {
            self.items += 1;
        }
        new > 0
    }

    /// `add` for many items at once (a rebuild's fill): the bit array is larger than the
    /// caches, so each item's words are prefetched a few items ahead and the misses overlap
    /// instead of being paid one after another.
    pub fn add_many(&mut self, hashes: &[u128]) {
        const AHEAD: usize = PREFETCH_AHEAD;
        for i in 0..hashes.len() {
            if let Some(&next) = hashes.get(i + AHEAD) {
                for p in self.positions(next) {
                    prefetch(&self.bits[(p / 64) as usize]);
                }
            }
            self.add(hashes[i]);
        }
    }

    /// False means the item was never added. True means "possibly".
    #[inline]
    pub fn contains(&self, hash: u128) -> bool {
        self.positions(hash)
            .all(|p| self.bits[(p / 64) as usize] & (1u64 << (p % 64)) != 0)
    }

    pub fn bits(&self) -> u64 {
        self.bits.len() as u64 * 64
    }
    pub fn hashes(&self) -> u32 {
        self.k
    }
    pub fn items(&self) -> u64 {
        self.items
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn configured_fpr(&self) -> f64 {
        self.fpr
    }
    pub fn bytes(&self) -> usize {
        self.bits.len() * 8 + std::mem::size_of::<Self>()
    }
    /// Fraction of bits set.
    pub fn fill(&self) -> f64 {
        self.ones as f64 / self.bits() as f64
    }
    /// Current false-positive probability estimated from the fill: fill^k.
    pub fn estimated_fpr(&self) -> f64 {
        self.fill().powi(self.k as i32)
    }

    /// Serialized form: magic, version, k, bits, items, ones, capacity, fpr, complete flag,
    /// watermark (i64::MIN for none), xxh3 checksum of the bit array, then the bit array
    /// (all little endian).
    pub fn to_bytes(&self, cov: Coverage) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.serialized_len());
        self.write_bytes(cov, &mut out);
        out
    }

    /// Length of `to_bytes` output.
    pub fn serialized_len(&self) -> usize {
        HEADER_LEN + self.bits.len() * 8
    }

    /// `to_bytes`, appended to `out` (after whatever envelope the caller wrote).
    pub fn write_bytes(&self, cov: Coverage, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.k as u16).to_le_bytes());
        out.extend_from_slice(&self.bits().to_le_bytes());
        out.extend_from_slice(&self.items.to_le_bytes());
        out.extend_from_slice(&self.ones.to_le_bytes());
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&self.fpr.to_le_bytes());
        out.push(cov.complete as u8);
        out.extend_from_slice(&cov.watermark.unwrap_or(i64::MIN).to_le_bytes());
        let body_at = out.len() + 8;
        out.extend_from_slice(&[0; 8]);
        // One resize and fixed-size copies: a per-word extend checked capacity per word and
        // took ~1 ms per 2 MB of filter.
        out.resize(body_at + self.bits.len() * 8, 0);
        for (dst, w) in out[body_at..].chunks_exact_mut(8).zip(&self.bits) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
        let sum = xxh3_64(&out[body_at..]);
        out[body_at - 8..body_at].copy_from_slice(&sum.to_le_bytes());
    }

    /// Parses `to_bytes` output, rejecting anything it cannot fully verify.
    pub fn from_bytes(b: &[u8]) -> Result<(Bloom, Coverage), String> {
        if b.len() < HEADER_LEN {
            return Err(format!("filter payload too short ({} bytes)", b.len()));
        }
        if &b[0..4] != MAGIC {
            return Err("filter payload has an unknown magic".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let version = u16_at(4);
        if version != FORMAT_VERSION && version != FORMAT_V1_TIMESTAMP {
            return Err(format!(
                "filter payload version {version} is not supported (this build reads {FORMAT_VERSION})"
            ));
        }
        let k = u16_at(6) as u32;
        let m = u64_at(8);
        let items = u64_at(16);
        let ones = u64_at(24);
        let capacity = u64_at(32);
        let fpr = f64::from_bits(u64_at(40));
        let complete = match b[48] {
            0 => false,
            1 => true,
            x => return Err(format!("filter payload has a bad completeness flag {x}")),
        };
        let watermark = match u64_at(49) as i64 {
            i64::MIN => None,
            w => Some(w),
        };
        // A timestamp watermark says nothing about transaction ids: rebuild.
        let (complete, watermark) = if version == FORMAT_V1_TIMESTAMP {
            (false, None)
        } else {
            (complete, watermark)
        };
        let sum = u64_at(57);
        if !(1..=30).contains(&k) || m == 0 || m % 64 != 0 || m > MAX_BITS {
            return Err(format!("filter payload has bad geometry (k={k}, m={m})"));
        }
        if !(fpr > 0.0 && fpr < 1.0) {
            return Err("filter payload has a bad error rate".into());
        }
        let body = &b[HEADER_LEN..];
        if body.len() as u64 != m / 8 {
            return Err(format!(
                "filter payload is truncated or padded: {} bit bytes, expected {}",
                body.len(),
                m / 8
            ));
        }
        if xxh3_64(body) != sum {
            return Err("filter payload checksum mismatch (corrupt data)".into());
        }
        let bits: Vec<u64> = body
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let real_ones: u64 = bits.iter().map(|w| w.count_ones() as u64).sum();
        if real_ones != ones {
            return Err("filter payload bit count mismatch (corrupt data)".into());
        }
        Ok((
            Bloom {
                bits,
                k,
                items,
                ones,
                capacity,
                fpr,
            },
            Coverage {
                complete,
                watermark,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::canon::hash_parts;

    fn h(i: u64) -> u128 {
        hash_parts(&format!("item-{i}"), "")
    }

    #[test]
    fn add_many_is_add_in_order() {
        let hs: Vec<u128> = (0..50_000).map(h).collect();
        let mut one_by_one = Bloom::new(20_000, 0.01);
        let mut new = 0;
        for h in &hs {
            new += one_by_one.add(*h) as u64;
        }
        let mut many = Bloom::new(20_000, 0.01);
        many.add_many(&hs);
        assert_eq!(one_by_one, many);
        assert_eq!(many.items(), new);
        assert!(hs.iter().all(|h| many.contains(*h)));
    }

    #[test]
    fn sizing_matches_the_bloom_optimum() {
        let (m, k) = size_for(1_000_000, 0.01);
        let bits_per_item = m as f64 / 1e6;
        assert!((9.58..9.62).contains(&bits_per_item), "{bits_per_item}");
        assert_eq!(k, 7);
        let (m, k) = size_for(1000, 0.001);
        assert!((14.3..14.5).contains(&(m as f64 / 1000.0)));
        assert_eq!(k, 10);
        assert_eq!(size_for(0, 0.01).0 % 64, 0);
    }

    #[test]
    fn try_new_refuses_what_the_ceiling_or_the_rate_forbids() {
        // 1 % needs 9.59 bits a member: 1 000 000 members fit in 2 MB, not in 1 MB.
        assert!(Bloom::try_new(1_000_000, 0.01, 2 << 20).is_ok());
        match Bloom::try_new(1_000_000, 0.01, 1 << 20) {
            Err(SizeError::TooLarge { needed, max }) => {
                assert_eq!(max, 1 << 20);
                assert_eq!(needed, bytes_for(1_000_000, 0.01));
                assert!(needed > 1_190_000 && needed < 1_210_000, "{needed}");
            }
            other => panic!("{other:?}"),
        }
        // 4·10⁹ members at 10⁻⁶ need ~14 GB: refused even with no ceiling, never capped.
        let e = Bloom::try_new(4_000_000_000, 0.000001, u64::MAX).unwrap_err();
        assert!(matches!(e, SizeError::TooLarge { needed, .. } if needed > 14_000_000_000));
        assert!(e.to_string().contains("member.max-filter-bytes"));
    }

    #[test]
    fn bytes_for_matches_size_for_below_the_cap() {
        for (n, p) in [
            (1, 0.5),
            (1000, 0.01),
            (123_457, 0.001),
            (10_000_000, 0.000001),
        ] {
            assert_eq!(bytes_for(n, p), size_for(n, p).0 / 8, "{n} {p}");
        }
        assert_eq!(bytes_for(1, f64::NAN), u64::MAX);
    }

    #[test]
    fn no_false_negatives() {
        let mut b = Bloom::new(10_000, 0.01);
        for i in 0..10_000 {
            b.add(h(i));
        }
        assert!((0..10_000).all(|i| b.contains(h(i))));
    }

    #[test]
    fn measured_fpr_is_close_to_configured() {
        for (seed, fpr) in [(0u64, 0.01), (7, 0.001)] {
            let n = 50_000;
            let mut b = Bloom::new(n, fpr);
            for i in 0..n {
                b.add(h(seed * 10_000_000 + i));
            }
            let probes = 200_000u64;
            let fp = (0..probes)
                .filter(|i| b.contains(h(seed * 10_000_000 + 5_000_000 + i)))
                .count() as f64;
            let measured = fp / probes as f64;
            assert!(
                (measured - fpr).abs() < fpr * 0.25,
                "configured {fpr}, measured {measured}"
            );
            assert!((b.estimated_fpr() - fpr).abs() < fpr * 0.25);
        }
    }

    #[test]
    fn roundtrip_keeps_everything() {
        let mut b = Bloom::new(1000, 0.01);
        for i in 0..500 {
            b.add(h(i));
        }
        let cov = Coverage {
            complete: true,
            watermark: Some(1_764_000_000_123_456),
        };
        let (c, got) = Bloom::from_bytes(&b.to_bytes(cov)).unwrap();
        assert_eq!(got, cov);
        assert_eq!(b, c);
        let none = Coverage {
            complete: false,
            watermark: None,
        };
        let (_, got) = Bloom::from_bytes(&b.to_bytes(none)).unwrap();
        assert_eq!(got, none);
    }

    #[test]
    fn version_1_payloads_load_incomplete() {
        let mut b = Bloom::new(1000, 0.01);
        b.add(h(1));
        let mut v1 = b.to_bytes(Coverage {
            complete: true,
            watermark: Some(1_764_000_000_123_456),
        });
        v1[4..6].copy_from_slice(&1u16.to_le_bytes());
        let (c, cov) = Bloom::from_bytes(&v1).unwrap();
        assert_eq!(c, b);
        assert_eq!(
            cov,
            Coverage {
                complete: false,
                watermark: None
            }
        );
    }

    #[test]
    fn corrupt_payloads_are_rejected() {
        let mut b = Bloom::new(1000, 0.01);
        b.add(h(1));
        let good = b.to_bytes(Coverage {
            complete: true,
            watermark: None,
        });
        assert!(Bloom::from_bytes(&good[..good.len() - 1]).is_err());
        assert!(Bloom::from_bytes(&good[..10]).is_err());
        assert!(Bloom::from_bytes(&[]).is_err());
        let mut flipped = good.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x10;
        assert!(Bloom::from_bytes(&flipped)
            .unwrap_err()
            .contains("checksum"));
        let mut version = good.clone();
        version[4] = 9;
        assert!(Bloom::from_bytes(&version).unwrap_err().contains("version"));
        version[4] = 0;
        assert!(Bloom::from_bytes(&version).unwrap_err().contains("version"));
        let mut magic = good;
        magic[0] = b'X';
        assert!(Bloom::from_bytes(&magic).is_err());
    }

    /// Property tests: whatever the sizing and the items, a filter never loses one, neither
    /// in memory nor through its persisted form.
    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn no_false_negatives(
                capacity in 0u64..4000,
                fpr in 0.000001f64..0.5,
                hashes in prop::collection::vec(any::<u128>(), 0..400),
                one_by_one in 0usize..400,
                watermark in prop::option::of(any::<i64>()),
            ) {
                let mut b = Bloom::new(capacity, fpr);
                let (first, rest) = hashes.split_at(one_by_one.min(hashes.len()));
                for h in first {
                    b.add(*h);
                }
                b.add_many(rest);
                for h in &hashes {
                    prop_assert!(b.contains(*h));
                }
                let cov = Coverage { complete: true, watermark: watermark.filter(|w| *w != i64::MIN) };
                let (loaded, got) = Bloom::from_bytes(&b.to_bytes(cov)).unwrap();
                prop_assert_eq!(got, cov);
                for h in &hashes {
                    prop_assert!(loaded.contains(*h));
                }
                prop_assert_eq!(loaded, b);
            }
        }
    }
}
