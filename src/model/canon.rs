//! The one canonicalization function: ADD, EXISTS, DEL, the filter build and (later) sync all
//! turn a raw item and scope into the same `Canon` here, so the tiers can never disagree.

use std::borrow::Cow;

use unicode_normalization::UnicodeNormalization;
use xxhash_rust::xxh3::xxh3_128;

use crate::model::error;

/// Longest raw item accepted, in bytes (before normalization).
pub const MAX_ITEM_BYTES: usize = 1024;
/// Longest scope accepted, in bytes.
pub const MAX_SCOPE_BYTES: usize = 256;

/// How a set turns user input into its stored form. Fixed when the set is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Normalize {
    /// Bytes as given.
    None,
    /// Trimmed of surrounding white space, then lowercased.
    Lower,
    /// Unicode NFKC, case folded, trimmed: `Alice `, `ALICE` and `ａｌｉｃｅ` are one name.
    Username,
}

impl Normalize {
    pub fn parse(s: &[u8]) -> Option<Self> {
        match s.to_ascii_lowercase().as_slice() {
            b"none" => Some(Self::None),
            b"lower" => Some(Self::Lower),
            b"username" => Some(Self::Username),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Lower => "lower",
            Self::Username => "username",
        }
    }

    /// Applies the policy. Idempotent: `apply(apply(x)) == apply(x)`, which is what lets a
    /// rebuild re-canonicalize rows that were stored already normalized.
    pub fn apply(self, s: &str) -> Cow<'_, str> {
        match self {
            Self::None => Cow::Borrowed(s),
            Self::Lower => {
                let t = s.trim();
                if t.bytes().any(|b| b.is_ascii_uppercase() || b >= 0x80) {
                    Cow::Owned(t.to_lowercase())
                } else {
                    Cow::Borrowed(t)
                }
            }
            Self::Username => {
                let nfkc: String = s.trim().nfkc().collect();
                let folded = caseless::default_case_fold_str(&nfkc);
                let again: String = folded.nfkc().collect();
                Cow::Owned(again.trim().to_owned())
            }
        }
    }
}

/// A membership in canonical form: what the database stores (`entity`, `scope`), the bytes
/// the exact-match key is named after (`key`), and the 128-bit hash the filter and the
/// recent-writes marks use (computed once per request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Canon<'a> {
    pub entity: Cow<'a, str>,
    pub scope: &'a str,
    pub hash: u128,
}

impl Canon<'_> {
    /// `entity NUL scope`: unambiguous because neither part may contain NUL.
    pub fn key_bytes(&self) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.entity.len() + 1 + self.scope.len());
        k.extend_from_slice(self.entity.as_bytes());
        k.push(0);
        k.extend_from_slice(self.scope.as_bytes());
        k
    }
}

/// Hash of the canonical key `entity NUL scope`; stable across builds and platforms, so a
/// persisted filter means the same thing everywhere.
pub fn hash_parts(entity: &str, scope: &str) -> u128 {
    let total = entity.len() + 1 + scope.len();
    // Stack buffers; the small one covers nearly every item and is cheap to zero per call.
    if total <= 128 {
        let mut buf = [0u8; 128];
        buf[..entity.len()].copy_from_slice(entity.as_bytes());
        buf[entity.len() + 1..total].copy_from_slice(scope.as_bytes());
        xxh3_128(&buf[..total])
    } else if total <= 512 {
        let mut buf = [0u8; 512];
        buf[..entity.len()].copy_from_slice(entity.as_bytes());
        buf[entity.len() + 1..total].copy_from_slice(scope.as_bytes());
        xxh3_128(&buf[..total])
    } else {
        let mut v = Vec::with_capacity(total);
        v.extend_from_slice(entity.as_bytes());
        v.push(0);
        v.extend_from_slice(scope.as_bytes());
        xxh3_128(&v)
    }
}

fn as_text(b: &[u8]) -> Option<&str> {
    if plain_ascii(b) {
        // SAFETY: ASCII is UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(b) });
    }
    if b.contains(&0) {
        return None;
    }
    std::str::from_utf8(b).ok()
}

/// Whether `b` is ASCII without NUL, eight bytes at a time: the common item, accepted in one
/// pass (the hot path's general check read it twice, through calls, at ~17 ns per item).
#[inline]
fn plain_ascii(b: &[u8]) -> bool {
    const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let mut words = b.chunks_exact(8);
    for w in words.by_ref() {
        let w = u64::from_ne_bytes(w.try_into().unwrap());
        // A byte ≥ 0x80, or a zero byte (exact for "any": a borrow only runs above a zero).
        if w & HIGH != 0 || w.wrapping_sub(LOW) & !w & HIGH != 0 {
            return false;
        }
    }
    words.remainder().iter().all(|&c| c != 0 && c < 0x80)
}

/// Validates and canonicalizes one item and scope under a set's policy. The error is the exact
/// reply text. Scopes are compared byte for byte (not normalized).
pub fn canonicalize<'a>(
    norm: Normalize,
    item: &'a [u8],
    scope: &'a [u8],
) -> Result<Canon<'a>, &'static str> {
    if item.is_empty() {
        return Err(error::EMPTY_ITEM);
    }
    if item.len() > MAX_ITEM_BYTES {
        return Err(error::ITEM_TOO_LONG);
    }
    if scope.len() > MAX_SCOPE_BYTES {
        return Err(error::SCOPE_TOO_LONG);
    }
    let item = as_text(item).ok_or(error::ITEM_NOT_TEXT)?;
    let scope = as_text(scope).ok_or(error::SCOPE_NOT_TEXT)?;
    let entity = norm.apply(item);
    if entity.is_empty() {
        return Err(error::ITEM_EMPTY_AFTER_NORMALIZE);
    }
    // Case mapping and compatibility forms can lengthen an item (`İ` → `i̇`, `ŉ` → `ʼn`, `ﷺ`
    // → 33 bytes). The stored form is canonicalized again by every rebuild and sync pass, so it
    // must pass the same checks, or the member would lose its filter bits (a false "absent").
    if entity.len() > MAX_ITEM_BYTES {
        return Err(error::ITEM_TOO_LONG_AFTER_NORMALIZE);
    }
    let hash = hash_parts(&entity, scope);
    Ok(Canon {
        entity,
        scope,
        hash,
    })
}

#[cfg(test)]
mod tests {
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
                    'a', 'Z', ' ', '\t', '\u{3000}', '\u{a0}', '\u{85}', 'İ', 'ı', 'ß', 'ẞ', 'Σ',
                    'ς', 'σ', 'ﬁ', 'ﬃ', 'ŉ', 'ΐ', 'ﷺ', '\u{345}', '\u{301}', '\u{308}', '´', '˘',
                    'ǅ', 'ῼ', 'ᾳ', 'Å', 'Ω', 'K', 'Ⅻ', '㈱', 'ｱ', 'ﾞ', '①', 'ǰ', 'ﬅ', 'Ꭰ', 'ꭰ',
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
}
