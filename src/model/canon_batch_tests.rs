//! Tests of `canonicalize_all`: a call's items, their forms written into one buffer, give
//! exactly what `canonicalize` gives each item, errors included.

use super::*;

/// Items of every kind: ASCII and not, forms that are the item and forms that differ (by a
/// table lookup, by the steps, by a trim), and items each check refuses.
fn samples() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        "alice",
        "Alice ",
        "école",
        "Ábsënt李ｘ:12",
        " ＡＬＩＣＥ\u{3000}",
        "x\u{0301}y",
        "Straße",
        "˘a",
        "  ㈱  ",
        "𝐀b",
        "\u{3000}",
        "",
        "a\0b",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    v.push(vec![0xff, b'a']);
    v.push("ŉ".repeat(512).into_bytes());
    v.push(vec![b'a'; MAX_ITEM_BYTES + 1]);
    v
}

#[test]
fn a_batch_gives_each_items_own_canonical_form() {
    let samples = samples();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    let (mut whole, mut refused) = (0, 0);
    for round in 0..3_000 {
        let norm = [Normalize::None, Normalize::Lower, Normalize::Username][round % 3];
        let scope: &[u8] = [&b""[..], b"m1", b"\xff"][next(3)];
        let len = 1 + next(8);
        let items: Vec<&[u8]> = (0..len)
            .map(|_| &samples[next(samples.len())][..])
            .collect();
        let one_by_one: Result<Vec<Canon>, (usize, &str)> = items
            .iter()
            .enumerate()
            .map(|(i, item)| canonicalize(norm, item, scope).map_err(|e| (i, e)))
            .collect();
        let mut buf = String::from("left over from the last call");
        let batch = canonicalize_all(norm, &items, scope, &mut buf);
        assert_eq!(batch, one_by_one, "{norm:?} {items:?}");
        if batch.is_ok() {
            whole += 1;
        } else {
            refused += 1;
        }
    }
    // Both outcomes, many times each.
    assert!(
        whole > 300 && refused > 300,
        "{whole} accepted, {refused} refused"
    );
}
