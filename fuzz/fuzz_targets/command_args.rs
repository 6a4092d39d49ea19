//! Command argument parsing (`command::{ItemArgs, ManyArgs, Options}`, the hot path's
//! `lookup::fast_shape`) and the option values it hands on (integers, ERROR, NORMALIZE,
//! TOKENIZE spelling, canonicalization of the item and scope). The very parsers the commands
//! use, over byte vectors instead of server strings. Every error must be safe to send back
//! (no NUL, CR or LF, bounded), and the hot path must read what the generic parser reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use member::model::canon::{canonicalize, Normalize};
use member::command::lookup::fast_shape;
use member::command::{valid_set_name, ItemArgs, ManyArgs, Options};
use member::config::parse_error_rate;
use redis_module::RedisError;

/// An error reply must be one line the server can send as it is.
fn sendable(e: &RedisError) {
    let text = e.to_string();
    assert!(
        !text.bytes().any(|b| b == 0 || b == b'\r' || b == b'\n'),
        "unsendable error {text:?}"
    );
    assert!(text.len() < 1024, "error of {} bytes", text.len());
}

fn item_and_scope(item: &[u8], scope: &[u8]) {
    for n in [Normalize::None, Normalize::Lower, Normalize::Username] {
        let _ = canonicalize(n, item, scope);
    }
}

fuzz_target!(|args: Vec<Vec<u8>>| {
    // MEMBER.ADD / DEL / EXISTS / EXPLAIN.
    for extra in [&[][..], &["TTL", "EXPIREAT"][..]] {
        match ItemArgs::parse(args.clone(), extra) {
            Ok(a) => {
                assert!(args.len() >= 3 && args.len() % 2 == 1);
                assert!(valid_set_name(a.set.as_bytes()));
                assert_eq!(a.item, args[2]);
                for (name, range) in [("TTL", 1..=315_360_000), ("EXPIREAT", 1..=i64::MAX)] {
                    match a.opts.int(name, range.clone(), "ERR bad") {
                        Ok(Some(n)) => assert!(range.contains(&n)),
                        Ok(None) => {}
                        Err(e) => sendable(&e),
                    }
                }
                item_and_scope(&a.item, a.scope());
            }
            Err(e) => sendable(&e),
        }
    }
    // MEMBER.EXISTS read in place: the same reading as the generic parser, or none.
    let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    if let Some((set, item, scope)) = fast_shape(&argv) {
        let a = ItemArgs::parse(args.clone(), &[]).expect("the generic parser accepts it too");
        assert_eq!(
            (set, item, scope),
            (a.set.as_str(), a.item.as_slice(), a.scope())
        );
    }
    // MEMBER.MEXISTS / MADD.
    match ManyArgs::parse(args.clone(), &["TTL", "EXPIREAT"]) {
        Ok(a) => {
            assert!(!a.items.is_empty());
            assert!(valid_set_name(a.set.as_bytes()));
            assert!(a.items.len() <= args.len() - 3);
            assert_eq!(a.items[..], args[args.len() - a.items.len()..]);
            assert!(args[args.len() - a.items.len() - 1].eq_ignore_ascii_case(b"ITEMS"));
        }
        Err(e) => sendable(&e),
    }
    // MEMBER.CREATE's options and the values it reads from them.
    const OPTIONS: [&str; 6] = [
        "ERROR",
        "CAPACITY",
        "CACHE-TTL",
        "RECENT-TTL",
        "NORMALIZE",
        "TOKENIZE",
    ];
    match Options::parse(args.clone().into_iter().skip(2), OPTIONS[0], &OPTIONS[1..]) {
        Ok(o) => {
            if let Some(v) = o.get("ERROR") {
                if let Some(r) = std::str::from_utf8(v).ok().and_then(parse_error_rate) {
                    assert!((0.000001..=0.5).contains(&r));
                }
            }
            if let Some(v) = o.get("NORMALIZE") {
                let _ = Normalize::parse(v);
            }
            if let Err(e) = o.int("CAPACITY", 1..=4_000_000_000, "ERR bad") {
                sendable(&e);
            }
        }
        Err(e) => sendable(&e),
    }
});
