//! The form of a rotated set's tokens, pure (docs/security.md, "Rotating a tokenized set's
//! key"): a set created under k₁ and rotated to k₂ … kₙ stores, for an item, the token of
//! chain length n: `<n>:<hex(HMAC(kₙ, token of length n − 1))>`, each link over the text of
//! the token before it, whose first link is today's form (64 hex digits, length 1). A stored
//! row therefore tells its chain's length by itself, and the next link is made from the
//! stored text alone, without the item: by the module in batches, or in SQL by anyone who
//! holds the key (`'2:' || encode(hmac(convert_to(t, 'UTF8'), decode(k, 'hex'), 'sha256'),
//! 'hex')`, pgcrypto).

use crate::model::token::Key;

/// Longest chain a token may name: a set rotated every day for a year stays far below it.
pub const MAX_CHAIN: u32 = 9999;
/// Hex digits of a link's HMAC.
const HEX: usize = 64;

/// The length of the chain a stored token shows: 1 for today's 64 lowercase hex digits, `n`
/// for `<n>:<64 lowercase hex digits>` with 2 ≤ n ≤ [`MAX_CHAIN`] (no leading zero); `None`
/// for any other text (not a token of a tokenized set).
pub fn chain_length(token: &str) -> Option<u32> {
    let hex = |h: &str| h.len() == HEX && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    match token.split_once(':') {
        None => hex(token).then_some(1),
        Some((n, h)) => {
            let digits =
                !n.is_empty() && !n.starts_with('0') && n.bytes().all(|b| b.is_ascii_digit());
            let n: u32 = n.parse().ok().filter(|_| digits)?;
            ((2..=MAX_CHAIN).contains(&n) && hex(h)).then_some(n)
        }
    }
}

/// The next link of `previous` (a token of some chain length `n`) under `key`: the token of
/// length `n + 1`. `None` when `previous` is not a token's form, or its chain is at its longest.
pub fn wrap(key: &Key, previous: &str) -> Option<String> {
    let n = chain_length(previous)?;
    (n < MAX_CHAIN).then(|| format!("{}:{}", n + 1, key.link_hex(previous)))
}

/// The token of canonical `entity` and `scope` under the chain `keys`, first to last: the
/// form a lookup computes for a set rotated `keys.len() − 1` times. Panics on an empty chain
/// or one longer than [`MAX_CHAIN`].
pub fn chain_token(keys: &[&Key], entity: &str, scope: &str) -> String {
    let (first, rest) = keys.split_first().expect("a chain has a first key");
    wrap_all(rest, first.token(entity, scope))
}

/// `token` (of chain length 1) wrapped under each key of `rest` in turn, each link written
/// over the one before in one buffer: the same text as [`wrap`] link by link.
pub fn wrap_all(rest: &[&Key], mut token: String) -> String {
    use std::fmt::Write;
    assert!(
        rest.len() < MAX_CHAIN as usize,
        "a chain of at most {MAX_CHAIN} keys"
    );
    let mut digits = [0u8; HEX];
    for (i, k) in rest.iter().enumerate() {
        k.link_into(&token, &mut digits);
        token.clear();
        let _ = write!(token, "{}:", i + 2);
        token.push_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"));
    }
    token
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(hex: &str) -> Key {
        Key::from_file_text(hex.as_bytes()).unwrap()
    }

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    /// Known answers from another implementation (Python's `hmac` module), over the item
    /// `4111111111111111` with scope `merchant-7`.
    #[test]
    fn chains_match_an_independent_hmac() {
        let k3 = key(&"0f".repeat(48));
        let (k1, k2) = (key(K1), key(K2));
        let t1 = "52a55be7ff7ec35ff3475e1d00a03ab40332ca5fc890ee8478d78f357b35e595";
        let t2 = "2:1db6914acb82d7bf15cdf7ba78432d2bf07dec222203256874ea628e7f038a65";
        let t3 = "3:ea7ba49cbedd32fb44f0c7f03b896d95a18779212c4f46caaef85734b31110da";
        let (item, scope) = ("4111111111111111", "merchant-7");
        assert_eq!(chain_token(&[&k1], item, scope), t1);
        assert_eq!(chain_token(&[&k1, &k2], item, scope), t2);
        assert_eq!(chain_token(&[&k1, &k2, &k3], item, scope), t3);
        // Moving a stored row forward needs its text and the new key, never the item.
        assert_eq!(wrap(&k2, t1).as_deref(), Some(t2));
        assert_eq!(wrap(&k3, t2).as_deref(), Some(t3));
    }

    #[test]
    fn a_token_tells_its_chain_length_and_nothing_else_passes() {
        let t1 = "52a55be7ff7ec35ff3475e1d00a03ab40332ca5fc890ee8478d78f357b35e595";
        assert_eq!(chain_length(t1), Some(1));
        assert_eq!(chain_length(&format!("2:{t1}")), Some(2));
        assert_eq!(chain_length(&format!("9999:{t1}")), Some(MAX_CHAIN));
        for bad in [
            String::new(),
            t1[..63].to_string(),
            t1.to_uppercase(),
            format!("{t1}0"),
            format!("1:{t1}"),
            format!("0:{t1}"),
            format!("02:{t1}"),
            format!("10000:{t1}"),
            format!(":{t1}"),
            format!("+2:{t1}"),
            format!("2:{}", &t1[..63]),
            format!("2:2:{t1}"),
            "alice".to_string(),
        ] {
            assert_eq!(chain_length(&bad), None, "{bad}");
            assert_eq!(wrap(&key(K2), &bad), None, "{bad}");
        }
        assert_eq!(wrap(&key(K2), &format!("9999:{t1}")), None);
    }

    #[test]
    fn every_link_changes_the_token_and_its_order_matters() {
        let (k1, k2) = (key(K1), key(K2));
        let a = chain_token(&[&k1, &k2], "alice", "");
        let b = chain_token(&[&k2, &k1], "alice", "");
        assert_ne!(a, b);
        assert_ne!(a, chain_token(&[&k1, &k2], "bob", ""));
        assert_eq!(chain_length(&a), Some(2));
    }

    /// Rebuilds and sync passes canonicalize every stored row under the set's normalization:
    /// a chained token must come out of each as it went in, or its row would be skipped.
    #[test]
    fn every_normalization_keeps_a_chained_token() {
        use crate::model::canon::{canonicalize, Normalize};
        let t = wrap(&key(K2), &key(K1).token("4111111111111111", "")).unwrap();
        for n in [Normalize::None, Normalize::Lower, Normalize::Username] {
            let c = canonicalize(n, t.as_bytes(), b"").unwrap();
            assert_eq!(c.entity, t, "{n:?}");
        }
    }
}
