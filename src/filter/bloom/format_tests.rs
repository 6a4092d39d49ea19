//! The binary form: round trips, every older version's fixture, damaged payloads.

// Used by the tests only: benches/filter.rs compiles this file without them.
#[allow(unused_imports)]
use super::super::fuse::MAX_PARTS;
#[allow(unused_imports)]
use super::super::tests::{built, h, measured_fpr};
#[allow(unused_imports)]
use super::super::*;
#[allow(unused_imports)]
use super::*;

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
    for parts in [1usize, 2, 3, 7, MAX_PARTS] {
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
