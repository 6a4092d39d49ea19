//! The static part of a filter (issue 11): a binary fuse filter with 8-bit fingerprints over
//! the low halves of the item hashes of one build, read-only until the next build.
//!
//! `xorf` constructs it; the fingerprints then move into a `LargeArray` (huge pages when
//! large, memory the server counts) and the probe is done here, the same arithmetic as
//! `xorf`'s (`BinaryFuse8::contains`, checked against it by a test) without bounds checks:
//! the geometry is verified once, when built or loaded, so that every index is inside the
//! fingerprints.

use xorf::{BinaryFuse8, Descriptor};

use super::large_array::{prefetch, LargeArray};

/// Version 3's static header: present flag, items, seed, segment length, its mask, segment
/// count length, fingerprint bytes.
pub const STATIC_HEADER_LEN: usize = 1 + 8 + 8 + 4 + 4 + 4 + 8;

/// A binary fuse filter over the low halves of the item hashes of one build: read-only.
#[derive(Clone, Debug, PartialEq)]
pub struct Static {
    descriptor: Descriptor,
    fingerprints: LargeArray<u8>,
    /// Rows the build put in (duplicates included).
    pub items: u64,
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
    /// None when the fuse construction gives up (it retries internally) or the allocator
    /// refuses the fingerprints; the caller then builds a Bloom filter alone.
    pub fn build(hashes: &[u128]) -> Option<Static> {
        let keys: Vec<u64> = hashes.iter().map(|&h| h as u64).collect();
        // Release builds of xorf skip duplicate keys while peeling; debug builds assert that
        // there are none (rows that canonicalize alike are possible), so tests dedupe first.
        #[cfg(debug_assertions)]
        let keys = {
            let mut keys = keys;
            keys.sort_unstable();
            keys.dedup();
            keys
        };
        let fuse = BinaryFuse8::try_from(&keys).ok()?;
        drop(keys);
        Static::from_parts(fuse.descriptor, &fuse.fingerprints, hashes.len() as u64)
    }

    /// A static part from a descriptor and fingerprints (a build's or a payload's), None
    /// when the geometry would let a probe read outside them or the allocator refuses.
    fn from_parts(descriptor: Descriptor, fingerprints: &[u8], items: u64) -> Option<Static> {
        if !geometry_ok(&descriptor, fingerprints.len() as u64) {
            return None;
        }
        Some(Static {
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

    /// Brings the lines `contains(hash)` will read towards the cache.
    #[inline(always)]
    pub fn prefetch(&self, hash: u128) {
        let (slots, _) = self.slots(hash);
        for s in slots {
            // SAFETY: `geometry_ok` keeps every slot inside the fingerprints.
            prefetch(unsafe { self.fingerprints.get_unchecked(s) });
        }
    }

    /// False means `hash` was not in the build; true means "possibly".
    #[inline(always)]
    pub fn contains(&self, hash: u128) -> bool {
        let ([h0, h1, h2], f) = self.slots(hash);
        let fp = &self.fingerprints;
        // SAFETY: `geometry_ok` (checked when built or loaded) keeps every slot inside the
        // fingerprints; the three loads are independent, so their misses overlap.
        let x = unsafe { fp.get_unchecked(h0) ^ fp.get_unchecked(h1) ^ fp.get_unchecked(h2) };
        f ^ x == 0
    }

    pub fn bytes(&self) -> usize {
        self.fingerprints.len()
    }

    pub fn fingerprints(&self) -> &[u8] {
        &self.fingerprints
    }

    /// Whether the fingerprints were advised for huge pages.
    pub fn huge_pages(&self) -> bool {
        self.fingerprints.advised()
    }

    pub fn write_header(s: Option<&Static>, out: &mut Vec<u8>) {
        let (items, d, len) = match s {
            Some(s) => (s.items, s.descriptor.clone(), s.bytes() as u64),
            None => (
                0,
                Descriptor {
                    seed: 0,
                    segment_length: 0,
                    segment_length_mask: 0,
                    segment_count_length: 0,
                },
                0,
            ),
        };
        out.push(s.is_some() as u8);
        out.extend_from_slice(&items.to_le_bytes());
        out.extend_from_slice(&d.seed.to_le_bytes());
        out.extend_from_slice(&d.segment_length.to_le_bytes());
        out.extend_from_slice(&d.segment_length_mask.to_le_bytes());
        out.extend_from_slice(&d.segment_count_length.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }

    /// The static header at the start of `h` (`STATIC_HEADER_LEN` bytes): whether there is a
    /// static part, its items, descriptor and fingerprint length, each checked so that no
    /// probe can index outside the fingerprints.
    pub fn read_header(h: &[u8]) -> Result<Option<(u64, Descriptor, usize)>, String> {
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

    /// The static part of a payload whose header `read_header` accepted, over `fingerprints`
    /// (exactly the length it gave).
    pub fn load(
        (items, descriptor, _): (u64, Descriptor, usize),
        fingerprints: &[u8],
    ) -> Result<Static, String> {
        Static::from_parts(descriptor, fingerprints, items).ok_or_else(|| {
            format!(
                "out of memory loading a filter's {} static bytes",
                fingerprints.len()
            )
        })
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

    #[test]
    fn the_probe_is_xorfs() {
        for n in [64usize, 1000, 70_000] {
            let hs = keys(n as u64, n);
            let mut ks: Vec<u64> = hs.iter().map(|&h| h as u64).collect();
            ks.sort_unstable();
            ks.dedup();
            let fuse = BinaryFuse8::try_from(&ks).unwrap();
            let s = Static::build(&hs).unwrap();
            assert_eq!(s.descriptor, fuse.descriptor);
            assert_eq!(s.fingerprints(), &fuse.fingerprints[..]);
            assert!(hs.iter().all(|&h| s.contains(h)));
            for h in keys(n as u64 + 99, 100_000) {
                assert_eq!(s.contains(h), fuse.contains(&(h as u64)));
            }
        }
    }
}
