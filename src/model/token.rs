//! HMAC tokenization, pure: the key (parsed from its file's text, never printed), its
//! fingerprint, and the token that stands in for a canonical item and scope in every tier.

use std::borrow::Cow;
use std::fmt;

use sha2::block_api::compress256;

use crate::model::canon::{hash_parts, Canon};
use crate::model::sha256x2::compress_pair;

/// Fewest key bytes accepted (64 hex digits): the strength of HMAC-SHA-256 itself.
pub const MIN_KEY_BYTES: usize = 32;
/// Most key bytes accepted (128 hex digits): SHA-256's block size, above which HMAC would
/// hash the key first.
pub const MAX_KEY_BYTES: usize = 64;
/// The label whose HMAC under a key is that key's fingerprint. It holds no NUL, and every
/// token is the HMAC of a message that does, so no item can have the fingerprint as token.
pub const FINGERPRINT_LABEL: &[u8] = b"libmember token key fingerprint v1";
/// Hex digits of the fingerprint kept (64 bits): enough to tell keys apart, nothing to guess from.
const FINGERPRINT_HEX: usize = 16;

/// How a set turns canonical items into what it stores. Fixed when the set is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tokenize {
    /// The canonical item itself.
    None,
    /// `hex(HMAC-SHA-256(key, entity NUL scope))` under the first key of its chain, wrapped
    /// under each later one (`token_chain.rs`). `fingerprint` is the chain as the catalog's
    /// `token_key_fp` keeps it: the keys' fingerprints, first to last, joined by `>` (a single
    /// fingerprint for a set whose key was never rotated).
    HmacSha256 { fingerprint: String },
}

impl Tokenize {
    /// The mode's name as MEMBER.CREATE and the catalog spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::HmacSha256 { .. } => "hmac-sha256",
        }
    }

    /// From the catalog's two columns (`tokenize`, `token_key_fp`); `None` for anything else.
    pub fn from_stored(mode: &str, fingerprint: Option<&str>) -> Option<Self> {
        match (mode, fingerprint) {
            ("none", _) => Some(Self::None),
            ("hmac-sha256", Some(fp)) if valid_chain(fp) => Some(Self::HmacSha256 {
                fingerprint: fp.to_string(),
            }),
            _ => None,
        }
    }

    pub fn is_on(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// The stored chain of fingerprints (`fp₁>fp₂…`), if tokenized.
    pub fn fingerprint(&self) -> Option<&str> {
        match self {
            Self::None => None,
            Self::HmacSha256 { fingerprint } => Some(fingerprint),
        }
    }

    /// The fingerprints of the chain's keys, first to last: empty when not tokenized, one for
    /// a set never rotated.
    pub fn chain(&self) -> Vec<&str> {
        self.fingerprint()
            .map_or_else(Vec::new, |c| c.split(CHAIN_SEPARATOR).collect())
    }
}

/// Between the fingerprints of a chain in `token_key_fp`: no fingerprint holds it.
pub const CHAIN_SEPARATOR: char = '>';
/// Most keys in a set's chain: as many as a ring holds, each key once.
pub const MAX_CHAIN_KEYS: usize = 64;

/// True for a fingerprint as `Key::fingerprint` writes it.
pub fn valid_fingerprint(fp: &str) -> bool {
    fp.len() == FINGERPRINT_HEX && fp.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// True for a chain as `token_key_fp` keeps it: 1 to [`MAX_CHAIN_KEYS`] valid fingerprints
/// joined by [`CHAIN_SEPARATOR`], none twice (a key wrapped over itself protects nothing).
pub fn valid_chain(chain: &str) -> bool {
    let fps: Vec<&str> = chain.split(CHAIN_SEPARATOR).collect();
    fps.len() <= MAX_CHAIN_KEYS
        && fps.iter().all(|fp| valid_fingerprint(fp))
        && fps.iter().enumerate().all(|(i, fp)| !fps[..i].contains(fp))
}

/// Why a key file's text is not a key. The text is the reply after `member.token-key-file: `.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyError {
    Empty,
    NotHex,
    TooShort,
    TooLong,
}

impl KeyError {
    pub fn text(&self) -> &'static str {
        match self {
            Self::Empty => "the file is empty",
            Self::NotHex => {
                "the file must hold the key as hex digits only (e.g. `openssl rand -hex 32`)"
            }
            Self::TooShort => "the key is shorter than 32 bytes (64 hex digits)",
            Self::TooLong => "the key is longer than 64 bytes (128 hex digits)",
        }
    }
}

/// A tokenization key, ready to use: the SHA-256 states after HMAC's first block (the key
/// XOR ipad, and XOR opad), computed once when the key is loaded, and the fingerprint. A
/// token then costs the message's compressions and the outer one, nothing else. Neither
/// `Debug` nor anything else shows the key.
#[derive(Clone)]
pub struct Key {
    inner: [u32; 8],
    outer: [u32; 8],
    fingerprint: String,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(fingerprint {})", self.fingerprint)
    }
}

impl Key {
    /// Parses a key file's text: hex digits (either case), surrounding white space ignored,
    /// 32 to 64 bytes once decoded.
    pub fn from_file_text(text: &[u8]) -> Result<Key, KeyError> {
        let hex = text.trim_ascii();
        if hex.is_empty() {
            return Err(KeyError::Empty);
        }
        if !hex.len().is_multiple_of(2) || !hex.iter().all(u8::is_ascii_hexdigit) {
            return Err(KeyError::NotHex);
        }
        let bytes: Vec<u8> = hex
            .chunks_exact(2)
            .map(|p| (digit(p[0]) << 4) | digit(p[1]))
            .collect();
        if bytes.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort);
        }
        if bytes.len() > MAX_KEY_BYTES {
            return Err(KeyError::TooLong);
        }
        Ok(Key::from_bytes(&bytes))
    }

    fn from_bytes(key: &[u8]) -> Key {
        // RFC 2104 with a key no longer than the block (checked by the file's parser): the
        // key zero-padded to 64 bytes, XORed with 0x36 for the inner hash, 0x5c for the outer.
        assert!(key.len() <= 64, "the key is at most one block");
        let mut block = [0u8; 64];
        block[..key.len()].copy_from_slice(key);
        let pad = |x: u8| {
            let mut state = SHA256_IV;
            compress256(&mut state, &[block.map(|b| b ^ x)]);
            state
        };
        let (inner, outer) = (pad(0x36), pad(0x5c));
        block.fill(0);
        let mut k = Key {
            inner,
            outer,
            fingerprint: String::new(),
        };
        let mut fingerprint = to_hex(&k.mac(&[FINGERPRINT_LABEL]));
        fingerprint.truncate(FINGERPRINT_HEX);
        k.fingerprint = fingerprint;
        k
    }

    /// HMAC-SHA-256 of the concatenated `parts` under this key: the message padded as
    /// SHA-256 pads it (after the one block of the inner pad), on the stack up to 119 bytes
    /// (two blocks: every token of a usual item), then the outer hash of the inner digest.
    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let padded = (len + 9).div_ceil(64) * 64;
        let mut stack = [0u8; 128];
        let mut heap = Vec::new();
        let buf: &mut [u8] = if padded <= stack.len() {
            &mut stack[..padded]
        } else {
            heap.resize(padded, 0);
            &mut heap
        };
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        buf[len] = 0x80;
        // Bits hashed by the inner hash: the pad's block, then the message.
        buf[padded - 8..].copy_from_slice(&((64 + len as u64) * 8).to_be_bytes());
        let mut state = self.inner;
        for block in buf.chunks_exact(64) {
            compress256(&mut state, &[block.try_into().unwrap()]);
        }
        let mut outer = self.outer;
        compress256(&mut outer, &[outer_block(&state)]);
        be_bytes(&outer)
    }

    /// The HMACs of two messages of one block each (`entity NUL scope` of at most
    /// [`ONE_BLOCK`] bytes: every usual item), their compressions made side by side
    /// ([`compress_pair`]): the inner hashes together, then the outer ones.
    fn mac_pair(&self, a: (&str, &str), b: (&str, &str)) -> [[u8; 32]; 2] {
        let (mut ia, mut ib) = (self.inner, self.inner);
        compress_pair(&mut ia, &one_block(a), &mut ib, &one_block(b));
        let (mut oa, mut ob) = (self.outer, self.outer);
        compress_pair(&mut oa, &outer_block(&ia), &mut ob, &outer_block(&ib));
        [be_bytes(&oa), be_bytes(&ob)]
    }

    /// [`Key::token_into`] for many items, `out` holding 64 bytes for each: two items at a
    /// time where both fit one block ([`Key::mac_pair`]), one at a time otherwise. The same
    /// tokens as one call each.
    pub fn tokens_into(&self, items: &[(&str, &str)], out: &mut [u8]) {
        assert_eq!(out.len(), 64 * items.len(), "a token's room for each item");
        let fits = |(e, s): (&str, &str)| e.len() + 1 + s.len() <= ONE_BLOCK;
        let mut outs = out
            .chunks_exact_mut(64)
            .map(|o| -> &mut [u8; 64] { o.try_into().expect("64 bytes") });
        let mut pending: Option<((&str, &str), &mut [u8; 64])> = None;
        for &item in items {
            let o = outs.next().expect("a room for each item");
            if !fits(item) {
                self.token_into(item.0, item.1, o);
                continue;
            }
            match pending.take() {
                None => pending = Some((item, o)),
                Some((first, first_out)) => {
                    let [x, y] = self.mac_pair(first, item);
                    hex_into(&x, first_out);
                    hex_into(&y, o);
                }
            }
        }
        if let Some((last, o)) = pending {
            self.token_into(last.0, last.1, o);
        }
    }

    /// `hex(HMAC-SHA-256(key, FINGERPRINT_LABEL))`, first 16 digits: stored in the catalog
    /// with every tokenized set, so a changed key is told from "absent".
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The token of `entity NUL scope` (the exact-match key's own encoding): 64 lowercase hex
    /// digits of its HMAC-SHA-256.
    pub fn token(&self, entity: &str, scope: &str) -> String {
        let mut out = [0u8; 64];
        self.token_into(entity, scope, &mut out);
        String::from_utf8(out.to_vec()).expect("hex digits are ASCII")
    }

    /// [`Key::token`] written into `out`, nothing allocated (a batch's tokens share one
    /// buffer).
    pub fn token_into(&self, entity: &str, scope: &str, out: &mut [u8; 64]) {
        if entity.len() + 1 + scope.len() <= ONE_BLOCK {
            // One block: built in place, without `mac`'s general padding.
            let mut inner = self.inner;
            compress256(&mut inner, &[one_block((entity, scope))]);
            let mut outer = self.outer;
            compress256(&mut outer, &[outer_block(&inner)]);
            return hex_into(&be_bytes(&outer), out);
        }
        hex_into(&self.mac(&[entity.as_bytes(), &[0], scope.as_bytes()]), out);
    }

    /// `hex(HMAC-SHA-256(key, previous))`: one link of a rotated set's chain over the text of
    /// the token before it (`token_chain.rs`).
    pub fn link_hex(&self, previous: &str) -> String {
        to_hex(&self.mac(&[previous.as_bytes()]))
    }

    /// [`Key::link_hex`] written into `out`, nothing allocated.
    pub fn link_into(&self, previous: &str, out: &mut [u8; 64]) {
        hex_into(&self.mac(&[previous.as_bytes()]), out);
    }

    /// The canonical `entity` and `scope` as the token in place of the entity, the scope
    /// folded into it (stored `''`), and the hash of the token: what every tier after
    /// canonicalization sees.
    pub fn tokenize(&self, entity: &str, scope: &str) -> Canon<'static> {
        let token = self.token(entity, scope);
        let hash = hash_parts(&token, "");
        Canon {
            entity: Cow::Owned(token),
            scope: "",
            hash,
        }
    }
}

/// Most bytes of `entity NUL scope` that SHA-256 pads into one block (64 less its 0x80 and
/// the 8-byte length).
const ONE_BLOCK: usize = 55;

/// The inner hash's one block of `entity NUL scope`, padded: its length counts the pad's
/// block before it.
fn one_block((entity, scope): (&str, &str)) -> [u8; 64] {
    let len = entity.len() + 1 + scope.len();
    debug_assert!(len <= ONE_BLOCK);
    let mut block = [0u8; 64];
    block[..entity.len()].copy_from_slice(entity.as_bytes());
    block[entity.len() + 1..len].copy_from_slice(scope.as_bytes());
    block[len] = 0x80;
    block[56..].copy_from_slice(&((64 + len as u64) * 8).to_be_bytes());
    block
}

/// The outer hash's block: the inner digest, padded, after the outer pad's block.
fn outer_block(inner: &[u32; 8]) -> [u8; 64] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(&be_bytes(inner));
    block[32] = 0x80;
    block[56..].copy_from_slice(&((64 + 32) * 8u64).to_be_bytes());
    block
}

fn digit(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const SHA256_IV: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// A SHA-256 state as its digest: the words big-endian.
fn be_bytes(state: &[u32; 8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// Lowercase hex of a digest, made in one buffer and allocated once.
fn to_hex(bytes: &[u8; 32]) -> String {
    let mut s = [0u8; 64];
    hex_into(bytes, &mut s);
    String::from_utf8(s.to_vec()).expect("hex digits are ASCII")
}

fn hex_into(bytes: &[u8; 32], out: &mut [u8; 64]) {
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&HEX_PAIRS[*b as usize]);
    }
}

/// The two lowercase hex digits of every byte: a token's 32 bytes are 32 lookups.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [HEX[b >> 4], HEX[b & 15]];
        b += 1;
    }
    t
};

#[cfg(test)]
#[path = "token_tests.rs"]
mod tests;
