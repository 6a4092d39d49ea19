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

/// What a character that starts a piece becomes when the piece is that character alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Itself.
    Same,
    /// One other character.
    Char(char),
    /// Two characters or more (`ﬁ` → `fi`, `ß` → `ss`, `㈱` → `(株)`).
    Text(&'static str),
}

/// `c`'s form when it starts a piece, or `None` when it joins the piece before it. Past the
/// Basic Multilingual Plane every character answers `None` (the steps normalize it, with the
/// character before it): rare in names, and a cut is never needed for a correct form, only
/// for a fast one.
#[inline]
pub fn form(c: char) -> Option<Form> {
    if c.is_ascii() {
        return Some(if c.is_ascii_uppercase() {
            Form::Char(c.to_ascii_lowercase())
        } else {
            Form::Same
        });
    }
    let table = TABLE.get_or_init(build);
    let e = *table.entries.get(c as usize)?;
    if e == JOINS {
        None
    } else if e & TEXT != 0 {
        let (at, len) = ((e & 0xFFFF) as usize, ((e >> 16) & 0xFF) as usize);
        Some(Form::Text(&table.text[at..at + len]))
    } else if e == c as u32 {
        Some(Form::Same)
    } else {
        // Stored from a `char` by `entry`.
        char::from_u32(e).map(Form::Char)
    }
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

/// One entry per character of the plane: `JOINS`, a character (the form; `c` itself for
/// `Same`), or `TEXT` with the form's length (bits 16..24) and place in `text` (bits 0..16).
struct Table {
    entries: Box<[u32]>,
    text: String,
}

const JOINS: u32 = u32::MAX;
const TEXT: u32 = 1 << 31;

static TABLE: OnceLock<Table> = OnceLock::new();

fn build() -> Table {
    let mut text = String::new();
    // Surrogates are no characters: never looked up, left `JOINS`.
    let entries = (0..0x1_0000u32)
        .map(|u| char::from_u32(u).map_or(JOINS, |c| entry(c, &mut text)))
        .collect();
    Table { entries, text }
}

fn entry(c: char, text: &mut String) -> u32 {
    if !starts_piece(c) {
        return JOINS;
    }
    let f = canon_chars::facts(c);
    // In NFKC alone and its own fold: each step gives it back (no call to the crates for
    // most of the plane: CJK, most letters of most scripts, lowercase letters).
    if f.nfkc_yes() && f.folds_to_itself() {
        return c as u32;
    }
    let form = alone(c);
    let mut chars = form.chars();
    match (chars.next(), chars.next()) {
        (Some(one), None) => one as u32,
        // Longer forms (about 1 200 of them, 6 KB in all) go to `text`; one that would not fit
        // the entry's fields would join instead, always correct (none does: the tests check).
        _ if form.len() <= 0xFF && text.len() + form.len() <= 0xFFFF => {
            let at = text.len() as u32;
            text.push_str(&form);
            TEXT | (form.len() as u32) << 16 | at
        }
        _ => JOINS,
    }
}

#[cfg(test)]
#[path = "canon_forms_tests.rs"]
mod tests;
