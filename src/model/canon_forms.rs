//! Each character's `NORMALIZE username` form when it makes a piece of an item on its own
//! (`canon_username.rs` cuts an item into pieces that normalize independently): one table for
//! the Basic Multilingual Plane (256 KiB, and 6 KB of forms longer than one character), built
//! at module load (about 2 ms) from the crates' own answers.
//!
//! Why a piece normalizes on its own. Call a character a *boundary* when its combining class
//! is 0 and NFKC's quick check passes it: no character composes with one before it (those
//! that can are the quick check's "maybe"), and nothing reorders or composes across it. A
//! piece starts at every character `c` whose compatibility decomposition (NFKD) begins with
//! a boundary `d`. Then for an item `u c v`:
//! 1. NFKC(`u c v`) = NFKC(`u`) NFKC(`c v`): the decomposed text is cut right before `d`.
//! 2. NFKC(`c v`) begins with `d` or a character composed from `d` and marks after it: a
//!    character `y` whose NFKD begins with `d`.
//! 3. Case folding maps character by character, and for every character `y` whose NFKD
//!    begins with a boundary, the NFKD of `y`'s fold begins with a boundary too (a fact of
//!    the Unicode tables, checked on every code point by `fold_keeps_a_boundary_first`).
//! 4. So the second NFKC cuts at the same place, as in 1.
//!
//! The steps NFKC → fold → NFKC of the item are the steps of its pieces, end to end. Nearly
//! every character of a name starts a piece and is followed by one that does too (ASCII,
//! precomposed Latin, Greek, Cyrillic, CJK, full-width forms): its form is read here, with no
//! call into the crates. A combining mark (class ≠ 0), Hangul vowel and trailing jamo and a
//! few others start none: they join the piece before them, which the steps then normalize.

use std::sync::OnceLock;

use unicode_normalization::UnicodeNormalization;

use crate::model::canon_chars;

/// What the table says of a character: it joins the piece before it, or it starts a piece,
/// with the form it has when the piece is that character alone: itself, one other character,
/// or a longer text (`ﬁ` → `fi`, `ß` → `ss`, `㈱` → `(株)`). Held as one `u32`: the other
/// character, `SAME`, `JOINS`, or `TEXT` with the text's length (bits 16..24) and place in
/// `Forms::text` (bits 0..16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Form(u32);

const TEXT: u32 = 1 << 31;

impl Form {
    /// It joins the piece before it.
    pub const JOINS: Self = Self(u32::MAX);
    /// It starts a piece, and is its own form.
    pub const SAME: Self = Self(1 << 30);

    /// An ASCII character's: its lowercase.
    #[inline]
    pub fn ascii(b: u8) -> Self {
        if b.is_ascii_uppercase() {
            Self(u32::from(b.to_ascii_lowercase()))
        } else {
            Self::SAME
        }
    }
}

/// Every character's form: the table of the plane, and the longer forms' text.
pub struct Forms {
    entries: Box<[Form]>,
    text: String,
}

impl Forms {
    /// `c`'s form. Past the Basic Multilingual Plane every character joins (the steps
    /// normalize it, with the character before it): rare in names, and a cut is never needed
    /// for a correct form, only for a fast one.
    #[inline]
    pub fn get(&self, c: char) -> Form {
        if c.is_ascii() {
            return Form::ascii(c as u8);
        }
        self.entries.get(c as usize).copied().unwrap_or(Form::JOINS)
    }

    /// Appends the form `f`, one that is neither `SAME` nor `JOINS`.
    #[inline]
    pub fn push(&self, f: Form, out: &mut String) {
        debug_assert!(f != Form::SAME && f != Form::JOINS);
        if f.0 & TEXT != 0 {
            let (at, len) = ((f.0 & 0xFFFF) as usize, ((f.0 >> 16) & 0xFF) as usize);
            out.push_str(&self.text[at..at + len]);
        } else if let Some(c) = char::from_u32(f.0) {
            out.push(c);
        }
    }
}

/// The table, built at the first call (`prepare` makes that one at module load).
#[inline]
pub fn forms() -> &'static Forms {
    TABLE.get_or_init(build)
}

/// Builds the table now rather than at the first non-ASCII item: at module load, off any
/// client's path (with the character table it reads, `canon_chars`).
pub fn prepare() {
    TABLE.get_or_init(build);
}

/// Whether `c` is a boundary: combining class 0 and passed by NFKC's quick check.
fn boundary(c: char) -> bool {
    let f = canon_chars::facts(c);
    f.class() == 0 && f.nfkc_yes()
}

/// Whether a piece starts at `c`: its NFKD begins with a boundary.
fn starts_piece(c: char) -> bool {
    std::iter::once(c).nfkd().next().is_some_and(boundary)
}

/// `c` alone through the steps: NFKC, full case fold, NFKC (the item's ends are trimmed by
/// `canon_username.rs`, after the pieces are put together).
fn alone(c: char) -> String {
    let n: String = std::iter::once(c).nfkc().collect();
    caseless::default_case_fold_str(&n).nfkc().collect()
}

static TABLE: OnceLock<Forms> = OnceLock::new();

fn build() -> Forms {
    let mut text = String::new();
    // Surrogates are no characters: never looked up, left to join.
    let entries = (0..0x1_0000u32)
        .map(|u| char::from_u32(u).map_or(Form::JOINS, |c| entry(c, &mut text)))
        .collect();
    Forms { entries, text }
}

fn entry(c: char, text: &mut String) -> Form {
    if !starts_piece(c) {
        return Form::JOINS;
    }
    let f = canon_chars::facts(c);
    // In NFKC alone and its own fold: each step gives it back (no call to the crates for
    // most of the plane: CJK, most letters of most scripts, lowercase letters).
    if f.nfkc_yes() && f.folds_to_itself() {
        return Form::SAME;
    }
    let form = alone(c);
    let mut chars = form.chars();
    match (chars.next(), chars.next()) {
        (Some(one), None) if one == c => Form::SAME,
        (Some(one), None) => Form(one as u32),
        // Longer forms (about 1 200 of them, 6 KB in all) go to `text`; one that would not fit
        // the entry's fields would join instead, always correct (none does: the tests check).
        _ if form.len() <= 0xFF && text.len() + form.len() <= 0xFFFF => {
            let at = text.len() as u32;
            text.push_str(&form);
            Form(TEXT | (form.len() as u32) << 16 | at)
        }
        _ => Form::JOINS,
    }
}

#[cfg(test)]
#[path = "canon_forms_tests.rs"]
mod tests;
