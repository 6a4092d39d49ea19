//! The Bloom gate as plain Rust: sizing, probing, fill estimates (the versioned binary form is
//! `format.rs`). No server calls here; `filter/data_type.rs` wraps it as a Valkey data type.
//!
//! Design (measured in bench/PROFILE.md): a build (CREATE, REBUILD) puts the rows it
//! read into a static binary fuse filter (8-bit fingerprints: 9.04 bits a member, 0.39 %
//! false positives, three independent reads per probe); every add after the build (ADD, sync
//! passes, slot fills, the rebuild's journal) goes to a classic Bloom filter, the delta, which
//! the next build folds in. Rates below what the static part can give, and tiny sets, keep a
//! Bloom filter alone.
//!
//! The static part lives in `fuse.rs`; both parts' arrays are `large_array.rs`
//! arrays, on huge pages from 8 MiB.

use fuse::{Budget, Static};
use large_array::{prefetch, LargeArray, HUGE_FROM};
use rows::Rows;

mod format;
pub mod fuse;
pub mod large_array;
pub mod rows;
// (benches/filter.rs includes this file and has no use for it)
#[allow(unused_imports)]
pub use format::{Out, FORMAT_VERSION};

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
    /// The rows' spill file could not be read back.
    Spill(String),
}

impl SizeError {
    fn spill(e: std::io::Error) -> SizeError {
        SizeError::Spill(e.to_string())
    }
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
            SizeError::Spill(e) => write!(f, "cannot read the build's spill file back: {e}"),
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

/// Hashes a build from `Rows` hands `add_many` at a time.
const ADD_RUN: usize = 4096;

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

    /// A filter holding `hashes`, as `build_rows` makes it (tests and small callers).
    pub fn build(
        capacity: u64,
        fpr: f64,
        max_bytes: u64,
        hashes: &[u128],
    ) -> Result<Self, SizeError> {
        Bloom::build_rows(
            capacity,
            fpr,
            max_bytes,
            &Rows::in_memory(hashes),
            Budget::of(64 << 20),
        )
    }

    /// A filter holding `rows` (the rows a build read), sized for `capacity` members at
    /// `fpr`, if it fits in `max_bytes` and the allocator grants it. When the rate allows
    /// (at least twice `STATIC_FPR`) and there are enough rows, they go into a static part
    /// built within `budget`, and the delta is a Bloom filter for the capacity left over (at
    /// least 1/50 of the rows) at the rest of the rate, `fpr - STATIC_FPR`: so the combined
    /// rate stays within `fpr` as long as the delta is within its capacity. Otherwise a Bloom
    /// filter alone, as `try_new` and `add_many` make it.
    pub fn build_rows(
        capacity: u64,
        fpr: f64,
        max_bytes: u64,
        rows: &Rows,
        budget: Budget,
    ) -> Result<Self, SizeError> {
        check_size(capacity, fpr, max_bytes)?;
        let n = rows.len();
        if fpr >= 2.0 * STATIC_FPR && n >= STATIC_MIN_ITEMS as u64 && fpr < 1.0 {
            let frozen = Static::build_rows(rows, budget).map_err(SizeError::spill)?;
            if let Some(frozen) = frozen {
                let room = capacity.saturating_sub(n).max(n / DELTA_SHARE).max(1);
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
        // In runs, so that `add_many` prefetches ahead.
        let mut run = Vec::with_capacity(ADD_RUN);
        rows.each_all(|h| {
            run.push(h);
            if run.len() == ADD_RUN {
                b.add_many(&run);
                run.clear();
            }
        })
        .map_err(SizeError::spill)?;
        b.add_many(&run);
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
}

#[cfg(test)]
mod tests;
