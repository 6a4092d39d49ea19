//! The one canonicalization function: ADD, EXISTS, DEL, the filter build and (later) sync all
//! turn a raw item and scope into the same `Canon` here, so the tiers can never disagree.

use std::borrow::Cow;

use xxhash_rust::xxh3::xxh3_128;

use crate::model::canon_username::{username, username_into};
use crate::model::{canon_ascii, error};

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
    ///
    /// "Trimmed" means Rust's `str::trim`: the Unicode `White_Space` characters at either end.
    /// In ASCII those are TAB, LF, VT, FF, CR and SPACE; the other control characters (NUL,
    /// U+001C..U+001F, DEL) are kept.
    pub fn apply(self, s: &str) -> Cow<'_, str> {
        self.form(s, s.is_ascii())
    }

    /// [`apply`](Self::apply) to `s`, known to be ASCII or not.
    #[inline]
    fn form(self, s: &str, ascii: bool) -> Cow<'_, str> {
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
            // On ASCII, NFKC is the identity and full case folding maps A-Z to a-z and nothing
            // else, so the form is the trimmed, lowercased item, made without looking up each
            // character as the general path does (`canon_tests.rs` proves the two equal).
            Self::Username if ascii => ascii_lower(s),
            Self::Username => username(s),
        }
    }
}

/// `s` trimmed and with A-Z lowered, borrowed when neither changes it. `s` is ASCII, where
/// `str::trim` removes TAB, LF, VT, FF, CR and SPACE: when neither end is one of those, the
/// trim is skipped, and the letters are looked for eight bytes at a time.
#[inline]
fn ascii_lower(s: &str) -> Cow<'_, str> {
    let white = |c: &u8| matches!(c, b'\t'..=b'\r' | b' ');
    let b = s.as_bytes();
    let t = if b.first().is_some_and(white) || b.last().is_some_and(white) {
        s.trim()
    } else {
        s
    };
    if canon_ascii::has_upper(t.as_bytes()) {
        Cow::Owned(t.to_ascii_lowercase())
    } else {
        Cow::Borrowed(t)
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

/// `b` as text, and whether it is ASCII; `None` unless it is UTF-8 without NUL.
fn as_text(b: &[u8]) -> Option<(&str, bool)> {
    if plain_ascii(b) {
        // SAFETY: ASCII is UTF-8.
        return Some((unsafe { std::str::from_utf8_unchecked(b) }, true));
    }
    // Not plain ASCII: a NUL, or a byte ≥ 0x80.
    if b.contains(&0) {
        return None;
    }
    std::str::from_utf8(b).ok().map(|s| (s, false))
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
    let (entity, scope) = canonical_text(norm, item, scope)?;
    let hash = hash_parts(&entity, scope);
    Ok(Canon {
        entity,
        scope,
        hash,
    })
}

/// [`canonicalize`] of every item of one call (MEXISTS, MADD) under one scope: the same forms
/// and errors, the first item that fails named (0-based). A form that is not its item's own
/// text is written into `buf` (one buffer for the call, cleared first, which the forms borrow)
/// rather than into a string of its own: a non-ASCII `Username` item allocates nothing.
pub fn canonicalize_all<'a>(
    norm: Normalize,
    items: &[&'a [u8]],
    scope: &'a [u8],
    buf: &'a mut String,
) -> Result<Vec<Canon<'a>>, (usize, &'static str)> {
    /// Where an item's form is: its own (the item's text, or a string), or in `buf`.
    enum Held<'a> {
        Own(Cow<'a, str>),
        InBuf(std::ops::Range<usize>),
    }
    buf.clear();
    let mut held = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let ((item, ascii), scope) = checked(item, scope).map_err(|e| (i, e))?;
        let start = buf.len();
        let form = match norm {
            Normalize::Username if !ascii => match username_into(item, buf) {
                Some(same) => Held::Own(Cow::Borrowed(same)),
                None => Held::InBuf(start..buf.len()),
            },
            _ => Held::Own(norm.form(item, ascii)),
        };
        let len = match &form {
            Held::Own(own) => own.len(),
            Held::InBuf(at) => at.len(),
        };
        check_form(len).map_err(|e| (i, e))?;
        held.push((form, scope));
    }
    let buf: &'a str = buf;
    Ok(held
        .into_iter()
        .map(|(form, scope)| {
            let entity = match form {
                Held::Own(own) => own,
                Held::InBuf(at) => Cow::Borrowed(&buf[at]),
            };
            Canon {
                hash: hash_parts(&entity, scope),
                entity,
                scope,
            }
        })
        .collect())
}

/// [`canonicalize`] without the hash: the canonical entity and scope, for a tokenized set,
/// which hashes the token made of them instead.
pub fn canonical_text<'a>(
    norm: Normalize,
    item: &'a [u8],
    scope: &'a [u8],
) -> Result<(Cow<'a, str>, &'a str), &'static str> {
    let ((item, ascii), scope) = checked(item, scope)?;
    let entity = norm.form(item, ascii);
    check_form(entity.len())?;
    Ok((entity, scope))
}

/// The item as text and whether it is ASCII, and the scope as text, once they pass the checks
/// made before normalizing.
fn checked<'a>(
    item: &'a [u8],
    scope: &'a [u8],
) -> Result<((&'a str, bool), &'a str), &'static str> {
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
    let (scope, _) = as_text(scope).ok_or(error::SCOPE_NOT_TEXT)?;
    Ok((item, scope))
}

/// The checks of a normalized form of `len` bytes.
fn check_form(len: usize) -> Result<(), &'static str> {
    if len == 0 {
        return Err(error::ITEM_EMPTY_AFTER_NORMALIZE);
    }
    // Case mapping and compatibility forms can lengthen an item (`İ` → `i̇`, `ŉ` → `ʼn`, `ﷺ`
    // → 33 bytes). The stored form is canonicalized again by every rebuild and sync pass, so it
    // must pass the same checks, or the member would lose its filter bits (a false "absent").
    if len > MAX_ITEM_BYTES {
        return Err(error::ITEM_TOO_LONG_AFTER_NORMALIZE);
    }
    Ok(())
}

#[cfg(test)]
#[path = "canon_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "canon_python_tests.rs"]
mod python_tests;

#[cfg(test)]
#[path = "canon_batch_tests.rs"]
mod batch_tests;
