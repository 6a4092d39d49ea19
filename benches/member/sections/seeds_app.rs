//! The seeds' application-side lookup, as their articles describe it: a Bloom filter in Valkey
//! (1 % FPR, sized like BF.RESERVE), the recent-writes set, exact-match cache keys, PostgreSQL.
//!
//! This Valkey has no Bloom module, so the filter is a plain Valkey string used as a bit array:
//! built here from the members (m = −n·ln p / ln²2 bits, k = 7 for p = 1 %, the sizing BF.RESERVE
//! uses), stored with one SET, and read with one `BITFIELD_RO … GET u1 <bit>` per lookup (the k
//! bits of the item, by double hashing of its xxh3-128). Same round trips as BF.EXISTS, same
//! false-positive rate.

use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::xxh3_128;

use crate::*;

/// The filter's key.
pub(crate) const APP_BLOOM: &str = "app:bloom";
/// False-positive rate of the filter (the seeds' `BF.RESERVE … 0.01 …`).
const APP_BLOOM_FPR: f64 = 0.01;

/// A Bloom filter's shape: bits and hash count.
#[derive(Clone, Copy)]
pub(crate) struct BloomShape {
    pub(crate) bits: u64,
    pub(crate) hashes: u32,
}

impl BloomShape {
    /// The classic optimum for `n` items at `fpr`.
    pub(crate) fn for_items(n: u64, fpr: f64) -> BloomShape {
        let ln2 = std::f64::consts::LN_2;
        let bits = (-(n.max(1) as f64) * fpr.ln() / (ln2 * ln2)).ceil() as u64;
        let hashes = (-fpr.ln() / ln2).ceil() as u32;
        BloomShape { bits, hashes }
    }

    /// The bit offsets of `item` (Valkey's bit order: offset 0 is the high bit of byte 0).
    pub(crate) fn offsets(&self, item: &str) -> impl Iterator<Item = u64> + '_ {
        let h = xxh3_128(item.as_bytes());
        let (h1, h2) = (h as u64, (h >> 64) as u64 | 1);
        (0..self.hashes as u64).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) % self.bits)
    }
}

/// Builds the filter of members m1..=n and stores it at APP_BLOOM. Returns its shape.
pub(crate) fn load_app_bloom(c: &mut redis::Connection, n: u64) -> BloomShape {
    let shape = BloomShape::for_items(n, APP_BLOOM_FPR);
    let mut bytes = vec![0u8; shape.bits.div_ceil(8) as usize];
    for i in 1..=n {
        for o in shape.offsets(&format!("m{i}")) {
            bytes[(o >> 3) as usize] |= 0x80 >> (o & 7);
        }
    }
    let _: () = redis::cmd("SET")
        .arg(APP_BLOOM)
        .arg(bytes)
        .query(c)
        .expect("SET app:bloom");
    shape
}

/// One lookup of the seeds' pattern: BF.EXISTS (here BITFIELD_RO); on 0 the recent-writes set
/// (not marked: absent); then the cache key; on a miss, the prepared point query, and a hit
/// fills the cache (SET EX). Counts the lookups that reached PostgreSQL in `to_db`.
pub(crate) fn seeds_lookup(
    shape: &BloomShape,
    vk: &mut redis::Connection,
    pg: &mut postgres::Client,
    st: &postgres::Statement,
    item: &str,
    to_db: &AtomicU64,
) -> Result<bool, String> {
    let mut bf = redis::cmd("BITFIELD_RO");
    bf.arg(APP_BLOOM);
    for o in shape.offsets(item) {
        bf.arg("GET").arg("u1").arg(o);
    }
    let bits: Vec<i64> = bf.query(vk).map_err(|e| e.to_string())?;
    if bits.contains(&0) {
        // A mark means "written, maybe not in the filter yet": confirm like a filter hit.
        let recent: bool = redis::cmd("SISMEMBER")
            .arg(APP_RECENT)
            .arg(item)
            .query(vk)
            .map_err(|e| e.to_string())?;
        if !recent {
            return Ok(false);
        }
    }
    let key = format!("{APP_HIT}{item}");
    let cached: Option<Vec<u8>> = redis::cmd("GET")
        .arg(&key)
        .query(vk)
        .map_err(|e| e.to_string())?;
    if cached.is_some() {
        return Ok(true);
    }
    to_db.fetch_add(1, Ordering::Relaxed);
    query_and_fill(vk, pg, st, item, &key)
}

/// The application pattern's last step, after a cache miss: the prepared point query, and a
/// hit fills the cache key `key` (SET EX).
pub(crate) fn query_and_fill(
    vk: &mut redis::Connection,
    pg: &mut postgres::Client,
    st: &postgres::Statement,
    item: &str,
    key: &str,
) -> Result<bool, String> {
    let found = pg
        .query_opt(st, &[&item])
        .map_err(|e| e.to_string())?
        .is_some();
    if found {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("1")
            .arg("EX")
            .arg(CACHE_TTL_S)
            .query(vk)
            .map_err(|e| e.to_string())?;
    }
    Ok(found)
}
