//! The filter's versioned binary form (RDB, AOF, replication, `MEMBER._LOAD`): writing the
//! current version, reading it and every older one, rejecting anything it cannot verify.

use xxhash_rust::xxh3::xxh3_64;

use super::fuse::{Static, STATIC_HEADER_LEN};
use super::large_array::LargeArray;
use super::{Bloom, Coverage, MAX_BITS};

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

/// A serialized form being written into a buffer sized for it beforehand (a `Vec`, or a
/// server string that will carry it: the payload is then never copied). The writes are the
/// `Vec` calls the format was first written with; writing past the end is a bug and panics.
pub struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Out<'a> {
    pub fn new(buf: &'a mut [u8]) -> Out<'a> {
        Out { buf, len: 0 }
    }

    pub fn extend_from_slice(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    pub fn push(&mut self, b: u8) {
        self.extend_from_slice(&[b]);
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What was written from `at` on.
    pub fn written_from(&mut self, at: usize) -> &mut [u8] {
        &mut self.buf[at..self.len]
    }
}

impl Bloom {
    /// Serialized form (version 4): magic, version, k, bits, items, ones, capacity, fpr of
    /// the delta header, complete flag, watermark (i64::MIN for none), xxh3 checksum of
    /// everything after it, the static header (`Static::write_header`), the delta's bit
    /// array, the static fingerprints (all little endian).
    pub fn to_bytes(&self, cov: Coverage) -> Vec<u8> {
        let mut out = vec![0; self.serialized_len()];
        self.write_bytes(cov, &mut Out::new(&mut out));
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
    pub fn write_bytes(&self, cov: Coverage, out: &mut Out) {
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
        Static::write_header(self.frozen.as_ref(), &mut |b| out.extend_from_slice(b));
        write_words(&self.bits, out);
        if let Some(s) = &self.frozen {
            s.write_fingerprints(&mut |b| out.extend_from_slice(b));
        }
        let sum = xxh3_64(&out.written_from(sum_at + 8)[..]);
        out.written_from(sum_at)[..8].copy_from_slice(&sum.to_le_bytes());
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

/// Appends `words` little-endian, 8 bytes each. On a little-endian target that is their
/// bytes in memory: one copy of the whole array (a per-word copy took ~1 ms per 2 MB of
/// filter in a release build, and a 240 MB filter over a minute in a debug one).
fn write_words(words: &[u64], out: &mut Out) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: `u64` has no padding and any byte is a valid `u8`; the slice covers exactly
        // the words' memory, which stays borrowed for the copy.
        let bytes =
            unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) };
        out.extend_from_slice(bytes);
    }
    #[cfg(not(target_endian = "little"))]
    {
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
