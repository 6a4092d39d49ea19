//! Canonicalization (`canon::canonicalize` under none / lower / username, then the HMAC
//! tokenization of `token.rs`, with the key file parser). What a write stores must come back
//! unchanged when a rebuild or the sync loop canonicalizes the stored row again, or that
//! member's filter bits are lost (a false "absent").
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use member::model::canon::{canonicalize, hash_parts, Normalize};
use member::model::token::Key;

#[derive(Arbitrary, Debug)]
struct Input {
    norm: u8,
    item: Vec<u8>,
    scope: Vec<u8>,
    key_file: Option<Vec<u8>>,
}

const KEY: &[u8] = b"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fuzz_target!(|input: Input| {
    let norm = [Normalize::None, Normalize::Lower, Normalize::Username][input.norm as usize % 3];
    let Ok(c) = canonicalize(norm, &input.item, &input.scope) else {
        return;
    };
    assert!(!c.entity.is_empty() && !c.entity.contains('\0'));
    assert_eq!(c.hash, hash_parts(&c.entity, c.scope));
    let mut k = c.entity.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(c.scope.as_bytes());
    assert_eq!(c.key_bytes(), k);
    // The stored form canonicalizes to itself (a rebuild's and the sync loop's reading).
    assert_eq!(
        norm.apply(&c.entity),
        c.entity,
        "normalization is idempotent"
    );
    let again = canonicalize(norm, c.entity.as_bytes(), c.scope.as_bytes())
        .expect("a stored form is accepted again");
    assert_eq!(again, c, "canonicalization is idempotent");
    // Tokenized: the token is what is stored, and is canonical too.
    let key = match input.key_file.as_deref().map(Key::from_file_text) {
        Some(Ok(k)) => k,
        Some(Err(e)) => {
            let _ = e.text();
            Key::from_file_text(KEY).unwrap()
        }
        None => Key::from_file_text(KEY).unwrap(),
    };
    let t = key.tokenize(&c);
    assert_eq!(t.entity.len(), 64);
    assert!(t
        .entity
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    assert_eq!(t.scope, "");
    assert_eq!(t.hash, hash_parts(&t.entity, ""));
    let stored = canonicalize(norm, t.entity.as_bytes(), b"").expect("a token is an item");
    assert_eq!(stored.entity, t.entity);
    assert_eq!(stored.hash, t.hash);
});
