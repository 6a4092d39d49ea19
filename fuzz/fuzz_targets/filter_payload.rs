//! The filter payload decoder (`FilterValue::from_bytes`: its origin envelope, then
//! `Bloom::from_bytes`): what an RDB load, `MEMBER._LOAD` (AOF and replication) and the cluster
//! RDB aux field hand it. Any bytes must be refused cleanly or decoded into a filter that
//! re-encodes to the same bytes (a payload of the previous version gains the envelope).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use member::model::slotset::SlotSet;
use member::filter::{Bloom, Coverage, FORMAT_VERSION};
use member::filter::origin::Origin;
use member::filter::value::FilterValue;
use xxhash_rust::xxh3::xxh3_64;

/// Offsets in the Bloom payload (src/filter/bloom/mod.rs `write_bytes`).
const ONES_AT: usize = 24;
const SUM_AT: usize = 57;
const HEADER_LEN: usize = 65;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any bytes.
    Raw(Vec<u8>),
    /// A payload this build wrote, then edited: byte edits, a cut, and optionally the
    /// checksum and bit count made to agree again, so the checks behind them are reached.
    Edited {
        capacity: u16,
        fpr_per_mille: u16,
        hashes: Vec<u128>,
        set: Option<u8>,
        slots: Option<Vec<u16>>,
        origin: Option<(u128, Option<i64>)>,
        complete: bool,
        watermark: Option<i64>,
        edits: Vec<(u16, u8)>,
        cut: Option<u16>,
        fix_sum: bool,
        fix_ones: bool,
    },
}

fn written(input: Input) -> Vec<u8> {
    let Input::Edited {
        capacity,
        fpr_per_mille,
        hashes,
        set,
        slots,
        origin,
        complete,
        watermark,
        edits,
        cut,
        fix_sum,
        fix_ones,
    } = input
    else {
        let Input::Raw(b) = input else { unreachable!() };
        return b;
    };
    let fpr = (fpr_per_mille % 999 + 1) as f64 / 1000.0;
    let mut bloom = Bloom::new(capacity as u64 % 2048, fpr);
    for h in &hashes {
        bloom.add(*h);
    }
    let mut v = FilterValue::built(bloom, watermark.unwrap_or(0), "s");
    v.cov = Coverage {
        complete,
        watermark,
    };
    v.set = set.map(|n| "abcdefghij_0123456789"[..(n % 20 + 1) as usize].to_string());
    v.slots = slots.map(|s| s.into_iter().collect::<SlotSet>());
    v.origin = origin.map(|(db, set_id)| Origin { db, set_id });
    let mut b = v.to_bytes();
    // Where the Bloom payload starts, behind the envelopes.
    let at = b.len() - v.bloom.serialized_len();
    for (off, x) in edits {
        if !b.is_empty() {
            let i = off as usize % b.len();
            b[i] ^= x;
        }
    }
    if let Some(c) = cut {
        b.truncate(c as usize % (b.len() + 1));
    }
    if b.len() >= at + HEADER_LEN {
        let body = b[at + HEADER_LEN..].to_vec();
        if fix_ones {
            let ones: u64 = body.iter().map(|x| x.count_ones() as u64).sum();
            b[at + ONES_AT..at + ONES_AT + 8].copy_from_slice(&ones.to_le_bytes());
        }
        if fix_sum {
            b[at + SUM_AT..at + SUM_AT + 8].copy_from_slice(&xxh3_64(&body).to_le_bytes());
        }
    }
    b
}

fuzz_target!(|input: Input| {
    let b = written(input);
    let _ = Bloom::from_bytes(&b);
    let Ok(mut v) = FilterValue::from_bytes(&b) else {
        return;
    };
    // A decoded filter works, and means what it was written to mean.
    let again = v.to_bytes();
    let w = FilterValue::from_bytes(&again).expect("a re-encoded filter decodes");
    assert_eq!(w.bloom, v.bloom);
    assert_eq!(w.cov, v.cov);
    assert_eq!(w.set, v.set);
    assert_eq!(w.slots, v.slots);
    assert_eq!(w.origin, v.origin);
    let version = b.len() >= again.len() && {
        let at = b.len() - v.bloom.serialized_len();
        u16::from_le_bytes([b[at + 4], b[at + 5]]) == FORMAT_VERSION
    };
    if version {
        assert_eq!(
            again, b,
            "a current-version payload re-encodes to its own bytes"
        );
    }
    for h in [0u128, 1, u128::MAX, 0x9e37_79b9_7f4a_7c15] {
        v.add(h);
        assert!(v.bloom.contains(h), "no false negative after a load");
    }
    let _ = (v.bloom.estimated_fpr(), v.bloom.fill(), v.covers(7));
});
