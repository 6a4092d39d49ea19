//! Unit and property tests of `canon.rs`: validation, each policy, idempotence, the hash.

use super::*;

fn canon(n: Normalize, item: &str) -> String {
    canonicalize(n, item.as_bytes(), b"")
        .unwrap()
        .entity
        .into_owned()
}

#[test]
fn the_ascii_fast_check_agrees_with_the_general_one() {
    let slow = |b: &[u8]| b.is_ascii() && !b.contains(&0);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for len in 0..40 {
        for round in 0..400 {
            let mut b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    b'a' + (x % 26) as u8
                })
                .collect();
            // One odd byte at each place in turn: NUL, a high byte, DEL, 0x01.
            if len > 0 {
                let odd = [0u8, 0x80, 0xff, 0x7f, 0x01, 0xc3][round % 6];
                b[(round / 6) % len] = odd;
            }
            assert_eq!(plain_ascii(&b), slow(&b), "{b:?}");
            assert_eq!(
                as_text(&b).is_some(),
                slow(&b) || (!b.contains(&0) && std::str::from_utf8(&b).is_ok())
            );
        }
    }
}

#[test]
fn none_keeps_bytes() {
    assert_eq!(canon(Normalize::None, " Alice "), " Alice ");
}

#[test]
fn lower_trims_and_lowercases() {
    assert_eq!(canon(Normalize::Lower, "  Alice\t"), "alice");
    assert_eq!(canon(Normalize::Lower, "ÉCOLE"), "école");
    assert!(matches!(
        Normalize::Lower.apply("plain"),
        Cow::Borrowed("plain")
    ));
}

#[test]
fn username_folds_width_case_and_space() {
    for v in ["Alice ", "ALICE", "alice", "ａｌｉｃｅ", " Ａlice\u{3000}"] {
        assert_eq!(canon(Normalize::Username, v), "alice", "{v:?}");
    }
    // Full case folding, not just lowercasing.
    assert_eq!(canon(Normalize::Username, "Straße"), "strasse");
    // Compatibility forms: the ligature ﬁ becomes fi.
    assert_eq!(canon(Normalize::Username, "ﬁona"), "fiona");
}

#[test]
fn normalization_is_idempotent() {
    for n in [Normalize::None, Normalize::Lower, Normalize::Username] {
        for v in [
            "Alice ",
            "ﬁona",
            "Straße",
            "ΣΑΣ",
            "x\u{0301}",
            "İstanbul",
            "  ㈱  ",
        ] {
            let once = n.apply(v).into_owned();
            assert_eq!(n.apply(&once), once, "{n:?} {v:?}");
        }
    }
}

#[test]
fn rejects_bad_input() {
    let n = Normalize::None;
    assert_eq!(canonicalize(n, b"", b""), Err(error::EMPTY_ITEM));
    assert_eq!(
        canonicalize(n, &[b'a'; MAX_ITEM_BYTES + 1], b""),
        Err(error::ITEM_TOO_LONG)
    );
    assert!(canonicalize(n, &[b'a'; MAX_ITEM_BYTES], b"").is_ok());
    assert_eq!(canonicalize(n, b"a\0b", b""), Err(error::ITEM_NOT_TEXT));
    assert_eq!(canonicalize(n, b"\xff", b""), Err(error::ITEM_NOT_TEXT));
    assert_eq!(canonicalize(n, b"a", b"s\0"), Err(error::SCOPE_NOT_TEXT));
    assert_eq!(
        canonicalize(n, b"a", &[b's'; MAX_SCOPE_BYTES + 1]),
        Err(error::SCOPE_TOO_LONG)
    );
    assert_eq!(
        canonicalize(Normalize::Lower, b"   ", b""),
        Err(error::ITEM_EMPTY_AFTER_NORMALIZE)
    );
}

/// Found by the `long_items_are_idempotent` property test: 512 × `ŉ` (1024 bytes) folds
/// to 512 × `ʼn` (1536 bytes), 512 × `İ` lowercases to 1536 bytes. Accepted, they were
/// stored in that form, which the next rebuild refused as too long: the member was missing
/// from the rebuilt filter, and EXISTS answered 0.
#[test]
fn an_item_lengthened_past_the_limit_by_normalization_is_refused() {
    for (n, c) in [(Normalize::Username, "ŉ"), (Normalize::Lower, "İ")] {
        assert_eq!(
            canonicalize(n, c.repeat(512).as_bytes(), b""),
            Err(error::ITEM_TOO_LONG_AFTER_NORMALIZE),
            "{n:?} {c}"
        );
        // Lengthened but within the limit: accepted, and stable.
        let fits = c.repeat(MAX_ITEM_BYTES / 3);
        let once = canonicalize(n, fits.as_bytes(), b"").unwrap();
        assert!(once.entity.len() > fits.len() && once.entity.len() <= MAX_ITEM_BYTES);
        let again = canonicalize(n, once.entity.as_bytes(), b"");
        assert_eq!(again, Ok(once.clone()));
    }
    // Unchanged for sets that store the item as given.
    assert!(canonicalize(Normalize::None, "ŉ".repeat(512).as_bytes(), b"").is_ok());
}

#[test]
fn scope_separates_memberships() {
    let a = canonicalize(Normalize::None, b"card", b"m1").unwrap();
    let b = canonicalize(Normalize::None, b"card", b"m2").unwrap();
    let c = canonicalize(Normalize::None, b"card", b"").unwrap();
    assert_ne!(a.hash, b.hash);
    assert_ne!(a.hash, c.hash);
    // "ab" + "" and "a" + "b" must not collide: the NUL separator keeps them apart.
    let d = canonicalize(Normalize::None, b"ab", b"").unwrap();
    let e = canonicalize(Normalize::None, b"a", b"b").unwrap();
    assert_ne!(d.hash, e.hash);
    assert_eq!(a.key_bytes(), b"card\0m1");
}

#[test]
fn hash_is_stable() {
    // Pinned: a persisted filter must mean the same thing on every build.
    let h = hash_parts("alice", "");
    assert_eq!(h, xxh3_128(b"alice\0"));
    // Every buffer tier (the edges of the small and the large one, and the heap).
    for len in [126, 127, 128, 300, 510, 511, 600] {
        let e = "x".repeat(len);
        assert_eq!(
            hash_parts(&e, "s"),
            xxh3_128(format!("{e}\0s").as_bytes()),
            "entity of {len} bytes"
        );
    }
}

/// Property tests: what a write stores is what a rebuild or the sync loop reads back.
mod props {
    use super::*;
    use proptest::prelude::*;

    const NORMS: [Normalize; 3] = [Normalize::None, Normalize::Lower, Normalize::Username];

    /// Characters where case mapping, compatibility forms, combining marks and Unicode
    /// white space meet, mixed with arbitrary ones.
    fn tricky() -> impl Strategy<Value = char> {
        prop_oneof![
            any::<char>(),
            prop::sample::select(vec![
                'a', 'Z', ' ', '\t', '\u{3000}', '\u{a0}', '\u{85}', 'İ', 'ı', 'ß', 'ẞ', 'Σ', 'ς',
                'σ', 'ﬁ', 'ﬃ', 'ŉ', 'ΐ', 'ﷺ', '\u{345}', '\u{301}', '\u{308}', '´', '˘', 'ǅ', 'ῼ',
                'ᾳ', 'Å', 'Ω', 'K', 'Ⅻ', '㈱', 'ｱ', 'ﾞ', '①', 'ǰ', 'ﬅ', 'Ꭰ', 'ꭰ',
            ]),
        ]
    }

    fn text(max: usize) -> impl Strategy<Value = String> {
        prop::collection::vec(tricky(), 0..max).prop_map(|v| v.into_iter().collect())
    }

    /// The stored form of every accepted item canonicalizes to itself, hash included.
    fn idempotent(norm: Normalize, item: &[u8], scope: &[u8]) -> Result<(), TestCaseError> {
        if let Ok(c) = canonicalize(norm, item, scope) {
            prop_assert!(
                norm.apply(&c.entity) == c.entity,
                "{:?} not idempotent",
                norm
            );
            let again = canonicalize(norm, c.entity.as_bytes(), c.scope.as_bytes());
            // (No item in the message: it may be 1 KiB.)
            prop_assert_eq!(again, Ok(c.clone()), "{:?}, {} bytes", norm, item.len());
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn canonicalization_is_idempotent(n in 0..3usize, item in text(24), scope in text(3)) {
            idempotent(NORMS[n], item.as_bytes(), scope.as_bytes())?;
        }

        #[test]
        fn canonicalization_of_any_bytes_is_idempotent(
            n in 0..3usize,
            item in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            idempotent(NORMS[n], &item, b"")?;
        }

        /// Items near the length limit whose normalized form is longer than the item.
        #[test]
        fn long_items_are_idempotent(n in 0..3usize, c in tricky(), pad in 0..8usize) {
            let reps = (MAX_ITEM_BYTES - pad) / c.len_utf8();
            let item: String = std::iter::repeat_n(c, reps).collect();
            idempotent(NORMS[n], item.as_bytes(), b"")?;
        }
    }
}
