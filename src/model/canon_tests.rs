//! Unit and property tests of `canon.rs`: validation, each policy, idempotence, the hash.

use super::*;
use crate::model::canon_username::{fold, nfkc, username_by_steps};

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

/// `Username` as the general path spells it, step by step, with no step skipped: the oracle
/// the fast paths are checked against. (`python_reference.rs` in the integration tests
/// checks this chain itself against Python's `unicodedata` on every code point.)
fn username_reference(s: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    let nfkc: String = s.trim().nfkc().collect();
    let folded = caseless::default_case_fold_str(&nfkc);
    let again: String = folded.nfkc().collect();
    again.trim().to_owned()
}

/// `Lower` by its definition.
fn lower_reference(s: &str) -> String {
    s.trim().to_lowercase()
}

/// Checks one string against both references, through `apply` and through `canonicalize`
/// (which takes its ASCII path from its own check of the bytes).
fn same_as_reference(s: &str) {
    for (n, want) in [
        (Normalize::Username, username_reference(s)),
        (Normalize::Lower, lower_reference(s)),
    ] {
        assert_eq!(n.apply(s), want, "{n:?} {s:?}");
        if n == Normalize::Username {
            assert_eq!(username_by_steps(s), want, "by the steps: {s:?}");
        }
        match canonicalize(n, s.as_bytes(), b"") {
            Ok(c) => assert_eq!(c.entity, want, "{n:?} {s:?}"),
            Err(e) => assert!(
                s.is_empty() || s.contains('\0') || want.is_empty(),
                "{n:?} {s:?}: {e}"
            ),
        }
    }
}

/// Calls `f` on every string of `len` characters drawn from `alphabet`.
fn every_string(alphabet: &[char], len: usize, f: &mut impl FnMut(&str)) {
    let mut idx = vec![0usize; len];
    let mut s = String::with_capacity(len);
    loop {
        s.clear();
        s.extend(idx.iter().map(|&i| alphabet[i]));
        f(&s);
        // The next combination, like an odometer; done when every digit wrapped.
        let mut p = 0;
        loop {
            if p == len {
                return;
            }
            idx[p] += 1;
            if idx[p] < alphabet.len() {
                break;
            }
            idx[p] = 0;
            p += 1;
        }
    }
}

/// The ASCII fast paths give exactly the general path's form. Every ASCII string of up to
/// two characters (NUL and every control character included); every string of up to four
/// of 16 characters that stand for every class the rules tell apart (the six that trim
/// removes, controls it keeps, the edges of A-Z and a-z and their neighbours, a digit);
/// and every string of up to seven of one character per class, which puts each class at
/// each end, inside, beside and between every other.
#[test]
fn the_ascii_fast_paths_equal_the_general_path_on_every_short_string() {
    let all: Vec<char> = (0u8..0x80).map(char::from).collect();
    let classes = [
        ' ', '\t', '\n', '\x0b', '\x0c', '\r', '\0', '\x1c', '\x1f', '\x7f', 'A', 'Z', '@', '[',
        'a', 'z',
    ];
    let one_each = [' ', '\x1f', 'A', 'a', '0'];
    let mut n = 0u64;
    let mut check = |s: &str| {
        same_as_reference(s);
        n += 1;
    };
    for len in 0..=2 {
        every_string(&all, len, &mut check);
    }
    for len in 3..=4 {
        every_string(&classes, len, &mut check);
    }
    for len in 5..=7 {
        every_string(&one_each, len, &mut check);
    }
    assert_eq!(
        n,
        1 + 128 + 128 * 128 + 16u64.pow(3) + 16u64.pow(4) + 5u64.pow(5) + 5u64.pow(6) + 5u64.pow(7)
    );
}

/// The trim rules on ASCII, spelled out: exactly TAB, LF, VT, FF, CR and SPACE go at either
/// end (Unicode `White_Space`); NUL, the other controls (U+001C..U+001F among them, which
/// Python's `str.strip` would remove) and DEL stay.
#[test]
fn which_ascii_characters_are_trimmed() {
    let trimmed: Vec<u8> = (0u8..0x80)
        .filter(|&b| {
            let s = format!("{}x{}", b as char, b as char);
            Normalize::Username.apply(&s) == "x" && Normalize::Lower.apply(&s) == "x"
        })
        .collect();
    assert_eq!(trimmed, b"\t\n\x0b\x0c\r ");
}

/// The pieces, the steps' skips (a step whose input is already in its form) and the in-place
/// trim give the reference's form on non-ASCII text, including forms every step changes.
#[test]
fn the_general_path_equals_the_reference() {
    for s in [
        "école",
        "École",
        " ＡＬＩＣＥ\u{3000}",
        "Straße",
        "ﬁona",
        "x\u{0301}",
        "İstanbul",
        "  ㈱  ",
        "用户名",
        "ΣΑΣ",
        "\u{85}é\u{85}",
        "é\u{1f}",
        "\u{2000}\u{2000}",
        "ǅ\u{345}",
        // NFKC puts a space in front (˘ is SPACE + U+0306, ﱞ SPACE + two Arabic marks that
        // compose with nothing): the last trim removes it, after NFKC once (`ﱞa`), after
        // NFKC twice (`˘a`), after folding (`ﱞA`, `˘A`), after folding and NFKC again.
        "ﱞa",
        "ﱞA",
        "˘a",
        "˘A",
        "˘ΐ\u{345}",
        "˘ᾈ",
    ] {
        same_as_reference(s);
    }
    // Nothing to change: the item itself comes back, borrowed.
    assert!(matches!(
        Normalize::Username.apply("école"),
        Cow::Borrowed("école")
    ));
    assert!(matches!(
        Normalize::Username.apply("alice"),
        Cow::Borrowed("alice")
    ));
}

/// Property tests: what a write stores is what a rebuild or the sync loop reads back, and
/// the fast paths give the reference's form.
mod props {
    use std::cell::Cell;

    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    const NORMS: [Normalize; 3] = [Normalize::None, Normalize::Lower, Normalize::Username];
    const CASES: u32 = 256;

    /// Characters where case mapping, compatibility forms, combining marks and Unicode
    /// white space meet, mixed with arbitrary ones.
    fn tricky() -> impl Strategy<Value = char> {
        prop_oneof![
            any::<char>(),
            prop::sample::select(vec![
                'a', 'Z', ' ', '\t', '\u{3000}', '\u{a0}', '\u{85}', 'İ', 'ı', 'ß', 'ẞ', 'Σ', 'ς',
                'σ', 'ﬁ', 'ﬃ', 'ŉ', 'ΐ', 'ﷺ', '\u{345}', '\u{301}', '\u{308}', '´', '˘', 'ǅ', 'ῼ',
                'ᾳ', 'Å', 'Ω', 'K', 'Ⅻ', '㈱', 'ｱ', 'ﾞ', '①', 'ǰ', 'ﬅ', 'Ꭰ', 'ꭰ',
                // Hangul jamo that compose (L V T) and a syllable they extend, a mark that
                // decomposes into two, marks of other classes, and full-width letters.
                '\u{1100}', '\u{1161}', '\u{11A8}', '가', '\u{344}', '\u{316}', '\u{5B0}', 'ｘ',
                'Ａ', 'é', 'ë', '李',
            ]),
            // ASCII, controls included: the fast paths' ground.
            (0u8..0x80).prop_map(char::from),
        ]
    }

    fn text(max: usize) -> impl Strategy<Value = String> {
        prop::collection::vec(tricky(), 0..max).prop_map(|v| v.into_iter().collect())
    }

    /// Bytes as a client may send them: mostly whole characters (ASCII or not), sometimes a
    /// byte that breaks UTF-8 or a NUL.
    fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            20 => tricky().prop_map(|c| c.to_string().into_bytes()),
            1 => any::<u8>().prop_map(|b| vec![b]),
        ];
        prop::collection::vec(piece, 0..max).prop_map(|v| v.concat())
    }

    /// The stored form of an accepted item canonicalizes to itself, hash included, and is
    /// the reference's form. `Ok(false)`: the item was refused.
    fn idempotent(norm: Normalize, item: &[u8], scope: &[u8]) -> Result<bool, TestCaseError> {
        let Ok(c) = canonicalize(norm, item, scope) else {
            return Ok(false);
        };
        prop_assert!(
            norm.apply(&c.entity) == c.entity,
            "{:?} not idempotent",
            norm
        );
        let again = canonicalize(norm, c.entity.as_bytes(), c.scope.as_bytes());
        // (No item in the message: it may be 1 KiB.)
        prop_assert_eq!(again, Ok(c.clone()), "{:?}, {} bytes", norm, item.len());
        let text = std::str::from_utf8(item).unwrap();
        let reference = match norm {
            Normalize::None => text.to_owned(),
            Normalize::Lower => lower_reference(text),
            Normalize::Username => username_reference(text),
        };
        prop_assert!(
            c.entity == reference,
            "{:?}: not the reference's form",
            norm
        );
        Ok(true)
    }

    /// Runs `check` on CASES values of `strategy` and fails unless at least `min_share` of
    /// them were accepted: a property that holds only for the inputs it refuses proves
    /// nothing.
    fn accepted_share<S: Strategy>(
        name: &str,
        strategy: S,
        min_share: f64,
        check: impl Fn(S::Value) -> Result<bool, TestCaseError>,
    ) {
        let (ran, accepted) = (Cell::new(0u32), Cell::new(0u32));
        let mut runner = TestRunner::new(Config::with_cases(CASES));
        let outcome = runner.run(&strategy, |v| {
            ran.set(ran.get() + 1);
            if check(v)? {
                accepted.set(accepted.get() + 1);
            }
            Ok(())
        });
        if let Err(e) = outcome {
            panic!("{name}: {e}");
        }
        let share = f64::from(accepted.get()) / f64::from(ran.get());
        println!(
            "{name}: {} of {} inputs accepted",
            accepted.get(),
            ran.get()
        );
        assert!(
            share >= min_share,
            "{name}: only {} of {} inputs accepted",
            accepted.get(),
            ran.get()
        );
    }

    #[test]
    fn canonicalization_is_idempotent() {
        let s = (0..3usize, text(24), text(3));
        accepted_share("text", s, 0.8, |(n, item, scope)| {
            idempotent(NORMS[n], item.as_bytes(), scope.as_bytes())
        });
    }

    #[test]
    fn canonicalization_of_any_bytes_is_idempotent() {
        accepted_share("bytes", (0..3usize, bytes(40)), 0.1, |(n, item)| {
            idempotent(NORMS[n], &item, b"")
        });
    }

    /// Items near the length limit whose normalized form is longer than the item.
    #[test]
    fn long_items_are_idempotent() {
        let s = (0..3usize, tricky(), 0..8usize);
        accepted_share("long", s, 0.5, |(n, c, pad)| {
            let reps = (MAX_ITEM_BYTES - pad) / c.len_utf8();
            let item: String = std::iter::repeat_n(c, reps).collect();
            idempotent(NORMS[n], item.as_bytes(), b"")
        });
    }

    /// The general path's steps, which copy the part before the first character they change,
    /// give what the crates give for the whole string.
    #[test]
    fn the_steps_equal_the_crates_on_the_whole_string() {
        use unicode_normalization::UnicodeNormalization;
        accepted_share("steps", text(24), 1.0, |s| {
            let n = nfkc(&s).unwrap_or_else(|| s.clone());
            prop_assert_eq!(n, s.nfkc().collect::<String>());
            let f = fold(&s).unwrap_or_else(|| s.clone());
            prop_assert_eq!(f, caseless::default_case_fold_str(&s));
            Ok(true)
        });
    }

    /// Random ASCII of any bytes but NUL, long and short, through both fast paths.
    #[test]
    fn the_ascii_fast_paths_equal_the_general_path() {
        let ascii = prop::collection::vec(1u8..0x80, 0..200);
        accepted_share("ascii", (1..3usize, ascii), 0.9, |(n, item)| {
            idempotent(NORMS[n], &item, b"")
        });
    }
}
