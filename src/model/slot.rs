//! The cluster key slot (CRC16-XMODEM of the key or of its `{hash tag}`, mod 16384), exactly as
//! Valkey and Redis compute it, and one short hash tag per slot. Pure, with no crate imports:
//! the integration tests include this file as it is to compare it with the server and SQL.

use std::sync::OnceLock;

/// Number of hash slots in a Valkey / Redis cluster.
pub const SLOTS: usize = 16384;

/// CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection, no final XOR), one byte at
/// a time: entry `b` is the CRC of the single byte `b`. `member_keyslot()` in SQL carries it too.
pub const CRC16_TABLE: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        t[i] = crc;
        i += 1;
    }
    t
};

/// CRC16-XMODEM of `bytes`: the checksum the cluster's key slot is taken from.
pub fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ b) as usize]
    })
}

/// The part of a key that is hashed: the bytes between the first `{` and the first `}` after
/// it when there is at least one byte between them, otherwise the whole key (no `{`, no `}`
/// after it, or an empty `{}`).
pub fn hashed_part(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(close) = rest.iter().position(|&b| b == b'}') {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

/// The hash slot of `key`, `0..16384`: what `CLUSTER KEYSLOT` answers for these bytes, and
/// what `member_keyslot()` computes in PostgreSQL for their text.
pub fn keyslot(key: &[u8]) -> u16 {
    crc16(hashed_part(key)) & (SLOTS as u16 - 1)
}

/// Characters a tag is made of: letters and digits, so a tag needs no quoting anywhere and can
/// never contain `{`, `}` or `:`.
const ALPHABET: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Longest tag the search may need (three characters cover every slot; four is the margin).
const MAX_TAG: usize = 4;

/// One shortest tag per slot, found by trying every string over [`ALPHABET`] by length, then in
/// alphabet order; the first string found for a slot is its tag.
struct Tags {
    /// Slot `s`'s tag is `bytes[s * MAX_TAG..][..len[s]]`.
    bytes: Vec<u8>,
    len: Vec<u8>,
}

fn build_tags() -> Tags {
    let mut bytes = vec![0u8; SLOTS * MAX_TAG];
    let mut len = vec![0u8; SLOTS];
    let mut missing = SLOTS;
    let mut cand = [0usize; MAX_TAG];
    'lengths: for n in 1..=MAX_TAG {
        cand[..n].fill(0);
        let mut word = [0u8; MAX_TAG];
        loop {
            for i in 0..n {
                word[i] = ALPHABET[cand[i]];
            }
            let slot = keyslot(&word[..n]) as usize;
            if len[slot] == 0 {
                bytes[slot * MAX_TAG..][..n].copy_from_slice(&word[..n]);
                len[slot] = n as u8;
                missing -= 1;
                if missing == 0 {
                    break 'lengths;
                }
            }
            // Next string of length n (odometer, last character fastest).
            let mut i = n;
            loop {
                if i == 0 {
                    continue 'lengths;
                }
                i -= 1;
                cand[i] += 1;
                if cand[i] < ALPHABET.len() {
                    break;
                }
                cand[i] = 0;
            }
        }
    }
    assert_eq!(
        missing, 0,
        "no tag of up to {MAX_TAG} characters for some slot"
    );
    Tags { bytes, len }
}

fn tags() -> &'static Tags {
    static TAGS: OnceLock<Tags> = OnceLock::new();
    TAGS.get_or_init(build_tags)
}

/// A short ASCII tag (letters and digits, one to three characters) whose slot is `slot`:
/// `keyslot(tag) == slot`, so a key containing `{tag}` as its first braces lives in `slot`.
/// The table of all 16 384 is built on first use (0.35 ms optimized) and never changes.
/// Panics if `slot` is not below [`SLOTS`].
pub fn tag_for_slot(slot: u16) -> &'static str {
    let t = tags();
    let s = slot as usize;
    let b = &t.bytes[s * MAX_TAG..][..t.len[s] as usize];
    std::str::from_utf8(b).expect("tags are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers of `CLUSTER KEYSLOT` on valkey-server 8.0.1 (cluster mode).
    const KNOWN: &[(&str, u16)] = &[
        ("foo", 12182),
        ("bar", 5061),
        ("{user1000}.following", 3443),
        ("{user1000}.followers", 3443),
        ("{}", 15257),
        ("a{}b", 13694),
        ("}{", 12793),
        ("{{a}}", 10276),
        ("a{b", 13340),
    ];

    #[test]
    fn slots_match_the_server() {
        for &(key, slot) in KNOWN {
            assert_eq!(keyslot(key.as_bytes()), slot, "{key}");
        }
    }

    #[test]
    fn crc16_is_xmodem() {
        // The standard check value of CRC-16/XMODEM.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn the_hash_tag_rule() {
        assert_eq!(hashed_part(b"{user1000}.following"), b"user1000");
        assert_eq!(hashed_part(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hashed_part(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hashed_part(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hashed_part(b"}{"), b"}{");
        assert_eq!(hashed_part(b"a{b"), b"a{b");
        assert_eq!(hashed_part(b""), b"");
    }

    #[test]
    fn every_slot_has_a_short_tag_that_maps_to_it() {
        let mut seen = std::collections::HashSet::new();
        for slot in 0..SLOTS as u16 {
            let tag = tag_for_slot(slot);
            assert!((1..=3).contains(&tag.len()), "slot {slot}: {tag:?}");
            assert!(tag.bytes().all(|b| b.is_ascii_alphanumeric()), "{tag:?}");
            assert_eq!(keyslot(tag.as_bytes()), slot, "tag {tag:?}");
            // Inside braces, as the cache keys use it.
            assert_eq!(
                keyslot(format!("member:{{{tag}}}:s:hit:x").as_bytes()),
                slot
            );
            assert!(seen.insert(tag), "tag {tag:?} given twice");
        }
    }

    #[test]
    fn every_slot_gets_a_tag() {
        // Built once per process (measured 0.35 ms optimized, 4 ms in a debug build: how fast
        // is not asserted here, tests on a loaded machine time nothing).
        let tags = build_tags();
        assert!(tags.len.iter().all(|&n| n > 0));
    }
}
