//! Keeps the raw items of tokenized sets out of SLOWLOG and MONITOR: a command that touched a
//! tokenized set (or one this node had to ask the catalog about) raises a flag, and its entry
//! point redacts the item and scope arguments before the server logs or shows the call.

use crate::server::redaction;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisResult, RedisString};

/// Where a command's items are in its argument vector.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// `<cmd> <set> <item> [<option> <value> …]`: EXISTS, EXPLAIN, ADD, DEL.
    Item,
    /// `<cmd> <set> [<option> <value> …] ITEMS <item> …`: MEXISTS, MADD.
    Many,
}

/// The positions to redact: every item and every SCOPE value. A call that failed, or whose
/// arguments do not parse, gets everything after the set name (an item may sit anywhere then).
pub fn positions(shape: Shape, argv: &[&[u8]], failed: bool) -> Vec<usize> {
    let scope = |i: usize| argv[i].eq_ignore_ascii_case(b"SCOPE");
    let everything = || (2..argv.len()).collect();
    if failed {
        return everything();
    }
    match shape {
        Shape::Item => {
            if argv.len() < 3 || argv.len().is_multiple_of(2) {
                return everything();
            }
            let mut out = vec![2];
            out.extend(
                (3..argv.len())
                    .step_by(2)
                    .filter(|&i| scope(i))
                    .map(|i| i + 1),
            );
            out
        }
        Shape::Many => {
            let mut out = Vec::new();
            let mut at = 2;
            while at < argv.len() && !argv[at].eq_ignore_ascii_case(b"ITEMS") {
                if at + 1 >= argv.len() {
                    return everything();
                }
                if scope(at) {
                    out.push(at + 1);
                }
                at += 2;
            }
            if at >= argv.len() {
                return everything();
            }
            out.extend(at + 1..argv.len());
            out
        }
    }
}

/// Runs a command on items with its arguments as strings (the generic entry points).
pub fn around(
    ctx: &Context,
    shape: Shape,
    args: Vec<RedisString>,
    f: impl FnOnce(Vec<RedisString>) -> RedisResult,
) -> RedisResult {
    // Worked out before the command consumes its arguments (no copy of them is kept).
    let set = args
        .get(1)
        .map(|s| s.as_slice().to_vec())
        .unwrap_or_default();
    let argc = args.len();
    let ok = {
        let argv: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        positions(shape, &argv, false)
    };
    begin();
    let res = f(args);
    // A failed call: everything after the set name, as `positions` gives it.
    let failed = res.is_err();
    finish(ctx, &set, failed, |failed| {
        if failed {
            (2..argc).collect()
        } else {
            ok
        }
    });
    res
}

/// Clears the flag before a command runs (the in-place hot path).
pub fn begin() {
    redaction::clear();
}

/// After a command on items ran, with its arguments in place (the hot path).
pub fn after(ctx: &Context, shape: Shape, argv: &[&[u8]], failed: bool) {
    let set = argv.get(1).copied().unwrap_or_default();
    finish(ctx, set, failed, |failed| positions(shape, argv, failed));
}

/// Redacts the command's items when it raised the flag, or when it failed (maybe before it
/// looked at its set) and its set is not one this node knows to be plain.
fn finish(ctx: &Context, set: &[u8], failed: bool, positions: impl FnOnce(bool) -> Vec<usize>) {
    let raised = redaction::take();
    // Nothing to hide: no tokenized set was touched, and the call did not fail on a set that
    // may be one.
    let maybe_tokenized = raised || (failed && !known_plain(set));
    if !maybe_tokenized {
        return;
    }
    // SAFETY: reading a function pointer the server filled in at module load.
    let Some(redact) = (unsafe { raw::RedisModule_RedactClientCommandArgument }) else {
        return;
    };
    for pos in positions(failed) {
        // SAFETY: ctx is the live context of the command whose arguments these are; the
        // server checks `pos` against the client's argument count.
        unsafe { redact(ctx.ctx, pos as c_int) };
    }
}

fn known_plain(set: &[u8]) -> bool {
    let Ok(set) = std::str::from_utf8(set) else {
        return false;
    };
    crate::sets::state::with(|r| r.sets.get(set).is_some_and(|s| !s.def.tokenize.is_on()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(shape: Shape, args: &[&str]) -> Vec<usize> {
        let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        positions(shape, &argv, false)
    }

    #[test]
    fn single_item_commands() {
        assert_eq!(pos(Shape::Item, &["member.exists", "s", "x"]), vec![2]);
        assert_eq!(
            pos(
                Shape::Item,
                &["member.add", "s", "x", "TTL", "5", "scope", "m"]
            ),
            vec![2, 6]
        );
        // A malformed call: everything after the set name.
        assert_eq!(
            pos(Shape::Item, &["member.add", "s", "x", "SCOPE"]),
            vec![2, 3]
        );
        // A failed call: everything after the set name.
        let argv: [&[u8]; 5] = [b"member.exists", b"s", b"x", b"BOGUS", b"y"];
        assert_eq!(positions(Shape::Item, &argv, true), vec![2, 3, 4]);
    }

    #[test]
    fn many_item_commands() {
        assert_eq!(
            pos(
                Shape::Many,
                &[
                    "member.madd",
                    "s",
                    "SCOPE",
                    "m",
                    "TTL",
                    "5",
                    "ITEMS",
                    "a",
                    "b"
                ]
            ),
            vec![3, 7, 8]
        );
        // An item spelled like an option or like ITEMS is still an item.
        assert_eq!(
            pos(
                Shape::Many,
                &["member.mexists", "s", "ITEMS", "SCOPE", "ITEMS"]
            ),
            vec![3, 4]
        );
        assert_eq!(
            pos(Shape::Many, &["member.mexists", "s", "a", "b"]),
            vec![2, 3]
        );
        assert_eq!(pos(Shape::Many, &["member.mexists", "s", "a"]), vec![2]);
    }
}
