//! The `CLUSTER NODES` parser (`cluster::nodes::parse`): text from the server, read on every
//! topology change. It must never panic, and only ever name real slots.
#![no_main]

use libfuzzer_sys::fuzz_target;
use member::cluster::nodes::parse;

const SLOTS: u16 = 16384;

fuzz_target!(|text: &str| {
    let Some(m) = parse(text) else {
        return;
    };
    assert!(text
        .lines()
        .any(|l| l.split_whitespace().count() >= 8 && l.contains("myself")));
    assert!(m.ranges.iter().all(|&(a, b)| a <= b && b < SLOTS));
    assert!(m.owners.iter().all(|(a, b, _)| a <= b && *b < SLOTS));
    assert!(m.migrating.iter().all(|&s| s < SLOTS));
    assert!(m.owners.iter().all(|(_, _, id)| !id.is_empty()));
    if m.primary {
        // A primary's own ranges are among the owners'.
        assert!(m
            .ranges
            .iter()
            .all(|&(a, b)| m.owners.iter().any(|o| (o.0, o.1) == (a, b))));
    }
});
