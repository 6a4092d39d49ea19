//! `NORMALIZE username` on an item that is not all ASCII (`canon.rs` holds the policy and its
//! ASCII path): NFKC, case folding, NFKC again, each step only where it changes something.

use std::borrow::Cow;

use unicode_normalization::UnicodeNormalization;

use crate::model::canon_chars;

/// `Username`'s general path: trim → NFKC → full case fold → NFKC → trim. A step whose input
/// is already in its form (NFKC's quick check says yes; folding changes no character) is
/// skipped rather than copied (so is the second NFKC when folding changed nothing), a step
/// copies the part before the first character it changes, and the result borrows the item
/// when no step changed it.
pub(super) fn username(s: &str) -> Cow<'_, str> {
    let t = s.trim();
    let n1 = nfkc(t);
    let a = n1.as_deref().unwrap_or(t);
    // Unfolded, `a` is the last form, and in NFKC already.
    let Some(f) = fold(a) else {
        return match n1 {
            None => Cow::Borrowed(t),
            Some(owned) => Cow::Owned(trimmed(owned)),
        };
    };
    let n2 = nfkc(&f);
    Cow::Owned(trimmed(n2.unwrap_or(f)))
}

/// NFKC of `s`, or `None` when `s` is already in NFKC. Only the segments that need it are
/// normalized; the text between them is in NFKC and is copied. A segment runs from the last
/// starter before a character that fails NFKC's quick check (or breaks the canonical order)
/// to the next boundary: a character of combining class 0 that passes the quick check (ASCII
/// among them). Both cuts are safe: such a character composes with nothing before it (a
/// character that can is one the quick check answers "maybe" or "no"), and nothing reorders
/// across a starter (UAX #15; `canon_python_tests.rs` checks every code point alone and
/// after ASCII text, `canon_tests.rs` random text against the whole string normalized).
pub(super) fn nfkc(s: &str) -> Option<String> {
    let boundary = |c: char| {
        c.is_ascii() || {
            let f = canon_chars::facts(c);
            f.class() == 0 && f.nfkc_yes()
        }
    };
    let mut out: Option<String> = None;
    // `s[..copied]` is in `out`; `starter` the last boundary seen, `i` the next character.
    let (mut copied, mut starter, mut last_class, mut i) = (0, 0, 0, 0);
    while let Some(c) = s[i..].chars().next() {
        let next = i + c.len_utf8();
        if c.is_ascii() {
            (starter, last_class, i) = (i, 0, next);
            continue;
        }
        let facts = canon_chars::facts(c);
        let class = facts.class();
        let ordered = class == 0 || last_class <= class;
        if !ordered || !facts.nfkc_yes() {
            let end = s[next..]
                .char_indices()
                .find(|&(_, c)| boundary(c))
                .map_or(s.len(), |(k, _)| next + k);
            let o = out.get_or_insert_with(|| String::with_capacity(s.len() + 8));
            o.push_str(&s[copied..starter]);
            o.extend(s[starter..end].nfkc());
            (copied, starter, last_class, i) = (end, end, 0, end);
            continue;
        }
        if class == 0 {
            starter = i;
        }
        last_class = class;
        i = next;
    }
    out.map(|mut o| {
        o.push_str(&s[copied..]);
        o
    })
}

/// The full case fold of `s`, or `None` when it changes no character. Folding maps each
/// character on its own, so the part before the first character it changes is copied.
pub(super) fn fold(s: &str) -> Option<String> {
    use caseless::Caseless;
    let unchanged = |c: char| {
        if c.is_ascii() {
            return !c.is_ascii_uppercase();
        }
        canon_chars::facts(c).folds_to_itself()
    };
    let (at, _) = s.char_indices().find(|&(_, c)| !unchanged(c))?;
    let mut out = String::with_capacity(s.len() + 8);
    out.push_str(&s[..at]);
    for c in s[at..].chars() {
        if unchanged(c) {
            out.push(c);
        } else {
            out.extend(std::iter::once(c).default_case_fold());
        }
    }
    Some(out)
}

/// `s.trim()`, reusing `s`'s buffer.
fn trimmed(mut s: String) -> String {
    let end = s.trim_end().len();
    s.truncate(end);
    let start = s.len() - s.trim_start().len();
    s.drain(..start);
    s
}
