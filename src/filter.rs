//! The Bloom gate as plain Rust: sizing, probing, fill estimates and a versioned binary form.
//! No server calls here; `filter_type.rs` wraps it as a Valkey data type.
//!
//! Design (issue 11, measured in bench/PROFILE.md): a build (CREATE, REBUILD) puts the rows it
//! read into a static binary fuse filter (8-bit fingerprints: 9.04 bits a member, 0.39 %
//! false positives, three independent reads per probe); every add after the build (ADD, sync
//! passes, slot fills, the rebuild's journal) goes to a classic Bloom filter, the delta, which
//! the next build folds in. Rates below what the static part can give, and tiny sets, keep a
//! Bloom filter alone.
//!
//! The static part lives in `filter_static.rs`; both parts' arrays are `large_array.rs`
//! arrays, on huge pages from 8 MiB.

use xxhash_rust::xxh3::xxh3_64;

use super::filter_static::{Static, STATIC_HEADER_LEN};
use super::large_array::{prefetch, LargeArray, HUGE_FROM};

/// Magic and version in front of every serialized filter.
const MAGIC: &[u8; 4] = b"LMBF";
/// Version 4: the static part may be split into parts (`filter_static`): after the checksum a
/// part count and one header per part, the Bloom's words, then each part's fingerprints (the
/// checksum covers all). Version 3 (at most one part, its header always present) still
/// loads. Version 2 (a Bloom filter alone, the watermark a transaction id, docs/sync.md) loads
/// as a filter without a static part. Version 1 held a timestamp (µs) that cannot be
/// converted: such a payload loads as incomplete, with no watermark, so it never answers
/// "absent" and is rebuilt.
pub const FORMAT_VERSION: u16 = 4;
/// One static part at most, its header always there.
const FORMAT_V3_ONE_PART: u16 = 3;
/// The version before the static part: a Bloom filter alone.
const FORMAT_V2_BLOOM: u16 = 2;
/// The version whose watermark was a timestamp.
const FORMAT_V1_TIMESTAMP: u16 = 1;
/// Header of versions 1 and 2, and the first part of version 3's.
const HEADER_LEN: usize = 4 + 2 + 2 + 8 + 8 + 8 + 8 + 8 + 1 + 8 + 8;
/// Where the checksum sits (the last 8 bytes of `HEADER_LEN`).
const SUM_AT: usize = HEADER_LEN - 8;

/// False-positive rate of the static part: 8-bit fingerprints match by chance 1 in 256.
pub const STATIC_FPR: f64 = 1.0 / 256.0;
/// Fewest rows a build puts in a static part (below it a fuse filter costs more bits a
/// member than a Bloom filter, and the whole filter is a few hundred bytes anyway).
pub const STATIC_MIN_ITEMS: usize = 64;
/// The delta holds at least this share of the built rows (1/50: 2 %) on top of whatever
/// capacity the build did not use, so adds after a full build have room.
const DELTA_SHARE: u64 = 50;

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
    /// Huge pages when large (`large_array.rs`).
    bits: LargeArray<u64>,
    k: u32,
    /// Number of `add` calls that set at least one new bit (an estimate of distinct items).
    items: u64,
    /// Number of bits set, kept exact so fill and FPR estimates are O(1).
    ones: u64,
    /// Capacity and rate the filter was sized for.
    capacity: u64,
    fpr: f64,
    /// The members a build read, in a static filter; `bits`/`k`/`items`/`ones` are then the
    /// delta, which holds what was added since.
    frozen: Option<Static>,
}

/// The filter's design, as MEMBER.INFO names it.
pub const DESIGN_BLOOM: &str = "bloom";
/// A static part and a delta.
pub const DESIGN_FUSE: &str = "fuse8+bloom-delta";

/// How many items ahead `add_many` prefetches.
const PREFETCH_AHEAD: usize = 8;

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
        let bits =
            LargeArray::try_zeroed(words).map_err(|_| SizeError::NoMemory { bytes: needed })?;
        Ok(Bloom {
            bits,
            k,
            items: 0,
            ones: 0,
            capacity,
            fpr,
            frozen: None,
        })
    }

    /// A filter holding `hashes` (the rows a build read), sized for `capacity` members at
    /// `fpr`, if it fits in `max_bytes` and the allocator grants it. When the rate allows
    /// (at least twice `STATIC_FPR`) and there are enough rows, they go into a static part
    /// and the delta is a Bloom filter for the capacity left over (at least 1/50 of the rows)
    /// at the rest of the rate, `fpr - STATIC_FPR`: so the combined rate stays within `fpr`
    /// as long as the delta is within its capacity. Otherwise a Bloom filter alone, as
    /// `try_new` and `add_many` make it.
    pub fn build(
        capacity: u64,
        fpr: f64,
        max_bytes: u64,
        hashes: &[u128],
    ) -> Result<Self, SizeError> {
        check_size(capacity, fpr, max_bytes)?;
        if fpr >= 2.0 * STATIC_FPR && hashes.len() >= STATIC_MIN_ITEMS && fpr < 1.0 {
            if let Some(frozen) = Static::build(hashes) {
                let rows = hashes.len() as u64;
                let room = capacity.saturating_sub(rows).max(rows / DELTA_SHARE).max(1);
                let delta_fpr = fpr - STATIC_FPR;
                let delta_bytes = bytes_for(room, delta_fpr);
                let needed = delta_bytes.saturating_add(frozen.bytes() as u64);
                let max = max_bytes.min(MAX_BITS / 8);
                if needed > max {
                    return Err(SizeError::TooLarge { needed, max });
                }
                let mut b = Bloom::try_new(room, delta_fpr, max)?;
                b.capacity = capacity;
                b.fpr = fpr;
                b.frozen = Some(frozen);
                return Ok(b);
            }
        }
        let mut b = Bloom::try_new(capacity, fpr, max_bytes)?;
        b.add_many(hashes);
        Ok(b)
    }

    /// A filter for `capacity` items at `fpr`, capped at `MAX_BITS` (tests and small sizes;
    /// anything sized from user input goes through `try_new`).
    pub fn new(capacity: u64, fpr: f64) -> Self {
        let (m, k) = size_for(capacity, fpr);
        Bloom {
            bits: LargeArray::zeroed((m / 64) as usize),
            k,
            items: 0,
            ones: 0,
            capacity,
            fpr,
            frozen: None,
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

    /// Sets the item's bits in the delta. Returns true when at least one bit was new. An item
    /// the static part already answers "possibly" for needs no bits: that part never changes.
    pub fn add(&mut self, hash: u128) -> bool {
        if self.frozen.as_ref().is_some_and(|s| s.contains(hash)) {
            return false;
        }
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
    ///
    /// The static part first, then the delta bit by bit, stopping at the first clear bit: an
    /// absent item is read from both, but the static part's three reads are independent and
    /// the delta's first clear bit comes after about two reads. (Reading the delta first and
    /// without branches, so that the two parts' misses overlap, was measured and lost at
    /// 100 M members: 7 lines a probe instead of about 2; `contains_branch_free`,
    /// bench/PROFILE.md "Huge pages and the probe, measured".)
    #[inline]
    pub fn contains(&self, hash: u128) -> bool {
        if self.frozen.as_ref().is_some_and(|s| s.contains(hash)) {
            return true;
        }
        // An empty delta (right after a build) costs no memory access.
        self.ones != 0
            && self.positions(hash).all(|p| {
                // SAFETY: `positions` reduces into [0, 64 · bits.len()).
                let w = unsafe { *self.bits.get_unchecked((p / 64) as usize) };
                w & (1u64 << (p % 64)) != 0
            })
    }

    /// The alternative `contains` measured against it (bench/PROFILE.md): the delta first,
    /// its k bits read without a branch between them, then the static part. Kept for
    /// `benches/filter.rs`.
    #[doc(hidden)]
    pub fn contains_branch_free(&self, hash: u128) -> bool {
        let delta = self.ones != 0 && {
            let mut all = 1u64;
            for p in self.positions(hash) {
                all &= self.bits[(p / 64) as usize] >> (p % 64);
            }
            all & 1 != 0
        };
        delta || self.frozen.as_ref().is_some_and(|s| s.contains(hash))
    }

    /// Starts bringing in the lines `contains(hash)` will read, without waiting for them: a
    /// caller with many items (MEMBER.MEXISTS) prefetches a few items ahead so that their
    /// misses overlap, as `add_many` does.
    /// A filter smaller than `HUGE_FROM` mostly sits in the caches, where computing each
    /// probe's lines twice costs more than it saves (measured at 1 M members): nothing then.
    #[inline]
    pub fn prefetch(&self, hash: u128) {
        if self.bytes() < HUGE_FROM {
            return;
        }
        if self.ones != 0 {
            for p in self.positions(hash) {
                // SAFETY: `positions` reduces into [0, 64 · bits.len()).
                prefetch(unsafe { self.bits.get_unchecked((p / 64) as usize) });
            }
        }
        if let Some(s) = &self.frozen {
            s.prefetch(hash);
        }
    }

    /// Bits of memory the filter's parts hold (static fingerprints and delta).
    pub fn bits(&self) -> u64 {
        self.static_bits() + self.delta_bits()
    }
    /// Bits of the static part (0 without one).
    pub fn static_bits(&self) -> u64 {
        self.frozen.as_ref().map_or(0, |s| s.bytes() as u64 * 8)
    }
    /// Bits of the delta (the whole filter without a static part).
    pub fn delta_bits(&self) -> u64 {
        self.bits.len() as u64 * 64
    }
    /// Hash functions of the delta Bloom filter.
    pub fn hashes(&self) -> u32 {
        self.k
    }
    /// Members of both parts (the delta counts adds that set a new bit).
    pub fn items(&self) -> u64 {
        self.static_items() + self.items
    }
    /// Rows the last build put in the static part.
    pub fn static_items(&self) -> u64 {
        self.frozen.as_ref().map_or(0, |s| s.items)
    }
    /// Fuse filters the static part is split into (0 without one; `filter_static`).
    pub fn static_parts(&self) -> usize {
        self.frozen.as_ref().map_or(0, Static::parts)
    }
    /// Members added to the delta since the build.
    pub fn delta_items(&self) -> u64 {
        self.items
    }
    /// `DESIGN_FUSE` with a static part, else `DESIGN_BLOOM`.
    pub fn design(&self) -> &'static str {
        if self.frozen.is_some() {
            DESIGN_FUSE
        } else {
            DESIGN_BLOOM
        }
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn configured_fpr(&self) -> f64 {
        self.fpr
    }
    pub fn bytes(&self) -> usize {
        self.bits.len() * 8
            + self.frozen.as_ref().map_or(0, Static::bytes)
            + std::mem::size_of::<Self>()
    }
    /// Fraction of the delta's bits set.
    pub fn fill(&self) -> f64 {
        self.ones as f64 / self.delta_bits() as f64
    }
    /// False-positive probability of the static part: `STATIC_FPR`, 0 without one.
    pub fn static_fpr(&self) -> f64 {
        if self.frozen.is_some() {
            STATIC_FPR
        } else {
            0.0
        }
    }
    /// The delta's current false-positive probability, from its fill: fill^k.
    pub fn delta_fpr(&self) -> f64 {
        self.fill().powi(self.k as i32)
    }
    /// Current false-positive probability of the whole filter: an absent item passes when
    /// either part lets it through, 1 - (1 - static)(1 - delta).
    pub fn estimated_fpr(&self) -> f64 {
        1.0 - (1.0 - self.static_fpr()) * (1.0 - self.delta_fpr())
    }

    /// Serialized form (version 3): magic, version, k, bits, items, ones, capacity, fpr of
    /// the delta header, complete flag, watermark (i64::MIN for none), xxh3 checksum of
    /// everything after it, the static header (`Static::write_header`), the delta's bit
    /// array, the static fingerprints (all little endian).
    pub fn to_bytes(&self, cov: Coverage) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.serialized_len());
        self.write_bytes(cov, &mut out);
        out
    }

    /// Length of `to_bytes` output.
    pub fn serialized_len(&self) -> usize {
        HEADER_LEN
            + Static::header_len(self.frozen.as_ref())
            + self.bits.len() * 8
            + self.frozen.as_ref().map_or(0, Static::bytes)
    }

    /// `to_bytes`, appended to `out` (after whatever envelope the caller wrote).
    pub fn write_bytes(&self, cov: Coverage, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.k as u16).to_le_bytes());
        out.extend_from_slice(&self.delta_bits().to_le_bytes());
        out.extend_from_slice(&self.items.to_le_bytes());
        out.extend_from_slice(&self.ones.to_le_bytes());
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&self.fpr.to_le_bytes());
        out.push(cov.complete as u8);
        out.extend_from_slice(&cov.watermark.unwrap_or(i64::MIN).to_le_bytes());
        let sum_at = out.len();
        out.extend_from_slice(&[0; 8]);
        Static::write_header(self.frozen.as_ref(), out);
        let words_at = out.len();
        // One resize and fixed-size copies: a per-word extend checked capacity per word and
        // took ~1 ms per 2 MB of filter.
        out.resize(words_at + self.bits.len() * 8, 0);
        for (dst, w) in out[words_at..].chunks_exact_mut(8).zip(self.bits.iter()) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
        if let Some(s) = &self.frozen {
            s.write_fingerprints(out);
        }
        let sum = xxh3_64(&out[sum_at + 8..]);
        out[sum_at..sum_at + 8].copy_from_slice(&sum.to_le_bytes());
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
        if ![
            FORMAT_VERSION,
            FORMAT_V3_ONE_PART,
            FORMAT_V2_BLOOM,
            FORMAT_V1_TIMESTAMP,
        ]
        .contains(&version)
        {
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
        let sum = u64_at(SUM_AT);
        if !(1..=30).contains(&k) || m == 0 || m % 64 != 0 || m > MAX_BITS {
            return Err(format!("filter payload has bad geometry (k={k}, m={m})"));
        }
        if !(fpr > 0.0 && fpr < 1.0) {
            return Err("filter payload has a bad error rate".into());
        }
        // The checksum covers everything after the header: checked first, so that a damaged
        // byte anywhere is reported as such rather than as whatever field it landed in.
        if xxh3_64(&b[HEADER_LEN..]) != sum {
            return Err("filter payload checksum mismatch (corrupt data)".into());
        }
        // Versions 1 and 2: the bit array follows the header. Versions 3 and 4: the static
        // header(s), the bit array, the fingerprints.
        let (frozen_headers, words_at) = match version {
            FORMAT_VERSION => {
                let (h, len) = Static::read_header(&b[HEADER_LEN..])?;
                (h, HEADER_LEN + len)
            }
            FORMAT_V3_ONE_PART => {
                let h = b
                    .get(HEADER_LEN..HEADER_LEN + STATIC_HEADER_LEN)
                    .ok_or("filter payload truncated in its static header")?;
                (Static::read_header_v3(h)?, HEADER_LEN + STATIC_HEADER_LEN)
            }
            _ => (Vec::new(), HEADER_LEN),
        };
        let fp_len = Static::fingerprint_len(&frozen_headers);
        let expected = (m / 8).saturating_add(fp_len as u64);
        let body_len = (b.len() - words_at) as u64;
        if body_len != expected {
            return Err(format!(
                "filter payload is truncated or padded: {body_len} body bytes, expected {expected}"
            ));
        }
        let words_end = words_at + (m / 8) as usize;
        let frozen = Static::load(frozen_headers, &b[words_end..])?;
        let mut bits = LargeArray::try_zeroed((m / 64) as usize)
            .map_err(|_| format!("out of memory loading a filter of {} bytes", m / 8))?;
        for (w, c) in bits.iter_mut().zip(b[words_at..words_end].chunks_exact(8)) {
            *w = u64::from_le_bytes(c.try_into().unwrap());
        }
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
                frozen,
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

    /// A uniform 128-bit hash per `i`, like the canonical hash of an item (xxh3-128); no
    /// other module, so `benches/filter.rs` can include this file.
    fn h(i: u64) -> u128 {
        xxhash_rust::xxh3::xxh3_128(format!("item-{i}").as_bytes())
    }

    /// The share of `probes` items `h(from..)`, never added, that `b` lets through.
    fn measured_fpr(b: &Bloom, from: u64, probes: u64) -> f64 {
        let fp = (0..probes).filter(|i| b.contains(h(from + i))).count();
        fp as f64 / probes as f64
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
            let measured = measured_fpr(&b, seed * 10_000_000 + 5_000_000, 200_000);
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
        // Version 1 had version 2's layout (tests below); only its watermark meant a time.
        let mut v1 = include_bytes!("testdata/filter-v2.bin").to_vec();
        v1[4..6].copy_from_slice(&1u16.to_le_bytes());
        let (c, cov) = Bloom::from_bytes(&v1).unwrap();
        assert!((0..300).all(|i| c.contains(fixture_hash(i))));
        assert_eq!(
            cov,
            Coverage {
                complete: false,
                watermark: None
            }
        );
    }

    fn built(rows: u64, capacity: u64, fpr: f64) -> (Bloom, Vec<u128>) {
        let hs: Vec<u128> = (0..rows).map(h).collect();
        (Bloom::build(capacity, fpr, u64::MAX, &hs).unwrap(), hs)
    }

    #[test]
    fn a_build_puts_its_rows_in_the_static_part() {
        let (b, hs) = built(20_000, 20_000, 0.01);
        assert_eq!(b.design(), DESIGN_FUSE);
        assert_eq!(
            (b.static_items(), b.delta_items(), b.items()),
            (20_000, 0, 20_000)
        );
        assert!(hs.iter().all(|&x| b.contains(x)));
        // 9.8 bits a row in a fuse filter of 20 000 (9.0 from a million on), plus a delta for
        // 2 % of the rows at 0.61 %.
        let per_member = b.bits() as f64 / 20_000.0;
        assert!((9.0..10.3).contains(&per_member), "{per_member}");
        assert!(b.static_bits() > b.delta_bits() * 20);
        assert_eq!(b.estimated_fpr(), STATIC_FPR);
        let measured = measured_fpr(&b, 50_000_000, 400_000);
        assert!(
            (measured - STATIC_FPR).abs() < STATIC_FPR * 0.15,
            "measured {measured}"
        );
    }

    #[test]
    fn adds_after_a_build_go_to_the_delta() {
        let (mut b, hs) = built(10_000, 12_000, 0.01);
        assert!(!b.add(hs[7]), "a built row needs no new bits");
        assert_eq!(b.delta_items(), 0);
        let new: Vec<u128> = (100_000..102_000).map(h).collect();
        b.add_many(&new);
        assert!(b.delta_items() > 1_950, "{}", b.delta_items());
        assert!(new.iter().chain(&hs).all(|&x| b.contains(x)));
        // The delta was sized for the 2 000 members of capacity left: within its rate.
        assert!(
            b.delta_fpr() < (0.01 - STATIC_FPR) * 1.1,
            "{}",
            b.delta_fpr()
        );
        let est = b.estimated_fpr();
        assert!(est > STATIC_FPR && est < 0.0105, "{est}");
        let measured = measured_fpr(&b, 50_000_000, 400_000);
        assert!(
            (measured - est).abs() < est * 0.15,
            "measured {measured}, est {est}"
        );
    }

    #[test]
    fn rates_below_twice_the_static_rate_and_tiny_builds_stay_bloom() {
        let (b, hs) = built(5_000, 5_000, 0.001);
        assert_eq!(b.design(), DESIGN_BLOOM);
        assert!(hs.iter().all(|&x| b.contains(x)));
        assert_eq!(b.items(), 5_000);
        let (b, _) = built(STATIC_MIN_ITEMS as u64 - 1, 1000, 0.01);
        assert_eq!(b.design(), DESIGN_BLOOM);
        // Duplicates (rows that canonicalize alike) are one member.
        let mut hs: Vec<u128> = (0..1000).map(h).collect();
        hs.extend_from_within(..500);
        let b = Bloom::build(1000, 0.01, u64::MAX, &hs).unwrap();
        assert_eq!(b.design(), DESIGN_FUSE);
        assert!(hs.iter().all(|&x| b.contains(x)));
    }

    #[test]
    fn a_build_refuses_what_the_ceiling_forbids() {
        let hs: Vec<u128> = (0..10_000).map(h).collect();
        assert!(matches!(
            Bloom::build(10_000, 0.01, 4096, &hs),
            Err(SizeError::TooLarge { .. })
        ));
        assert!(Bloom::build(10_000, 0.01, 20_000, &hs).is_ok());
    }

    #[test]
    fn roundtrip_keeps_both_parts() {
        let (mut b, _) = built(3_000, 3_000, 0.02);
        for i in 0..40 {
            b.add(h(1_000_000 + i));
        }
        assert_eq!(b.design(), DESIGN_FUSE);
        round_trip(&b, 42);
    }

    /// `b` through its payload (complete, `watermark`) comes back equal; the payload.
    fn round_trip(b: &Bloom, watermark: i64) -> Vec<u8> {
        let cov = Coverage {
            complete: true,
            watermark: Some(watermark),
        };
        let bytes = b.to_bytes(cov);
        assert_eq!(bytes.len(), b.serialized_len());
        assert_eq!(Bloom::from_bytes(&bytes).unwrap(), (b.clone(), cov));
        bytes
    }

    /// A version 2 payload written by the filter of commit 56518fe (before the static part):
    /// `Bloom::new(1000, 0.01)`, the first 300 of `fixture_hash`, complete, watermark 777.
    #[test]
    fn version_2_payloads_load_as_a_bloom_filter() {
        let b = load_fixture(include_bytes!("testdata/filter-v2.bin"), 2, 777);
        assert_eq!(b.design(), DESIGN_BLOOM);
        assert_eq!(
            (b.capacity(), b.configured_fpr(), b.hashes()),
            (1000, 0.01, 7)
        );
        assert_eq!(b.items(), 300);
        assert!((0..300).all(|i| b.contains(fixture_hash(i))));
        let fp = (300..100_300)
            .filter(|&i| b.contains(fixture_hash(i)))
            .count();
        assert!(fp < 1_000, "{fp}");
    }

    /// A payload written by an older version (`version`, complete, `watermark`): loaded, and
    /// written back in the current version unchanged in meaning.
    fn load_fixture(bytes: &[u8], version: u16, watermark: i64) -> Bloom {
        assert_eq!(&bytes[4..6], &version.to_le_bytes());
        let (b, cov) = Bloom::from_bytes(bytes).unwrap();
        let want = Coverage {
            complete: true,
            watermark: Some(watermark),
        };
        assert_eq!(cov, want);
        let again = b.to_bytes(cov);
        assert_eq!(&again[4..6], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(Bloom::from_bytes(&again).unwrap(), (b.clone(), want));
        b
    }

    /// A version 3 payload written by the filter of commit 551fcb0 (one static part, its
    /// header always present): `Bloom::build(25_000, 0.01, …)` of the first 20 000 of
    /// `fixture_hash`, then the next 100 added, complete, watermark 888.
    #[test]
    fn version_3_payloads_load_with_one_static_part() {
        let b = load_fixture(include_bytes!("testdata/filter-v3.bin"), 3, 888);
        assert_eq!(b.design(), DESIGN_FUSE);
        // One of the 100 adds was already a "possibly" of the static part: no delta bits.
        assert_eq!((b.static_items(), b.delta_items()), (20_000, 99));
        assert_eq!(b.frozen.as_ref().map(Static::parts), Some(1));
        assert!((0..20_100).all(|i| b.contains(fixture_hash(i))));
        let fp = (30_000..130_000)
            .filter(|&i| b.contains(fixture_hash(i)))
            .count();
        assert!(fp < 1_500, "{fp}");
    }

    /// A static part split into any number of parts keeps every member, keeps the rate of
    /// one, and survives its payload.
    #[test]
    fn a_static_part_in_parts_keeps_its_members() {
        let hs: Vec<u128> = (0..200_000).map(h).collect();
        for parts in [1usize, 2, 3, 7, super::super::filter_static::MAX_PARTS] {
            let mut b = Bloom::build(200_000, 0.01, u64::MAX, &hs[..100]).unwrap();
            b.frozen = Some(Static::build_in(&hs, parts).unwrap());
            assert_eq!(b.frozen.as_ref().map(Static::parts), Some(parts));
            assert_eq!(b.static_items(), 200_000);
            assert!(hs.iter().all(|&x| b.contains(x)), "{parts} parts");
            let rate = measured_fpr(&b, 10_000_000, 200_000);
            assert!((0.003..0.0052).contains(&rate), "{parts} parts: {rate}");
            let bytes = round_trip(&b, 5);
            // A payload one part short of its count is refused, not misread.
            let mut short = bytes.clone();
            short[HEADER_LEN] = parts as u8 + 1;
            let sum = xxh3_64(&short[HEADER_LEN..]);
            short[SUM_AT..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
            assert!(Bloom::from_bytes(&short).is_err());
        }
    }

    /// The item hashes of the version 2 and 3 fixtures.
    fn fixture_hash(i: u64) -> u128 {
        (i as u128 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    }

    #[test]
    fn a_bad_static_header_is_rejected() {
        let (b, _) = built(1_000, 1_000, 0.01);
        let good = b.to_bytes(Coverage {
            complete: true,
            watermark: None,
        });
        // Each field of the static header, changed, with the checksum made right again: the
        // geometry checks, not only the checksum, refuse it.
        // The part count comes first (this one has 1), then the part's header.
        let fields = [(0usize, 2u8), (0, 0), (0, 17), (1, 2), (1, 0), (18, 0x7f)];
        for (at, v) in fields.into_iter().chain([(22, 0), (26, 1), (30, 3)]) {
            let mut bad = good.clone();
            bad[HEADER_LEN + at] = v;
            let sum = xxh3_64(&bad[HEADER_LEN..]);
            bad[SUM_AT..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
            assert!(Bloom::from_bytes(&bad).is_err(), "field at {at} = {v}");
        }
        let mut cut = good.clone();
        cut.truncate(HEADER_LEN + 5);
        assert!(Bloom::from_bytes(&cut).is_err());
        let mut flipped = good;
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(Bloom::from_bytes(&flipped)
            .unwrap_err()
            .contains("checksum"));
    }

    /// A filter large enough for huge pages (a delta with room for 10 M members, ~13 MB)
    /// keeps every member, in memory and through its payload, and loads advised again.
    #[test]
    fn a_huge_page_filter_keeps_its_members() {
        use super::super::large_array::{HUGE_FROM, HUGE_PAGE};
        let hs: Vec<u128> = (0..5_000).map(h).collect();
        let mut b = Bloom::build(10_005_000, 0.01, u64::MAX, &hs).unwrap();
        assert_eq!(b.design(), DESIGN_FUSE);
        assert!(b.delta_bits() / 8 >= (HUGE_FROM + 2 * HUGE_PAGE) as u64);
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"));
        assert_eq!(b.bits.advised(), thp);
        let added: Vec<u128> = (1_000_000..1_060_000).map(h).collect();
        b.add_many(&added);
        for i in 1_060_000..1_061_000 {
            b.add(h(i));
        }
        let all = || {
            hs.iter()
                .copied()
                .chain(added.iter().copied())
                .chain((1_060_000..1_061_000).map(h))
        };
        assert!(all().all(|x| b.contains(x) && b.contains_branch_free(x)));
        let cov = Coverage {
            complete: true,
            watermark: Some(9),
        };
        let (c, got) = Bloom::from_bytes(&b.to_bytes(cov)).unwrap();
        assert_eq!((&c, got), (&b, cov));
        assert_eq!(c.bits.advised(), thp);
        assert!(all().all(|x| c.contains(x)));
        // The branch-free probe answers as `contains`, members or not.
        assert!((0..50_000u64)
            .all(|i| c.contains(h(50_000_000 + i)) == c.contains_branch_free(h(50_000_000 + i))));
    }

    mod props {
        // Used by the tests only: benches/filter.rs compiles this file without them.
        #[allow(unused_imports)]
        use super::super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Add(u128),
            /// A rebuild whose static part (if any) is split into this many parts.
            Rebuild(usize),
            Reload,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                8 => any::<u128>().prop_map(Op::Add),
                1 => (1..=super::super::super::filter_static::MAX_PARTS).prop_map(Op::Rebuild),
                1 => Just(Op::Reload),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            /// Whatever the order of adds, rebuilds (from every member so far, their static
            /// part in any number of parts) and reloads (through the payload), every member
            /// added is found: no false negatives.
            #[test]
            fn no_false_negatives(
                first in proptest::collection::vec(any::<u128>(), 0..300),
                ops in proptest::collection::vec(op(), 0..400),
                fpr in prop_oneof![Just(0.01), Just(0.05), Just(0.001)],
            ) {
                let mut members = first.clone();
                let mut b = Bloom::build(members.len() as u64 + 16, fpr, u64::MAX, &members).unwrap();
                let cov = Coverage { complete: true, watermark: Some(1) };
                for op in ops {
                    match op {
                        Op::Add(x) => {
                            b.add(x);
                            members.push(x);
                        }
                        Op::Rebuild(parts) => {
                            b = Bloom::build(members.len() as u64, fpr, u64::MAX, &members).unwrap();
                            if b.frozen.is_some() {
                                b.frozen = Static::build_in(&members, parts);
                                // One part when a part would have had no rows.
                                let got = b.static_parts();
                                prop_assert!(got == parts || got == 1, "{} of {}", got, parts);
                            }
                        }
                        Op::Reload => {
                            let (c, got) = Bloom::from_bytes(&b.to_bytes(cov)).unwrap();
                            prop_assert_eq!(got, cov);
                            prop_assert_eq!(&c, &b);
                            b = c;
                        }
                    }
                    prop_assert!(members.iter().all(|&x| b.contains(x)));
                }
            }
        }
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
    mod sized_props {
        // Used by the tests only: benches/filter.rs compiles this file without them.
        #[allow(unused_imports)]
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
