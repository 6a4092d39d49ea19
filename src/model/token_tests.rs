//! Tests of `token.rs`: the HMAC against the `hmac` crate and RFC 4231, pinned tokens and
//! fingerprints, batches of tokens, key files and stored modes.

use super::*;
use crate::model::canon::{canonicalize, Normalize};

const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn key() -> Key {
    Key::from_file_text(KEY_HEX.as_bytes()).unwrap()
}

#[test]
fn matches_rfc_4231_test_case_2() {
    // RFC 4231 §4.3: key "Jefe", data "what do ya want for nothing?".
    let k = Key::from_bytes(b"Jefe");
    assert_eq!(
        to_hex(&k.mac(&[b"what do ya want for", b" nothing?"])),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

/// The block-level HMAC gives the `hmac` crate's bytes for every key length the file
/// takes (and shorter), every message length across the one-, two- and many-block
/// paddings and the stack buffer's edge, in one part or split.
#[test]
fn equals_the_hmac_crate() {
    use hmac::{Hmac, KeyInit, Mac};
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    };
    for key_len in [1, 4, 31, 32, 33, 48, 63, 64] {
        let key: Vec<u8> = (0..key_len).map(|_| next()).collect();
        let k = Key::from_bytes(&key);
        for len in 0..300 {
            let msg: Vec<u8> = (0..len).map(|_| next()).collect();
            let mut m = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&key).unwrap();
            m.update(&msg);
            let want: [u8; 32] = m.finalize().into_bytes().into();
            let cut = len / 3;
            assert_eq!(k.mac(&[&msg]), want, "key {key_len} bytes, message {len}");
            assert_eq!(k.mac(&[&msg[..cut], &msg[cut..]]), want, "split at {cut}");
        }
    }
}

#[test]
fn fingerprint_is_pinned() {
    // Pinned: the catalog stores it with every tokenized set.
    // Checked with: printf '<FINGERPRINT_LABEL>' | openssl dgst -sha256 -mac HMAC -macopt hexkey:<KEY_HEX>
    assert_eq!(key().fingerprint(), "7b97c0b470e11049");
}

#[test]
fn token_is_pinned() {
    // Pinned: outside writers compute this with pgcrypto (README); it must never change.
    // Checked with: printf 'alice\0' | openssl dgst -sha256 -mac HMAC -macopt hexkey:<KEY_HEX>
    assert_eq!(
        key().token("alice", ""),
        "ddba9b6c0e0c40efb00e6e276d720c65321265ca0b8ba161fd2b86047a0a1e3c"
    );
}

#[test]
fn token_into_writes_the_token() {
    let mut out = [0u8; 64];
    key().token_into("alice", "m1", &mut out);
    assert_eq!(&out[..], key().token("alice", "m1").as_bytes());
}

/// Many tokens at once, and each alone, are the general path's tokens: items of every length around
/// the one-block edge, in runs that pair them, leave one alone and break pairs with a
/// long item.
#[test]
fn tokens_take_the_general_paths_bytes() {
    let k = key();
    let owned: Vec<(String, String)> = (0..130)
        .map(|i| ("é".repeat(i % 23) + &"x".repeat(i % 61), "s".repeat(i % 3)))
        .collect();
    for n in [0, 1, 2, 3, 7, 64, 130] {
        let items: Vec<(&str, &str)> = owned[..n]
            .iter()
            .map(|(e, s)| (e.as_str(), s.as_str()))
            .collect();
        let mut out = vec![0u8; 64 * n];
        k.tokens_into(&items, &mut out);
        for (i, (e, s)) in items.iter().enumerate() {
            // `mac` is the general path, checked against the `hmac` crate above.
            let want = to_hex(&k.mac(&[e.as_bytes(), &[0], s.as_bytes()]));
            assert_eq!(&out[64 * i..64 * i + 64], want.as_bytes(), "{n}: {i}");
            assert_eq!(k.token(e, s), want, "{n}: {i}");
        }
    }
}

#[test]
fn scope_and_separator_change_the_token() {
    let k = key();
    assert_ne!(k.token("card", "m1"), k.token("card", "m2"));
    assert_ne!(k.token("card", "m1"), k.token("card", ""));
    assert_ne!(k.token("ab", ""), k.token("a", "b"));
    assert_eq!(k.token("x", "").len(), 64);
}

#[test]
fn tokenize_replaces_entity_and_scope() {
    let k = key();
    let c = canonicalize(Normalize::Lower, b" Alice ", b"m1").unwrap();
    let t = k.tokenize(&c.entity, c.scope);
    assert_eq!(t.entity, k.token("alice", "m1"));
    assert_eq!(t.scope, "");
    assert_eq!(t.hash, hash_parts(&t.entity, ""));
    // A stored token read back (rebuild, sync) canonicalizes to itself under any policy.
    for n in [Normalize::None, Normalize::Lower, Normalize::Username] {
        let again = canonicalize(n, t.entity.as_bytes(), b"").unwrap();
        assert_eq!(again, t, "{n:?}");
    }
}

#[test]
fn fingerprint_tells_keys_apart_and_hides_them() {
    let a = key();
    let b = Key::from_file_text(format!("{}0f", &KEY_HEX[..62]).as_bytes()).unwrap();
    assert_ne!(a.fingerprint(), b.fingerprint());
    assert!(valid_fingerprint(a.fingerprint()));
    assert!(!format!("{a:?}").contains("0102"));
}

#[test]
fn key_file_text_is_checked() {
    assert_eq!(Key::from_file_text(b"").unwrap_err(), KeyError::Empty);
    assert_eq!(Key::from_file_text(b" \n").unwrap_err(), KeyError::Empty);
    assert_eq!(Key::from_file_text(b"xyz").unwrap_err(), KeyError::NotHex);
    assert_eq!(Key::from_file_text(b"abc").unwrap_err(), KeyError::NotHex);
    assert_eq!(
        Key::from_file_text(&[b'a'; 62]).unwrap_err(),
        KeyError::TooShort
    );
    assert_eq!(
        Key::from_file_text(&[b'a'; 130]).unwrap_err(),
        KeyError::TooLong
    );
    // Upper case and a trailing newline are the same key.
    let upper = format!("{}\n", KEY_HEX.to_uppercase());
    let k = Key::from_file_text(upper.as_bytes()).unwrap();
    assert_eq!(k.fingerprint(), key().fingerprint());
}

#[test]
fn stored_modes_round_trip() {
    let fp = key().fingerprint().to_string();
    let t = Tokenize::from_stored("hmac-sha256", Some(&fp)).unwrap();
    assert_eq!(t.fingerprint(), Some(fp.as_str()));
    assert_eq!(Tokenize::from_stored("none", None), Some(Tokenize::None));
    assert_eq!(Tokenize::from_stored("hmac-sha256", None), None);
    assert_eq!(Tokenize::from_stored("hmac-sha256", Some("xyz")), None);
    assert_eq!(Tokenize::from_stored("md5", None), None);
}

#[test]
fn stored_chains_are_checked() {
    let (a, b) = ("0123456789abcdef", "fedcba9876543210");
    let t = Tokenize::from_stored("hmac-sha256", Some(&format!("{a}>{b}"))).unwrap();
    assert_eq!(t.chain(), [a, b]);
    assert_eq!(Tokenize::None.chain(), Vec::<&str>::new());
    // A key twice, an empty link, a bad fingerprint, another separator: not a chain.
    for bad in [
        format!("{a}>{a}"),
        format!("{a}>"),
        format!(">{a}"),
        format!("{a}>{}", &b[1..]),
        format!("{a},{b}"),
        format!("{a}>{}", b.to_uppercase()),
    ] {
        assert_eq!(
            Tokenize::from_stored("hmac-sha256", Some(&bad)),
            None,
            "{bad}"
        );
    }
    let longest: Vec<String> = (0..MAX_CHAIN_KEYS).map(|i| format!("{i:016x}")).collect();
    assert!(valid_chain(&longest.join(">")));
    let over: Vec<String> = (0..=MAX_CHAIN_KEYS).map(|i| format!("{i:016x}")).collect();
    assert!(!valid_chain(&over.join(">")));
}
