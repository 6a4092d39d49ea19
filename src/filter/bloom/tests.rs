use super::*;

/// A uniform 128-bit hash per `i`, like the canonical hash of an item (xxh3-128); no
/// other module, so `benches/filter.rs` can include this file.
pub(super) fn h(i: u64) -> u128 {
    xxhash_rust::xxh3::xxh3_128(format!("item-{i}").as_bytes())
}

/// The share of `probes` items `h(from..)`, never added, that `b` lets through.
pub(super) fn measured_fpr(b: &Bloom, from: u64, probes: u64) -> f64 {
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

pub(super) fn built(rows: u64, capacity: u64, fpr: f64) -> (Bloom, Vec<u128>) {
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
    // An estimate: an add whose bits were all set already (a false positive while filling,
    // about one in 5 000 here, depending on the order of the adds) is not counted.
    assert!((4_990..=5_000).contains(&b.items()), "{}", b.items());
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
            1 => (1..=super::super::fuse::MAX_PARTS).prop_map(Op::Rebuild),
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
