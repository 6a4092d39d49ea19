//! Tests of `canon_forms.rs`: the table against the crates on every character of the plane,
//! the fact of the Unicode tables the cuts rest on, and the pieces put together against the
//! steps on the whole item.

use caseless::Caseless;
use unicode_normalization::char::canonical_combining_class;
use unicode_normalization::{is_nfkc_quick, IsNormalized, UnicodeNormalization};

use super::*;
use crate::model::canon::Normalize;

/// A boundary by the crates' answers, asked directly (not through `canon_chars`' table).
fn crate_boundary(c: char) -> bool {
    canonical_combining_class(c) == 0 && is_nfkc_quick(std::iter::once(c)) == IsNormalized::Yes
}

fn nfkd_first(s: &str) -> Option<char> {
    s.nfkd().next()
}

/// `Username` as the reference spells it, without the trim: the whole string through each
/// step.
fn steps_reference(s: &str) -> String {
    let n: String = s.nfkc().collect();
    caseless::default_case_fold_str(&n).nfkc().collect()
}

fn username_reference(s: &str) -> String {
    steps_reference(s.trim()).trim().to_owned()
}

/// `c`'s form as text, or `None` when it joins the piece before it.
fn form_text(c: char) -> Option<String> {
    match forms().get(c) {
        Form::JOINS => None,
        Form::SAME => Some(c.to_string()),
        f => {
            let mut out = String::new();
            forms().push(f, &mut out);
            Some(out)
        }
    }
}

/// Every character: a piece starts at it exactly when its NFKD begins with a boundary (past
/// the plane: never), and then its form is the steps' on it alone. No character that starts a
/// piece was left to join for want of room in the table.
#[test]
fn every_character_has_the_steps_form() {
    let mut pieces = 0u32;
    for c in (0..=0x10_FFFFu32).filter_map(char::from_u32) {
        let starts =
            (c as u32) < 0x1_0000 && nfkd_first(&c.to_string()).is_some_and(crate_boundary);
        match form_text(c) {
            Some(form) => {
                assert!(starts, "U+{:04X} starts no piece", c as u32);
                assert_eq!(form, steps_reference(&c.to_string()), "U+{:04X}", c as u32);
                pieces += 1;
            }
            None => assert!(!starts, "U+{:04X} starts a piece", c as u32),
        }
    }
    // Nearly all of the plane: every letter, digit and symbol; not the marks.
    assert!(pieces > 60_000, "{pieces}");
}

/// Step 3 of the argument in `canon_forms.rs`, on every code point: when a character's NFKD
/// begins with a boundary, so does the NFKD of its full case fold. (Were it false for some
/// character, a fold could put a mark right after a cut, where the second NFKC would compose
/// it with the piece before.)
#[test]
fn fold_keeps_a_boundary_first() {
    let mut checked = 0u32;
    for y in (0..=0x10_FFFFu32).filter_map(char::from_u32) {
        if !nfkd_first(&y.to_string()).is_some_and(crate_boundary) {
            continue;
        }
        let folded: String = std::iter::once(y).default_case_fold().collect();
        assert!(
            nfkd_first(&folded).is_some_and(crate_boundary),
            "U+{:04X} folds to {folded:?}",
            y as u32
        );
        checked += 1;
    }
    assert!(checked > 1_000_000, "{checked}");
}

/// Every character of the plane alone, twice, and inside ASCII text: the pieces give the
/// steps' form on the whole item. (Past the plane no character starts a piece, and
/// `canon_python_tests.rs` checks every assigned one alone and inside ASCII text.)
#[test]
fn every_character_in_ascii_text_equals_the_reference() {
    for c in (0..0x1_0000u32).filter_map(char::from_u32) {
        for s in [c.to_string(), format!("{c}{c}"), format!("Ab{c}Cd")] {
            assert_eq!(
                Normalize::Username.apply(&s),
                username_reference(&s),
                "{s:?}"
            );
        }
    }
}

/// Every character of the plane after characters that compose with what follows them (a
/// Latin letter, Hangul leading jamo and syllable, Indic and kana letters that take a vowel
/// sign or voicing mark, a letter already followed by a mark) and before characters that
/// compose with what precedes them (combining marks of several classes, Hangul vowel and
/// trailing jamo, Indic vowel signs and length marks, the kana voicing mark): wherever a cut
/// falls, what meets across it gives the reference's form.
#[test]
fn every_character_of_the_plane_between_composing_neighbours() {
    let before = [
        "e",
        "A",
        "\u{1100}",
        "가",
        "\u{0B47}",
        "\u{0CC6}",
        "か",
        "e\u{0301}",
        "\u{03B9}",
    ];
    let after = [
        "\u{0301}",
        "\u{0345}",
        "\u{0316}",
        "\u{1161}",
        "\u{11A8}",
        "\u{0B3E}",
        "\u{0CD5}",
        "\u{3099}",
        "\u{0308}\u{0301}",
    ];
    for c in (0..0x1_0000u32).filter_map(char::from_u32) {
        for b in before {
            let s = format!("{b}{c}");
            assert_eq!(
                Normalize::Username.apply(&s),
                username_reference(&s),
                "{s:?}"
            );
        }
        for a in after {
            let s = format!("{c}{a}");
            assert_eq!(
                Normalize::Username.apply(&s),
                username_reference(&s),
                "{s:?}"
            );
        }
    }
}

#[test]
fn some_forms_known_by_heart() {
    let f = forms();
    assert_eq!(f.get('a'), Form::SAME);
    assert_eq!(f.get('李'), Form::SAME);
    for (c, form) in [
        ('A', "a"),
        ('Á', "á"),
        ('ｘ', "x"),
        ('ß', "ss"),
        ('㈱', "(株)"),
    ] {
        assert_eq!(form_text(c).as_deref(), Some(form), "{c}");
    }
    // A combining mark and a Hangul vowel join the piece before them.
    assert_eq!(f.get('\u{0301}'), Form::JOINS);
    assert_eq!(f.get('\u{1161}'), Form::JOINS);
    // Past the plane: the steps, with the character before.
    assert_eq!(f.get('𝐀'), Form::JOINS);
}
