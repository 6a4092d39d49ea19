//! The ring of tokenization keys a node holds, pure: parsed from the text of the file
//! `member.token-key-file` names (docs/security.md, "Key rings"). A file of one hex key is a
//! ring of one, whose id is `default`; a file of lines `<id> <hex key>` holds several, the first
//! being the one new sets are created under. A set is served by the key whose fingerprint it
//! recorded, wherever that key sits in the ring. Nothing here quotes the file: an error names
//! a line by its number only, since a key written where an id belongs is still a key.

use crate::model::token::{Key, KeyError};

/// The id of a file's only key when the file holds just the key.
pub const DEFAULT_ID: &str = "default";
/// Most keys a ring holds.
pub const MAX_KEYS: usize = 64;
/// Longest key id.
pub const MAX_ID_BYTES: usize = 32;
/// Largest ring file read: every key at its longest, with its id, and room for comments.
pub const MAX_FILE_BYTES: usize = 16 * 1024;

/// One key of the ring and the id the file gives it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub id: String,
    pub key: Key,
}

/// The keys, in the file's order (at least one).
#[derive(Clone, Debug)]
pub struct Ring {
    entries: Vec<Entry>,
}

/// Why a file's text is not a ring. The text follows `member.token-key-file <path>: `.
#[derive(Debug, PartialEq, Eq)]
pub enum RingError {
    /// A file of one key whose key is not one (the error `Key::from_file_text` gives).
    Key(KeyError),
    /// Line `n` (from 1) holds a key that is not one.
    LineKey(usize, KeyError),
    /// Line `n` is not `<id> <hex key>`.
    Shape(usize),
    /// Line `n`'s id is not 1 to 32 letters, digits, `-`, `_` or `.`.
    Id(usize),
    /// Line `n` repeats the id of line `m`.
    SameId(usize, usize),
    /// Line `n` holds the key of line `m`.
    SameKey(usize, usize),
    TooMany,
    /// Only comments and blank lines.
    Empty,
}

impl RingError {
    pub fn text(&self) -> String {
        const SHAPE: &str = "each line of a key ring is `<id> <key in hex>` (`#` starts a comment)";
        match self {
            Self::Key(e) => e.text().to_string(),
            Self::LineKey(n, e) => format!("line {n}: {}", e.text()),
            Self::Shape(n) => format!("line {n}: {SHAPE}"),
            Self::Id(n) => format!(
                "line {n}: a key id is 1 to {MAX_ID_BYTES} letters, digits, '-', '_' or '.'"
            ),
            Self::SameId(n, m) => format!("line {n} repeats the key id of line {m}"),
            Self::SameKey(n, m) => format!("line {n} holds the same key as line {m}"),
            Self::TooMany => format!("a key ring holds at most {MAX_KEYS} keys"),
            Self::Empty => KeyError::Empty.text().to_string(),
        }
    }
}

/// A meaningful line of a ring file: its number (from 1), its text trimmed, and its words.
type Line<'t> = (usize, &'t [u8], Vec<&'t [u8]>);

fn valid_id(id: &[u8]) -> bool {
    (1..=MAX_ID_BYTES).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Ring {
    /// Parses a key file's text. A file whose one meaningful line is a single word is a key
    /// (today's form: hex digits, surrounding white space ignored); otherwise every line that
    /// is not blank or a `#` comment is `<id> <hex key>`, ids and keys each used once.
    pub fn parse(text: &[u8]) -> Result<Ring, RingError> {
        let lines: Vec<Line> = text
            .split(|&b| b == b'\n')
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim_ascii()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with(b"#"))
            .map(|(n, l)| {
                let words = l
                    .split(u8::is_ascii_whitespace)
                    .filter(|w| !w.is_empty())
                    .collect();
                (n, l, words)
            })
            .collect();
        match lines.as_slice() {
            [] => return Err(RingError::Empty),
            [(_, line, words)] if words.len() != 2 => {
                let key = Key::from_file_text(line).map_err(RingError::Key)?;
                return Ok(Ring::of(DEFAULT_ID, key));
            }
            _ if lines.len() > MAX_KEYS => return Err(RingError::TooMany),
            _ => {}
        }
        let mut entries: Vec<(usize, Entry)> = Vec::with_capacity(lines.len());
        for (n, _, words) in &lines {
            let [id, hex] = words.as_slice() else {
                return Err(RingError::Shape(*n));
            };
            if !valid_id(id) {
                return Err(RingError::Id(*n));
            }
            let key = Key::from_file_text(hex).map_err(|e| RingError::LineKey(*n, e))?;
            let id = String::from_utf8_lossy(id).into_owned();
            if let Some((m, _)) = entries.iter().find(|(_, e)| e.id == id) {
                return Err(RingError::SameId(*n, *m));
            }
            if let Some((m, _)) = entries
                .iter()
                .find(|(_, e)| e.key.fingerprint() == key.fingerprint())
            {
                return Err(RingError::SameKey(*n, *m));
            }
            entries.push((*n, Entry { id, key }));
        }
        Ok(Ring {
            entries: entries.into_iter().map(|(_, e)| e).collect(),
        })
    }

    /// A ring of the one key `key`, named `id`.
    pub fn of(id: &str, key: Key) -> Ring {
        Ring {
            entries: vec![Entry {
                id: id.to_string(),
                key,
            }],
        }
    }

    /// The key new sets are created under: the file's first.
    pub fn current(&self) -> &Entry {
        &self.entries[0]
    }

    /// The entry whose key's fingerprint is `fp`, if the ring holds it.
    #[inline]
    pub fn entry_of(&self, fp: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key.fingerprint() == fp)
    }

    /// The key whose fingerprint is `fp`, if the ring holds it.
    #[inline]
    pub fn by_fingerprint(&self, fp: &str) -> Option<&Key> {
        self.entry_of(fp).map(|e| &e.key)
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    fn fp(hex: &str) -> String {
        Key::from_file_text(hex.as_bytes())
            .unwrap()
            .fingerprint()
            .to_string()
    }

    #[test]
    fn a_file_of_one_key_is_a_ring_of_one_named_default() {
        for text in [
            K1.to_string(),
            format!("\n  {K1}  \n"),
            format!("# the key\n{K1}\n"),
        ] {
            let r = Ring::parse(text.as_bytes()).unwrap();
            assert_eq!(r.entries().len(), 1);
            assert_eq!(r.current().id, DEFAULT_ID);
            assert_eq!(r.current().key.fingerprint(), fp(K1));
        }
        // Its errors are the key's own, as before rings.
        assert_eq!(
            Ring::parse(b"abcd").unwrap_err(),
            RingError::Key(KeyError::TooShort)
        );
        assert_eq!(
            Ring::parse(b"not hex at all, surely not").unwrap_err(),
            RingError::Key(KeyError::NotHex)
        );
        assert_eq!(
            Ring::parse(b" \n# nothing\n").unwrap_err(),
            RingError::Empty
        );
    }

    #[test]
    fn a_ring_file_names_its_keys_and_its_first_is_current() {
        let text = format!("# rotated 2026-12\nk2 {K2}\n\nk1\t{K1}\n");
        let r = Ring::parse(text.as_bytes()).unwrap();
        let ids: Vec<&str> = r.entries().iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["k2", "k1"]);
        assert_eq!(r.current().id, "k2");
        assert!(r.by_fingerprint(&fp(K1)).is_some());
        assert!(r.by_fingerprint(&fp(K2)).is_some());
        assert!(r.by_fingerprint("0123456789abcdef").is_none());
        // One line of two words is a ring of one, under its own id.
        let r = Ring::parse(format!("2026-q4 {K1}").as_bytes()).unwrap();
        assert_eq!(r.current().id, "2026-q4");
    }

    #[test]
    fn malformed_rings_say_which_line_and_never_quote_it() {
        let cases = [
            (format!("k1 {K1}\nk2 {K2} extra"), RingError::Shape(2)),
            (format!("k1 {K1}\nk1 {K2}"), RingError::SameId(2, 1)),
            (format!("k1 {K1}\n# c\nk2 {K1}"), RingError::SameKey(3, 1)),
            (format!("k/1 {K1}\nk2 {K2}"), RingError::Id(1)),
            (
                format!("{} {K1}\nk2 {K2}", "x".repeat(MAX_ID_BYTES + 1)),
                RingError::Id(1),
            ),
            (
                format!("k1 {K1}\nk2 abcd"),
                RingError::LineKey(2, KeyError::TooShort),
            ),
            // A key where the id belongs (the id is too long) is not quoted either.
            (format!("k1 {K1}\n{K2} k2"), RingError::Id(2)),
            (
                format!("k1 {K1}\nk2 {}", &K2[..62]),
                RingError::LineKey(2, KeyError::TooShort),
            ),
            (
                format!("k1 {K1}\nk2 {}zz", &K2[..62]),
                RingError::LineKey(2, KeyError::NotHex),
            ),
        ];
        for (text, want) in cases {
            let got = Ring::parse(text.as_bytes()).unwrap_err();
            assert_eq!(got, want, "{text}");
            let shown = got.text();
            assert!(
                !shown.contains(&K1[..16]) && !shown.contains(&K2[..16]),
                "{shown}"
            );
        }
        let many: String = (0..=MAX_KEYS)
            .map(|i| format!("k{i} {:064x}\n", i + 1))
            .collect();
        assert_eq!(
            Ring::parse(many.as_bytes()).unwrap_err(),
            RingError::TooMany
        );
    }
}
