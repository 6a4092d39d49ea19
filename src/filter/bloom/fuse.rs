//! The static part of a filter: binary fuse filters with 8-bit fingerprints over
//! the low halves of the item hashes of one build, read-only until the next build.
//!
//! A build is split into parts by the high half of each hash: as many as keep the
//! constructions running side by side within the build's memory budget (`Budget`), so a
//! build of any size holds at most a few parts' working arrays at once, each part built from
//! its own buckets of `Rows`. A probe picks its part with one multiplication, so it still
//! reads three bytes of one fuse filter; all parts' fingerprints lie in one `LargeArray`
//! (huge pages when large, memory the server counts).
//!
//! `xorf` constructs each part; the probe is done here, the same arithmetic as `xorf`'s
//! (`BinaryFuse8::contains`, checked against it by a test) without bounds checks: the
//! geometry is verified once, when built or loaded, so that every index is inside the
//! fingerprints.

use xorf::{BinaryFuse8, Descriptor};

use super::large_array::{prefetch, LargeArray};

/// One part's header (version 3's whole static header): present flag, items, seed, segment
/// length, its mask, segment count length, fingerprint bytes.
pub const STATIC_HEADER_LEN: usize = 1 + 8 + 8 + 4 + 4 + 4 + 8;

/// Buckets a build's rows are sorted into (the top 7 bits of a hash's high half).
pub const BUCKETS: usize = 128;

/// Most parts a static filter is split into (a payload with more is refused). A build from
/// `Buckets` uses a power of two, so that each part is a run of whole buckets.
pub const MAX_PARTS: usize = BUCKETS;

/// The bucket of `hash`: the top 7 bits of its high half.
#[inline]
pub fn bucket_of(hash: u128) -> usize {
    (hash >> (128 - 7)) as usize
}

/// The rows a build read, sorted into [`BUCKETS`] buckets by [`bucket_of`] (`filter/rows.rs`
/// holds them, in memory or spilled to a file): a part of a power-of-two count is built from
/// its own buckets alone.
pub trait Buckets: Sync {
    /// How many hashes there are.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// How many hashes buckets `range` hold.
    fn count(&self, range: std::ops::Range<usize>) -> u64;
    /// Calls `f` with every hash of buckets `range`.
    fn each(&self, range: std::ops::Range<usize>, f: impl FnMut(u128)) -> std::io::Result<()>;
}

/// Bytes a fuse construction holds per row while it runs: the part's keys (8) and xorf's
/// working arrays (about 25: order, degree counts, hashes, alone list, fingerprints), with
/// some room. A build keeps `threads × rows of a part × SCRATCH_PER_ROW` under its budget.
pub const SCRATCH_PER_ROW: u64 = 40;

/// The static part: one fuse filter per part of the hash space, all fingerprints in one
/// array (huge pages when large, however small each part).
#[derive(Clone, Debug, PartialEq)]
pub struct Static {
    parts: Box<[Fuse]>,
    fingerprints: LargeArray<u8>,
    /// Rows the build put in (duplicates included).
    pub items: u64,
}

/// A binary fuse filter over the low halves of some item hashes: read-only, its
/// fingerprints at `at..at + len` of the static part's array.
#[derive(Clone, Debug, PartialEq)]
struct Fuse {
    descriptor: Descriptor,
    at: usize,
    len: usize,
    items: u64,
}

/// A part as constructed, before the parts are put in one array.
type Built = (Descriptor, Box<[u8]>, u64);

/// The part of `parts` that `hash` belongs to, from its high half (the fuse filters read the
/// low half): a multiply-shift, uniform for any count; for a power of two, the top bits.
#[inline(always)]
fn part_of(hash: u128, parts: usize) -> usize {
    (((hash >> 64) as u64 as u128 * parts as u128) >> 64) as usize
}

/// Whether a probe of `d` stays inside `len` fingerprints: it reads h0 < count_len,
/// h1 < h0 + 2·seg and h2 < h0 + 3·seg rounded down to a segment, so inside count_len + 2·seg
/// when count_len is whole segments.
fn geometry_ok(d: &Descriptor, len: u64) -> bool {
    let seg = d.segment_length;
    seg.is_power_of_two()
        && d.segment_length_mask == seg - 1
        && d.segment_count_length.is_multiple_of(seg)
        && len == d.segment_count_length as u64 + 2 * seg as u64
        && len <= u32::MAX as u64
}

/// murmur3's 64-bit finalizer over key + seed (`xorf`'s `mix`).
#[inline(always)]
fn mix(key: u64, seed: u64) -> u64 {
    let mut k = key.wrapping_add(seed);
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// How a build from `Rows` may spend memory: `scratch` bytes of construction at once, on up
/// to `threads` threads.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub scratch: u64,
    pub threads: usize,
}

impl Budget {
    /// The whole `scratch` on every CPU (at most four threads).
    pub fn of(scratch: u64) -> Budget {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Budget {
            scratch,
            threads: cpus.clamp(1, 4),
        }
    }

    /// Parts a build of `rows` rows is split into: the fewest (a power of two, at most
    /// `MAX_PARTS`) whose constructions, `threads` at a time, fit in `scratch`.
    pub fn parts_for(&self, rows: u64) -> usize {
        let per_part = (self.scratch / (self.threads as u64 * SCRATCH_PER_ROW)).max(1);
        (rows.div_ceil(per_part).max(1) as usize)
            .next_power_of_two()
            .min(MAX_PARTS)
    }
}

impl Budget {
    /// Bytes the constructions of a build of `rows` rows hold at most at once.
    pub fn peak_scratch(&self, rows: u64) -> u64 {
        let parts = self.parts_for(rows) as u64;
        parts.min(self.threads as u64) * rows.div_ceil(parts) * SCRATCH_PER_ROW
    }
}

impl Static {
    /// A static part of `hashes` within the default budget of a build (tests and small
    /// callers; a rebuild goes through `build_rows`).
    pub fn build(hashes: &[u128]) -> Option<Static> {
        Static::build_in(hashes, Budget::of(64 << 20).parts_for(hashes.len() as u64))
    }

    /// A static part of `rows` in `budget.parts_for(rows)` parts, `budget.threads` built side
    /// by side, each from its buckets alone: the rows in memory are at most one wave of
    /// parts' keys. Ok(None) when a fuse construction gives up (it retries internally) or the
    /// allocator refuses; the caller then builds a Bloom filter alone. An error reading the
    /// spill file is an error.
    pub fn build_rows(rows: &impl Buckets, budget: Budget) -> std::io::Result<Option<Static>> {
        let mut parts = budget.parts_for(rows.len());
        // A part without rows (only possible for a few rows in many parts): fewer parts.
        while parts > 1 && (0..parts).any(|i| rows.count(buckets(i, parts)) == 0) {
            parts /= 2;
        }
        let mut built: Vec<Built> = Vec::with_capacity(parts);
        for wave in (0..parts).collect::<Vec<_>>().chunks(budget.threads.max(1)) {
            let one = |i: usize| -> std::io::Result<Option<Built>> {
                let range = buckets(i, parts);
                let mut keys = Vec::with_capacity(rows.count(range.clone()) as usize);
                rows.each(range, |h| keys.push(h as u64))?;
                Ok(Fuse::construct(&keys))
            };
            let got: Vec<std::io::Result<Option<Built>>> = if wave.len() == 1 {
                vec![one(wave[0])]
            } else {
                std::thread::scope(|scope| {
                    let started: Vec<_> = wave
                        .iter()
                        .map(|&i| {
                            std::thread::Builder::new()
                                .name("member-fuse".into())
                                .spawn_scoped(scope, move || one(i))
                        })
                        .collect();
                    // A part whose thread could not start (or panicked) is built here.
                    started
                        .into_iter()
                        .zip(wave)
                        .map(|(t, &i)| match t.map(|t| t.join()) {
                            Ok(Ok(r)) => r,
                            _ => one(i),
                        })
                        .collect()
                })
            };
            for g in got {
                match g? {
                    Some(b) => built.push(b),
                    None => return Ok(None),
                }
            }
        }
        Ok(Static::assemble(built))
    }

    /// `build` with any number of `parts` (1..=MAX_PARTS), by `part_of`, on this thread
    /// (tests: payloads of every part count). A build that would leave a part without rows
    /// is one part.
    pub fn build_in(hashes: &[u128], parts: usize) -> Option<Static> {
        let parts = parts.clamp(1, MAX_PARTS);
        let mut keys: Vec<Vec<u64>> = vec![Vec::new(); parts];
        for &h in hashes {
            keys[part_of(h, parts)].push(h as u64);
        }
        if parts > 1 && keys.iter().any(Vec::is_empty) {
            return Static::build_in(hashes, 1);
        }
        let built = keys
            .iter()
            .map(|k| Fuse::construct(k))
            .collect::<Option<_>>()?;
        Static::assemble(built)
    }

    /// The parts' fingerprints moved into one array (None when there are no parts or too
    /// many, or the allocator refuses).
    fn assemble(built: Vec<Built>) -> Option<Static> {
        let total = built.iter().map(|b| b.1.len()).sum();
        let mut fingerprints = LargeArray::try_zeroed(total).ok()?;
        let mut parts = Vec::with_capacity(built.len());
        let mut at = 0;
        for (descriptor, fp, items) in built {
            fingerprints[at..at + fp.len()].copy_from_slice(&fp);
            parts.push(Fuse {
                descriptor,
                at,
                len: fp.len(),
                items,
            });
            at += fp.len();
        }
        Static::of(parts, fingerprints)
    }

    /// A static part of `parts` over `fingerprints` (None when there are none or too many,
    /// or they do not lie one after another over exactly the whole array).
    fn of(parts: Vec<Fuse>, fingerprints: LargeArray<u8>) -> Option<Static> {
        if parts.is_empty() || parts.len() > MAX_PARTS {
            return None;
        }
        let mut at = 0;
        for p in &parts {
            if p.at != at || !geometry_ok(&p.descriptor, p.len as u64) {
                return None;
            }
            at += p.len;
        }
        if at != fingerprints.len() {
            return None;
        }
        Some(Static {
            items: parts.iter().map(|p| p.items).sum(),
            parts: parts.into_boxed_slice(),
            fingerprints,
        })
    }

    #[inline(always)]
    fn part(&self, hash: u128) -> &Fuse {
        let count = self.parts.len();
        // One part (every build of a few hundred thousand rows): a branch the predictor
        // always gets right.
        if count == 1 {
            return &self.parts[0];
        }
        // SAFETY: part_of is below count, which is 1..=MAX_PARTS (`of`).
        unsafe { self.parts.get_unchecked(part_of(hash, count)) }
    }

    /// Brings the lines `contains(hash)` will read towards the cache.
    #[inline(always)]
    pub fn prefetch(&self, hash: u128) {
        let (slots, _) = self.part(hash).slots(hash);
        for s in slots {
            // SAFETY: `geometry_ok` and `of` keep every slot inside the fingerprints.
            prefetch(unsafe { self.fingerprints.get_unchecked(s) });
        }
    }

    /// False means `hash` was not in the build; true means "possibly".
    #[inline(always)]
    pub fn contains(&self, hash: u128) -> bool {
        let ([h0, h1, h2], f) = self.part(hash).slots(hash);
        let fp = &self.fingerprints;
        // SAFETY: `geometry_ok` (checked when built or loaded) keeps every slot of a part
        // inside its fingerprints, which `of` keeps inside the array; the three loads are
        // independent, so their misses overlap.
        let x = unsafe { fp.get_unchecked(h0) ^ fp.get_unchecked(h1) ^ fp.get_unchecked(h2) };
        f ^ x == 0
    }

    /// Fingerprint bytes of all parts.
    pub fn bytes(&self) -> usize {
        self.fingerprints.len()
    }

    /// How many parts it has.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Whether the fingerprints were advised for huge pages.
    pub fn huge_pages(&self) -> bool {
        self.fingerprints.advised()
    }

    /// Length of `write_header`'s output for `s`.
    pub fn header_len(s: Option<&Static>) -> usize {
        1 + s.map_or(0, Static::parts) * STATIC_HEADER_LEN
    }

    /// Version 4's static header: the number of parts (0: none), then each part's header.
    pub fn write_header(s: Option<&Static>, put: &mut impl FnMut(&[u8])) {
        put(&[s.map_or(0, Static::parts) as u8]);
        for p in s.iter().flat_map(|s| s.parts.iter()) {
            p.write_header(put);
        }
    }

    /// The fingerprints of every part, in order (after the delta's bit array).
    pub fn write_fingerprints(&self, put: &mut impl FnMut(&[u8])) {
        put(&self.fingerprints);
    }

    /// Reads a version 4 static header at the start of `b`: each part's items, descriptor and
    /// fingerprint length, checked so that no probe can index outside them, and the header's
    /// length.
    pub fn read_header(b: &[u8]) -> Result<(Vec<PartHeader>, usize), String> {
        let count = *b
            .first()
            .ok_or("filter payload truncated in its static header")? as usize;
        if count > MAX_PARTS {
            return Err(format!(
                "filter payload has {count} static parts (at most {MAX_PARTS})"
            ));
        }
        let len = 1 + count * STATIC_HEADER_LEN;
        let h = b
            .get(1..len)
            .ok_or("filter payload truncated in its static header")?;
        let mut parts = Vec::with_capacity(count);
        for one in h.chunks_exact(STATIC_HEADER_LEN) {
            match Fuse::read_header(one)? {
                Some(p) => parts.push(p),
                None => return Err("filter payload has an empty static part".into()),
            }
        }
        Ok((parts, len))
    }

    /// Reads version 3's static header (`STATIC_HEADER_LEN` bytes: none or one part).
    pub fn read_header_v3(h: &[u8]) -> Result<Vec<PartHeader>, String> {
        Ok(Fuse::read_header(h)?.into_iter().collect())
    }

    /// Total fingerprint bytes the headers announce.
    pub fn fingerprint_len(headers: &[PartHeader]) -> usize {
        headers.iter().map(|h| h.2).sum()
    }

    /// The static part of a payload whose headers `read_header` accepted (None: no static
    /// part), over `fingerprints` (exactly `fingerprint_len` bytes).
    pub fn load(headers: Vec<PartHeader>, fingerprints: &[u8]) -> Result<Option<Static>, String> {
        if headers.is_empty() {
            return Ok(None);
        }
        let no_memory = || {
            format!(
                "out of memory loading a filter's {} static bytes",
                fingerprints.len()
            )
        };
        let array = LargeArray::try_copy_of(fingerprints).map_err(|_| no_memory())?;
        let mut parts = Vec::with_capacity(headers.len());
        let mut at = 0;
        for (items, descriptor, len) in headers {
            parts.push(Fuse {
                descriptor,
                at,
                len,
                items,
            });
            at += len;
        }
        Ok(Static::of(parts, array))
    }
}

/// One part's header as read: items, descriptor, fingerprint bytes.
pub type PartHeader = (u64, Descriptor, usize);

/// Buckets of part `i` of `parts` (a power of two, at most `BUCKETS`).
fn buckets(i: usize, parts: usize) -> std::ops::Range<usize> {
    let per = BUCKETS / parts;
    i * per..(i + 1) * per
}

impl Fuse {
    /// The fuse filter of `keys` (its descriptor, fingerprints and row count), None when the
    /// construction gives up.
    fn construct(keys: &[u64]) -> Option<Built> {
        let items = keys.len() as u64;
        // Release builds of xorf skip duplicate keys while peeling; debug builds assert that
        // there are none (rows that canonicalize alike are possible), so tests dedupe first.
        #[cfg(debug_assertions)]
        let keys = &{
            let mut keys = keys.to_vec();
            keys.sort_unstable();
            keys.dedup();
            keys
        };
        let fuse = BinaryFuse8::try_from(keys).ok()?;
        geometry_ok(&fuse.descriptor, fuse.fingerprints.len() as u64).then_some((
            fuse.descriptor,
            fuse.fingerprints,
            items,
        ))
    }

    /// The three fingerprint indexes of `hash` in the static part's array, and its
    /// fingerprint.
    #[inline(always)]
    fn slots(&self, hash: u128) -> ([usize; 3], u8) {
        let d = &self.descriptor;
        let x = mix(hash as u64, d.seed);
        let h0 = ((x as u128 * d.segment_count_length as u128) >> 64) as u32;
        let h1 = (h0 + d.segment_length) ^ ((x >> 18) as u32 & d.segment_length_mask);
        let h2 = (h0 + 2 * d.segment_length) ^ (x as u32 & d.segment_length_mask);
        (
            [
                self.at + h0 as usize,
                self.at + h1 as usize,
                self.at + h2 as usize,
            ],
            (x ^ (x >> 32)) as u8,
        )
    }

    fn write_header(&self, put: &mut impl FnMut(&[u8])) {
        let d = &self.descriptor;
        put(&[1]);
        put(&self.items.to_le_bytes());
        put(&d.seed.to_le_bytes());
        put(&d.segment_length.to_le_bytes());
        put(&d.segment_length_mask.to_le_bytes());
        put(&d.segment_count_length.to_le_bytes());
        put(&(self.len as u64).to_le_bytes());
    }

    /// The static header at the start of `h` (`STATIC_HEADER_LEN` bytes): whether there is a
    /// static part, its items, descriptor and fingerprint length, each checked so that no
    /// probe can index outside the fingerprints.
    fn read_header(h: &[u8]) -> Result<Option<PartHeader>, String> {
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
        let present = match h[0] {
            0 => false,
            1 => true,
            x => return Err(format!("filter payload has a bad static flag {x}")),
        };
        let (items, seed) = (u64_at(1), u64_at(9));
        let (len, mask, count_len) = (u32_at(17), u32_at(21), u32_at(25));
        let fp_len = u64_at(29);
        if !present {
            if items != 0 || seed != 0 || len != 0 || mask != 0 || count_len != 0 || fp_len != 0 {
                return Err("filter payload has a static header without a static part".into());
            }
            return Ok(None);
        }
        let d = Descriptor {
            seed,
            segment_length: len,
            segment_length_mask: mask,
            segment_count_length: count_len,
        };
        if !geometry_ok(&d, fp_len) || items == 0 {
            return Err(format!(
                "filter payload has a bad static geometry (segment {len}, mask {mask}, count \
                 {count_len}, {fp_len} bytes, {items} items)"
            ));
        }
        Ok(Some((items, d, fp_len as usize)))
    }
}

#[cfg(test)]
mod tests {
    // Used by the tests only: benches/filter.rs compiles this file without them.
    #[allow(unused_imports)]
    use super::*;
    #[allow(unused_imports)]
    use xorf::Filter;

    fn keys(seed: u64, n: usize) -> Vec<u128> {
        (0..n as u64)
            .map(|i| xxhash_rust::xxh3::xxh3_128(&[seed.to_le_bytes(), i.to_le_bytes()].concat()))
            .collect()
    }

    /// Rows that would leave a part empty (here every hash's high half is 0, so all of them
    /// fall in part 0) make a one-part filter, which holds them all.
    #[test]
    fn a_part_without_rows_makes_one_part() {
        let hs: Vec<u128> = keys(3, 5_000)
            .into_iter()
            .map(|h| h as u64 as u128)
            .collect();
        let s = Static::build_in(&hs, 4).unwrap();
        assert_eq!(s.parts(), 1);
        assert!(hs.iter().all(|&h| s.contains(h)));
        let spread = keys(4, 5_000);
        assert_eq!(Static::build_in(&spread, 4).unwrap().parts(), 4);
    }

    #[test]
    fn the_probe_is_xorfs() {
        for n in [64usize, 1000, 70_000] {
            let hs = keys(n as u64, n);
            let mut ks: Vec<u64> = hs.iter().map(|&h| h as u64).collect();
            ks.sort_unstable();
            ks.dedup();
            let fuse = BinaryFuse8::try_from(&ks).unwrap();
            let s = Static::build(&hs).unwrap();
            assert_eq!(s.parts(), 1);
            assert_eq!(s.parts[0].descriptor, fuse.descriptor);
            assert_eq!(&s.fingerprints[..], &fuse.fingerprints[..]);
            assert!(hs.iter().all(|&h| s.contains(h)));
            for h in keys(n as u64 + 99, 100_000) {
                assert_eq!(s.contains(h), fuse.contains(&(h as u64)));
            }
        }
    }
}
