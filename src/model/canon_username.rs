//! `NORMALIZE username` on an item that is not all ASCII (`canon.rs` holds the policy and its
//! ASCII path): the item piece by piece, and the steps NFKC → fold → NFKC a piece may need.

use std::borrow::Cow;

use unicode_normalization::UnicodeNormalization;

use crate::model::canon_forms::{self, Form, Forms};
use crate::model::{canon_ascii, canon_chars};

/// `Username` on an item that is not all ASCII: trim → NFKC → full case fold → NFKC → trim,
/// piece by piece. The item is cut before every character that starts a piece
/// (`canon_forms.rs` says which, and why the pieces normalize independently); a piece of one
/// character takes its form from `canon_forms`' table, a longer one (a character and the
/// combining marks after it, a character past the Basic Multilingual Plane) goes through the
/// steps. Only the pieces that change are written, after a copy of the text before them; the
/// item itself is returned, borrowed, when none does.
pub(super) fn username(s: &str) -> Cow<'_, str> {
    let mut out = String::new();
    match username_into(s, &mut out) {
        Some(same) => Cow::Borrowed(same),
        None => Cow::Owned(out),
    }
}

/// [`username`], the form appended to `out` (`None`), or, when it is the trimmed item itself,
/// that returned (`Some`) and `out` left as it was: a batch writes its items' forms one after
/// another into one buffer.
pub(super) fn username_into<'s>(s: &'s str, out: &mut String) -> Option<&'s str> {
    let t = s.trim();
    let bytes = t.as_bytes();
    let mut w = Pieces {
        text: t,
        forms: canon_forms::forms(),
        base: out.len(),
        out,
        changed: false,
        copied: 0,
    };
    // The piece being read starts at `start`; `form` is its first character's form while it
    // is the piece's only character, `JOINS` once another joined it.
    let (mut start, mut form) = (0, Form::SAME);
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii() {
            // A run of ASCII: each character starts a piece, so all but the last make pieces
            // of their own, whose forms are their lowercase.
            let end = i + canon_ascii::ascii_len(&bytes[i..]);
            w.piece(start, i, form);
            w.ascii(i, end - 1);
            (start, form, i) = (end - 1, Form::ascii(bytes[end - 1]), end);
            continue;
        }
        let c = t[i..].chars().next().expect("i < t.len()");
        match w.forms.get(c) {
            Form::JOINS => form = Form::JOINS,
            f => {
                w.piece(start, i, form);
                (start, form) = (i, f);
            }
        }
        i += c.len_utf8();
    }
    w.piece(start, t.len(), form);
    if !w.changed {
        return Some(t);
    }
    let (out, base) = (w.out, w.base);
    out.push_str(&t[w.copied..]);
    // The form's own ends trimmed, in place.
    let end = base + out[base..].trim_end().len();
    out.truncate(end);
    let lead = out[base..].len() - out[base..].trim_start().len();
    out.drain(base..base + lead);
    None
}

/// The form being written, from `out[base..]` on: `text[..copied]`'s, once a piece changed.
struct Pieces<'a, 'o> {
    text: &'a str,
    forms: &'static Forms,
    out: &'o mut String,
    base: usize,
    changed: bool,
    copied: usize,
}

impl Pieces<'_, '_> {
    /// Writes the form of the piece `text[start..end]` (none when it is empty): `form` when
    /// it is one character, else by the steps.
    #[inline]
    fn piece(&mut self, start: usize, end: usize, form: Form) {
        if form == Form::SAME || start == end {
            return;
        }
        if form == Form::JOINS {
            return self.by_steps(start, end);
        }
        let forms = self.forms;
        forms.push(form, self.changed(start, end));
    }

    /// Writes the form of `text[start..end]`, pieces of one ASCII character each: lowercased.
    #[inline]
    fn ascii(&mut self, start: usize, end: usize) {
        let (text, run) = (self.text, &self.text.as_bytes()[start..end]);
        if !canon_ascii::has_upper(run) {
            return;
        }
        let k = run.iter().position(u8::is_ascii_uppercase).unwrap_or(0);
        let out = self.changed(start + k, end);
        let at = out.len();
        out.push_str(&text[start + k..end]);
        out[at..].make_ascii_lowercase();
    }

    /// Writes the form of the piece `text[start..end]` of several characters, by the steps.
    #[inline(never)]
    fn by_steps(&mut self, start: usize, end: usize) {
        if let Cow::Owned(form) = steps(&self.text[start..end]) {
            self.changed(start, end).push_str(&form);
        }
    }

    /// `out`, with the text before `start` in it, for the form of `text[start..end]`.
    #[inline]
    fn changed(&mut self, start: usize, end: usize) -> &mut String {
        if !self.changed {
            self.changed = true;
            self.out.reserve(self.text.len() + 8);
        }
        self.out.push_str(&self.text[self.copied..start]);
        self.copied = end;
        self.out
    }
}

/// NFKC → full case fold → NFKC of `s`, untrimmed. A step whose input is already in its form
/// (NFKC's quick check says yes; folding changes no character) is skipped rather than copied
/// (so is the second NFKC when folding changed nothing), a step copies the part before the
/// first character it changes, and the result borrows `s` when no step changed it.
fn steps(s: &str) -> Cow<'_, str> {
    let n1 = nfkc(s);
    let a = n1.as_deref().unwrap_or(s);
    // Unfolded, `a` is the last form, and in NFKC already.
    let Some(f) = fold(a) else {
        return n1.map_or(Cow::Borrowed(s), Cow::Owned);
    };
    Cow::Owned(nfkc(&f).unwrap_or(f))
}

/// `Username` by the steps on the whole item, not piece by piece: what the tests hold the
/// pieces to.
#[cfg(test)]
pub(super) fn username_by_steps(s: &str) -> Cow<'_, str> {
    let t = s.trim();
    match steps(t) {
        Cow::Borrowed(b) => Cow::Borrowed(b),
        Cow::Owned(o) => Cow::Owned(o.trim().to_owned()),
    }
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
