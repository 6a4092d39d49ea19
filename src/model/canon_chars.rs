//! What `Username`'s steps ask of each character (`canon_username.rs`, and `canon_forms.rs`
//! as it builds its table): its canonical combining class, whether NFKC's quick check passes
//! it, and whether full case folding leaves it as it is. The `unicode-normalization` and
//! `caseless` crates answer each by a search of their tables, which made those questions a
//! third of a non-ASCII item's canonicalization; here the answers for the Basic Multilingual
//! Plane (every character of nearly every name) are asked of those same crates once, into one
//! table of 128 KiB, and read back by index. Past the plane the crates are asked as before.
//! The same answers by construction, and the tests compare every character's.

use std::sync::OnceLock;

use caseless::Caseless;
use unicode_normalization::char::canonical_combining_class;
use unicode_normalization::{is_nfkc_quick, IsNormalized};

/// The answers for one character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts(u16);

const NFKC_YES: u16 = 1 << 8;
const FOLDS_TO_ITSELF: u16 = 1 << 9;

impl Facts {
    /// Its canonical combining class (0 for a starter).
    pub fn class(self) -> u8 {
        self.0 as u8
    }

    /// NFKC's quick check says yes for it alone.
    pub fn nfkc_yes(self) -> bool {
        self.0 & NFKC_YES != 0
    }

    /// Full case folding maps it to itself.
    pub fn folds_to_itself(self) -> bool {
        self.0 & FOLDS_TO_ITSELF != 0
    }
}

/// The crates' answers for `c`.
fn ask(c: char) -> Facts {
    let mut bits = canonical_combining_class(c) as u16;
    if is_nfkc_quick(std::iter::once(c)) == IsNormalized::Yes {
        bits |= NFKC_YES;
    }
    let mut f = std::iter::once(c).default_case_fold();
    if f.next() == Some(c) && f.next().is_none() {
        bits |= FOLDS_TO_ITSELF;
    }
    Facts(bits)
}

/// The answers for `c`: from the table in the Basic Multilingual Plane, else asked.
#[inline]
pub fn facts(c: char) -> Facts {
    match PLANE.get_or_init(build).get(c as usize) {
        Some(&bits) => Facts(bits),
        None => ask(c),
    }
}

/// Builds the table now rather than at the first non-ASCII item (5 to 10 ms of one core, in
/// a release build): at module load, off any client's path.
pub fn prepare() {
    PLANE.get_or_init(build);
}

static PLANE: OnceLock<Box<[u16]>> = OnceLock::new();

fn build() -> Box<[u16]> {
    // Surrogates are no characters: never looked up, left 0.
    (0..0x1_0000u32)
        .map(|u| char::from_u32(u).map_or(0, |c| ask(c).0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character of the table, and those past it, answers what the crates answer.
    #[test]
    fn every_character_answers_as_the_crates_do() {
        for c in (0..=0x10_FFFFu32).filter_map(char::from_u32) {
            assert_eq!(facts(c), ask(c), "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn some_answers_known_by_heart() {
        let a = facts('A');
        assert!(a.nfkc_yes() && !a.folds_to_itself() && a.class() == 0);
        let acute = facts('\u{0301}');
        assert_eq!(acute.class(), 230);
        assert!(!facts('ｘ').nfkc_yes());
        assert!(facts('李').nfkc_yes() && facts('李').folds_to_itself());
    }
}
