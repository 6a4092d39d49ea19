//! Scans of an item's ASCII, eight bytes at a time, for canonicalization: how far the ASCII
//! goes (`canon_username.rs`' runs) and whether it holds an uppercase letter (both paths).

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);

/// The length of `b`'s ASCII prefix: the index of its first byte ≥ 0x80, or `b.len()`.
#[inline]
pub fn ascii_len(b: &[u8]) -> usize {
    let mut words = b.chunks_exact(8);
    let mut n = 0;
    for w in words.by_ref() {
        // Little-endian: the first byte is the lowest, so the lowest high bit is the first.
        let high = u64::from_le_bytes(w.try_into().unwrap()) & HIGH;
        if high != 0 {
            return n + (high.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    let rest = words.remainder();
    n + rest
        .iter()
        .position(|c| !c.is_ascii())
        .unwrap_or(rest.len())
}

/// Whether the ASCII text `b` holds a letter A-Z. `b` must be ASCII (every byte < 0x80):
/// the word-at-a-time test relies on it.
#[inline]
pub fn has_upper(b: &[u8]) -> bool {
    debug_assert!(b.is_ascii());
    if b.len() < 8 {
        return b.iter().any(u8::is_ascii_uppercase);
    }
    let mut words = b.chunks_exact(8);
    if words.by_ref().any(word_has_upper) {
        return true;
    }
    // The last eight bytes, overlapping the words already read: no byte-by-byte tail.
    word_has_upper(&b[b.len() - 8..])
}

/// Whether the eight ASCII bytes `w` hold a letter A-Z.
#[inline]
fn word_has_upper(w: &[u8]) -> bool {
    let w = u64::from_ne_bytes(w.try_into().unwrap());
    // A byte below 0x80 plus 0x80 - 'A' has its high bit set exactly when it is ≥ 'A', plus
    // 0x80 - 'Z' - 1 exactly when it is > 'Z'; neither sum passes 0xFF, so no carry reaches
    // the next byte.
    let at_least_a = w + ONES * u64::from(0x80 - b'A');
    let past_z = w + ONES * u64::from(0x80 - b'Z' - 1);
    at_least_a & !past_z & HIGH != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both scans against their byte-by-byte definitions: every length to 40 with every byte
    /// value at every place in a text of each kind (for `has_upper`, every ASCII value).
    #[test]
    fn the_scans_equal_their_definitions() {
        for len in 0..40usize {
            for fill in [b'a', b'Z', b'0', b'@', b'['] {
                for at in 0..len.max(1) {
                    for v in 0..=255u8 {
                        let mut b = vec![fill; len];
                        if len > 0 {
                            b[at] = v;
                        }
                        let prefix = b.iter().position(|c| !c.is_ascii()).unwrap_or(len);
                        assert_eq!(ascii_len(&b), prefix, "{b:?}");
                        if b.is_ascii() {
                            let upper = b.iter().any(u8::is_ascii_uppercase);
                            assert_eq!(has_upper(&b), upper, "{b:?}");
                        }
                    }
                }
            }
        }
    }
}
