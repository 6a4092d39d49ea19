//! The static part of a filter (issue 11): binary fuse filters with 8-bit fingerprints over
//! the low halves of the item hashes of one build, read-only until the next build.
//!
//! A large build is split into parts by the high half of each hash (one part per CPU, at most
//! `MAX_PARTS`), constructed side by side: the construction runs after the COPY has ended
//! and was a third of a 10 M-row rebuild on one thread. A probe picks its part with one
//! multiplication, so it still reads three bytes of one fuse filter.
//!
//! `xorf` constructs it; the fingerprints then move into a `LargeArray` (huge pages when
//! large, memory the server counts) and the probe is done here, the same arithmetic as
//! `xorf`'s (`BinaryFuse8::contains`, checked against it by a test) without bounds checks:
//! the geometry is verified once, when built or loaded, so that every index is inside the
//! fingerprints.

use xorf::{BinaryFuse8, Descriptor};

use super::large_array::{prefetch, LargeArray};

/// One part's header (version 3's whole static header): present flag, items, seed, segment
/// length, its mask, segment count length, fingerprint bytes.
pub const STATIC_HEADER_LEN: usize = 1 + 8 + 8 + 4 + 4 + 4 + 8;

/// Most parts a static filter is split into (a payload with more is refused).
pub const MAX_PARTS: usize = 8;

/// Builds smaller than this stay one part: their construction takes milliseconds.
const PARTS_FROM: usize = 1 << 21;

/// The static part: one fuse filter per part of the hash space.
#[derive(Clone, Debug, PartialEq)]
pub struct Static {
    /// Inline, so that a probe reaches its part's fingerprints with no extra load and picks
    /// it without a branch (a branch on a coin toss cost 10 ns a batched probe): `count` in
    /// use, the rest empty.
    parts: [Fuse; MAX_PARTS],
    count: usize,
    /// Rows the build put in (duplicates included).
    pub items: u64,
}

/// A binary fuse filter over the low halves of some item hashes: read-only.
#[derive(Clone, Debug, PartialEq)]
struct Fuse {
    descriptor: Descriptor,
    fingerprints: LargeArray<u8>,
    items: u64,
}

/// The part of `parts` that `hash` belongs to, from its high half (the fuse filters read the
/// low half): a multiply-shift, uniform for any count.
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

impl Static {
    /// None when a fuse construction gives up (it retries internally) or the allocator
    /// refuses the fingerprints; the caller then builds a Bloom filter alone.
    pub fn build(hashes: &[u128]) -> Option<Static> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let parts = if hashes.len() < PARTS_FROM {
            1
        } else {
            cpus.clamp(1, MAX_PARTS)
        };
        Static::build_in(hashes, parts)
    }

    /// `build` with `parts` parts (1..=MAX_PARTS), each constructed on a thread of its own
    /// (on this one when a thread cannot be started). A build that would leave a part without
    /// rows (only possible for a few rows in many parts) is one part.
    pub fn build_in(hashes: &[u128], parts: usize) -> Option<Static> {
        let parts = parts.clamp(1, MAX_PARTS);
        let mut keys: Vec<Vec<u64>> = (0..parts)
            .map(|_| Vec::with_capacity(hashes.len() / parts + hashes.len() / (parts * 16) + 16))
            .collect();
        for &h in hashes {
            keys[part_of(h, parts)].push(h as u64);
        }
        if parts > 1 && keys.iter().any(Vec::is_empty) {
            return Static::build_in(hashes, 1);
        }
        if parts == 1 {
            return Static::of(vec![Fuse::build(&keys[0])?]);
        }
        let built: Vec<Option<Fuse>> = std::thread::scope(|scope| {
            let started: Vec<_> = keys
                .iter()
                .map(|k| {
                    std::thread::Builder::new()
                        .name("member-fuse".into())
                        .spawn_scoped(scope, move || Fuse::build(k))
                })
                .collect();
            // A part whose thread could not start is built here.
            started
                .into_iter()
                .zip(&keys)
                .map(|(t, k)| match t {
                    Ok(t) => t.join().ok().flatten(),
                    Err(_) => Fuse::build(k),
                })
                .collect()
        });
        Static::of(built.into_iter().collect::<Option<_>>()?)
    }

    /// A static part of `parts` (None when there are none or too many).
    fn of(parts: Vec<Fuse>) -> Option<Static> {
        let count = parts.len();
        if count == 0 || count > MAX_PARTS {
            return None;
        }
        let items = parts.iter().map(|p| p.items).sum();
        let mut parts = parts.into_iter();
        Some(Static {
            parts: std::array::from_fn(|_| parts.next().unwrap_or_else(Fuse::empty)),
            count,
            items,
        })
    }

    fn all(&self) -> impl Iterator<Item = &Fuse> {
        self.parts[..self.count].iter()
    }

    #[inline(always)]
    fn part(&self, hash: u128) -> &Fuse {
        // One part (every build under PARTS_FROM rows): a branch the predictor always gets
        // right, and the part's fields at fixed offsets.
        if self.count == 1 {
            return &self.parts[0];
        }
        // SAFETY: part_of is below count, which is 1..=MAX_PARTS (`of`).
        unsafe { self.parts.get_unchecked(part_of(hash, self.count)) }
    }

    /// Brings the lines `contains(hash)` will read towards the cache.
    #[inline(always)]
    pub fn prefetch(&self, hash: u128) {
        self.part(hash).prefetch(hash)
    }

    /// False means `hash` was not in the build; true means "possibly".
    #[inline(always)]
    pub fn contains(&self, hash: u128) -> bool {
        self.part(hash).contains(hash)
    }

    /// Fingerprint bytes of all parts.
    pub fn bytes(&self) -> usize {
        self.all().map(|p| p.fingerprints.len()).sum()
    }

    /// How many parts it has.
    pub fn parts(&self) -> usize {
        self.count
    }

    /// Whether the fingerprints were advised for huge pages (all parts).
    pub fn huge_pages(&self) -> bool {
        self.all().all(|p| p.fingerprints.advised())
    }

    /// Length of `write_header`'s output for `s`.
    pub fn header_len(s: Option<&Static>) -> usize {
        1 + s.map_or(0, Static::parts) * STATIC_HEADER_LEN
    }

    /// Version 4's static header: the number of parts (0: none), then each part's header.
    pub fn write_header(s: Option<&Static>, out: &mut Vec<u8>) {
        out.push(s.map_or(0, Static::parts) as u8);
        for p in s.iter().flat_map(|s| s.all()) {
            p.write_header(out);
        }
    }

    /// The fingerprints of every part, in order (after the delta's bit array).
    pub fn write_fingerprints(&self, out: &mut Vec<u8>) {
        for p in self.all() {
            out.extend_from_slice(&p.fingerprints);
        }
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
        let mut parts = Vec::with_capacity(headers.len());
        let mut at = 0;
        for (items, descriptor, len) in headers {
            let bytes = &fingerprints[at..at + len];
            at += len;
            parts.push(
                Fuse::from_parts(descriptor, bytes, items).ok_or_else(|| {
                    format!("out of memory loading a filter's {len} static bytes")
                })?,
            );
        }
        Ok(Static::of(parts))
    }
}

/// One part's header as read: items, descriptor, fingerprint bytes.
pub type PartHeader = (u64, Descriptor, usize);

impl Fuse {
    /// A part not in use.
    fn empty() -> Fuse {
        Fuse {
            descriptor: Descriptor {
                seed: 0,
                segment_length: 0,
                segment_length_mask: 0,
                segment_count_length: 0,
            },
            fingerprints: LargeArray::zeroed(0),
            items: 0,
        }
    }

    /// None when the construction gives up or the allocator refuses the fingerprints.
    fn build(keys: &[u64]) -> Option<Fuse> {
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
        Fuse::from_parts(fuse.descriptor, &fuse.fingerprints, items)
    }

    /// A static part from a descriptor and fingerprints (a build's or a payload's), None
    /// when the geometry would let a probe read outside them or the allocator refuses.
    fn from_parts(descriptor: Descriptor, fingerprints: &[u8], items: u64) -> Option<Fuse> {
        if !geometry_ok(&descriptor, fingerprints.len() as u64) {
            return None;
        }
        Some(Fuse {
            descriptor,
            fingerprints: LargeArray::try_copy_of(fingerprints).ok()?,
            items,
        })
    }

    /// The three fingerprint indexes of `hash` and its fingerprint.
    #[inline(always)]
    fn slots(&self, hash: u128) -> ([usize; 3], u8) {
        let d = &self.descriptor;
        let x = mix(hash as u64, d.seed);
        let h0 = ((x as u128 * d.segment_count_length as u128) >> 64) as u32;
        let h1 = (h0 + d.segment_length) ^ ((x >> 18) as u32 & d.segment_length_mask);
        let h2 = (h0 + 2 * d.segment_length) ^ (x as u32 & d.segment_length_mask);
        (
            [h0 as usize, h1 as usize, h2 as usize],
            (x ^ (x >> 32)) as u8,
        )
    }

    #[inline(always)]
    fn prefetch(&self, hash: u128) {
        let (slots, _) = self.slots(hash);
        for s in slots {
            // SAFETY: `geometry_ok` keeps every slot inside the fingerprints.
            prefetch(unsafe { self.fingerprints.get_unchecked(s) });
        }
    }

    #[inline(always)]
    fn contains(&self, hash: u128) -> bool {
        let ([h0, h1, h2], f) = self.slots(hash);
        let fp = &self.fingerprints;
        // SAFETY: `geometry_ok` (checked when built or loaded) keeps every slot inside the
        // fingerprints; the three loads are independent, so their misses overlap.
        let x = unsafe { fp.get_unchecked(h0) ^ fp.get_unchecked(h1) ^ fp.get_unchecked(h2) };
        f ^ x == 0
    }

    fn write_header(&self, out: &mut Vec<u8>) {
        let d = &self.descriptor;
        out.push(1);
        out.extend_from_slice(&self.items.to_le_bytes());
        out.extend_from_slice(&d.seed.to_le_bytes());
        out.extend_from_slice(&d.segment_length.to_le_bytes());
        out.extend_from_slice(&d.segment_length_mask.to_le_bytes());
        out.extend_from_slice(&d.segment_count_length.to_le_bytes());
        out.extend_from_slice(&(self.fingerprints.len() as u64).to_le_bytes());
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
            assert_eq!(&s.parts[0].fingerprints[..], &fuse.fingerprints[..]);
            assert!(hs.iter().all(|&h| s.contains(h)));
            for h in keys(n as u64 + 99, 100_000) {
                assert_eq!(s.contains(h), fuse.contains(&(h as u64)));
            }
        }
    }
}
