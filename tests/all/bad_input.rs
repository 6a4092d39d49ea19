//! Bad input for every command: a clear error, and nothing changed — not in PostgreSQL (catalog,
//! tables, rows), not in Valkey (DBSIZE), not in the module's per-set counters.
use crate::support;

use std::time::{SystemTime, UNIX_EPOCH};

use redis::Connection;
use support::member::*;

// The reply texts, quoted from src/model/error.rs.
const WRONG_ARITY: &str = "ERR wrong number of arguments";
const BAD_SET_NAME: &str = "ERR invalid set name: use 1 to 40 characters from [a-z0-9_]";
const UNKNOWN_SET: &str = "ERR no such set: create it with MEMBER.CREATE";
const EMPTY_ITEM: &str = "ERR item is empty";
const ITEM_TOO_LONG: &str = "ERR item is longer than 1024 bytes";
const ITEM_NOT_TEXT: &str = "ERR item must be valid UTF-8 without NUL bytes";
const ITEM_EMPTY_AFTER_NORMALIZE: &str = "ERR item is empty after normalization";
const ITEM_TOO_LONG_AFTER_NORMALIZE: &str =
    "ERR item is longer than 1024 bytes after normalization";
const SCOPE_TOO_LONG: &str = "ERR scope is longer than 256 bytes";
const SCOPE_NOT_TEXT: &str = "ERR scope must be valid UTF-8 without NUL bytes";
const BAD_TTL: &str = "ERR TTL must be an integer between 1 and 315360000 seconds";
const BAD_EXPIREAT: &str =
    "ERR EXPIREAT must be a unix time in seconds, in the future and within 10 years";
const TTL_AND_EXPIREAT: &str = "ERR TTL and EXPIREAT cannot be combined";
const BAD_ERROR_RATE: &str = "ERR ERROR must be a number between 0.000001 and 0.5";
const BAD_CAPACITY: &str = "ERR CAPACITY must be an integer between 1 and 4000000000";
const BAD_CACHE_TTL: &str = "ERR CACHE-TTL must be an integer between 1 and 31536000 seconds";
const BAD_RECENT_TTL: &str = "ERR RECENT-TTL must be an integer between 1 and 86400 seconds";
const BAD_NORMALIZE: &str = "ERR NORMALIZE must be one of none, lower, username";
const DUPLICATE_OPTION: &str = "ERR option given more than once";
const RESERVED_SET_NAME: &str = "ERR set name is reserved: catalog, changes, names starting \
     with catalog_ or changes_ and names ending in _updated_at, _slot or _pkey name the \
     module's own tables and indexes";
const SET_EXISTS_DIFFERENT: &str =
    "ERR set already exists with different settings (see MEMBER.INFO)";

/// The commands that take `<set> <item> [SCOPE <scope>]`.
const ITEM_CMDS: [&str; 4] = [
    "MEMBER.ADD",
    "MEMBER.EXISTS",
    "MEMBER.DEL",
    "MEMBER.EXPLAIN",
];

/// What the commands that carry items answer for an unknown option: its position, never
/// its text (it may be a misplaced item of a TOKENIZE set).
fn unknown_at(position: usize) -> String {
    format!("ERR unknown option at argument {position}")
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The error text ("CODE detail") of a call with raw byte arguments that must fail.
fn err_bytes(c: &mut Connection, args: &[&[u8]]) -> String {
    let mut k = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        k.arg(*a);
    }
    match k.query::<redis::Value>(c) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
            .trim()
            .to_string(),
    }
}

/// Asserts the call fails with exactly `want` (or, for [`WRONG_ARITY`], an error starting so).
fn refused_bytes(c: &mut Connection, args: &[&[u8]], want: &str) {
    let got = err_bytes(c, args);
    let printable: Vec<_> = args.iter().map(|a| String::from_utf8_lossy(a)).collect();
    if want == WRONG_ARITY {
        assert!(got.starts_with(WRONG_ARITY), "{printable:?} -> {got:?}");
    } else {
        assert_eq!(got, want, "{printable:?}");
    }
}

fn refused(c: &mut Connection, args: &[&str], want: &str) {
    let b: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    refused_bytes(c, &b, want);
}

fn split(line: &str) -> Vec<&str> {
    line.split(' ').collect()
}

/// `int` for a space-separated command line.
fn n(c: &mut Connection, line: &str) -> i64 {
    int(c, &split(line))
}

/// `refused` for a space-separated command line (no empty arguments).
fn bad(c: &mut Connection, line: &str, want: &str) {
    refused(c, &split(line), want);
}

fn texts(pg: &mut postgres::Client, sql: &str) -> Vec<String> {
    pg.query(sql, &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn rows(env: &Env, set: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM member_{set}");
    env.pg().query_one(&sql, &[]).unwrap().get(0)
}

/// Everything a bad call must not touch: the catalog, the `member*` relations, every set's
/// row count and rows, its counters in MEMBER.INFO, the number of sets, and DBSIZE.
fn snap(env: &Env, c: &mut Connection) -> Vec<String> {
    let mut pg = env.pg();
    let mut s = texts(
        &mut pg,
        "SELECT m::text FROM member_catalog m ORDER BY name",
    );
    let rels = "SELECT relname::text FROM pg_class WHERE relname ILIKE 'member%' ORDER BY 1";
    s.extend(texts(&mut pg, rels));
    for n in texts(&mut pg, "SELECT name FROM member_catalog ORDER BY name") {
        s.push(format!("{n}: {} rows", rows(env, &n)));
        let all = format!("SELECT t::text FROM member_{n} t ORDER BY entity_id, scope");
        s.extend(texts(&mut pg, &all));
        for f in ["adds", "dels", "exists_calls", "filter_items", "normalize"] {
            s.push(format!("{n}.{f} = {:?}", set_info(c, &n, f)));
        }
    }
    s.push(format!("sets = {:?}", info_field(c, "sets")));
    let dbsize: i64 = redis::cmd("DBSIZE").query(c).unwrap();
    s.push(format!("dbsize = {dbsize}"));
    s
}

/// No catalog row and no table for `name` (nor for its lowercased form).
fn assert_no_trace(env: &Env, name: &str) {
    let sql = "SELECT (SELECT count(*) FROM member_catalog WHERE name IN ($1, lower($1)))
                    + (SELECT count(*) FROM pg_class WHERE relname::text IN ($2, lower($2)))
                    + (SELECT count(*) FROM information_schema.tables
                       WHERE table_name::text IN ($2, lower($2)))";
    let t = format!("member_{name}");
    let n: i64 = env.pg().query_one(sql, &[&name, &t]).unwrap().get(0);
    assert_eq!(n, 0, "catalog row or table for {name:?}");
}

/// A set `s` (NORMALIZE none) holding `keep`, and a set `l` (NORMALIZE lower) holding `keep`.
fn setup() -> (Env, Connection) {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    ok(&mut c, &["MEMBER.CREATE", "l", "NORMALIZE", "lower"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "keep"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "l", "keep"]), 1);
    (env, c)
}

#[test]
fn arity_unknown_and_duplicate_options() {
    let (env, mut c) = setup();
    let before = snap(&env, &mut c);
    let (arity, dup) = (WRONG_ARITY, DUPLICATE_OPTION);
    let cases = [
        ("MEMBER.CREATE", arity),
        ("MEMBER.CREATE fresh ERROR", arity),
        ("MEMBER.CREATE fresh CAPACITY 10 NORMALIZE", arity),
        ("MEMBER.CREATE fresh bogus 1", "ERR unknown option 'bogus'"),
        ("MEMBER.CREATE fresh SCOPE x", "ERR unknown option 'SCOPE'"),
        ("MEMBER.CREATE fresh ERROR 0.01 error 0.01", dup),
        ("MEMBER.CREATE fresh NORMALIZE lower NORMALIZE lower", dup),
        ("MEMBER.CREATE s CAPACITY 5 CAPACITY 5", dup),
        ("MEMBER.INFO", arity),
        ("MEMBER.INFO s extra", arity),
        ("MEMBER.INFO s SCOPE x", arity),
        ("MEMBER.ADD s x TTL", arity),
        ("MEMBER.ADD s x SCOPE a EXPIREAT", arity),
        ("MEMBER.ADD s x NX 1", "ERR unknown option at argument 3"),
        (
            "MEMBER.ADD s x SCOPE a NX 1",
            "ERR unknown option at argument 5",
        ),
        ("MEMBER.ADD s x TTL 10 ttl 10", dup),
        ("MEMBER.ADD s x EXPIREAT 1 EXPIREAT 1", dup),
    ];
    for (line, want) in cases {
        bad(&mut c, line, want);
    }
    for cmd in ITEM_CMDS {
        refused(&mut c, &[cmd], WRONG_ARITY);
        bad(&mut c, &format!("{cmd} s"), WRONG_ARITY);
        bad(&mut c, &format!("{cmd} s x SCOPE"), WRONG_ARITY);
        bad(&mut c, &format!("{cmd} s x bogus 1"), &unknown_at(3));
        bad(&mut c, &format!("{cmd} s x SCOPE a scope b"), dup);
        if cmd != "MEMBER.ADD" {
            for opt in ["TTL", "EXPIREAT"] {
                bad(&mut c, &format!("{cmd} s keep {opt} 10"), &unknown_at(3));
            }
        }
    }
    assert_eq!(snap(&env, &mut c), before);
    assert_no_trace(&env, "fresh");
    bad(&mut c, "MEMBER.EXISTS fresh x", UNKNOWN_SET);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "keep"]), 1);
}

#[test]
fn bad_numbers() {
    let (env, mut c) = setup();
    let before = snap(&env, &mut c);
    // Values separated by '|' (some are empty).
    let create = [
        (
            "ERROR",
            BAD_ERROR_RATE,
            "0|0.6|abc|-0.01|0.0000009||nan|inf",
        ),
        ("CAPACITY", BAD_CAPACITY, "abc|0|-1|4000000001|1.5|"),
        ("CACHE-TTL", BAD_CACHE_TTL, "x|0|-1|31536001|2.5"),
        ("RECENT-TTL", BAD_RECENT_TTL, "x|0|-5|86401|1e3"),
        ("NORMALIZE", BAD_NORMALIZE, "upper||nonee|lower "),
    ];
    for (opt, want, values) in create {
        // Alone, and next to a good option, on a new set and on an existing one.
        let good = if opt == "ERROR" { "CAPACITY" } else { "ERROR" };
        let good_v = if opt == "ERROR" { "10" } else { "0.01" };
        for v in values.split('|') {
            for set in ["fresh", "s"] {
                refused(&mut c, &["MEMBER.CREATE", set, opt, v], want);
                refused(&mut c, &["MEMBER.CREATE", set, good, good_v, opt, v], want);
            }
        }
    }
    let past = (now() - 60).to_string();
    let far = (now() + 315_360_000 + 3600).to_string();
    let soon = (now() + 3600).to_string();
    for item in ["x", "keep"] {
        for v in ["0", "-1", "315360001", "abc", "1.5", ""] {
            refused(&mut c, &["MEMBER.ADD", "s", item, "TTL", v], BAD_TTL);
        }
        for v in [past.as_str(), "0", "-1", "abc", "", far.as_str()] {
            let args = ["MEMBER.ADD", "s", item, "EXPIREAT", v];
            refused(&mut c, &args, BAD_EXPIREAT);
        }
        let l = format!("MEMBER.ADD s {item} TTL 10 EXPIREAT {soon}");
        bad(&mut c, &l, TTL_AND_EXPIREAT);
        let l = format!("MEMBER.ADD s {item} EXPIREAT {soon} SCOPE m TTL 10");
        bad(&mut c, &l, TTL_AND_EXPIREAT);
    }
    assert_eq!(snap(&env, &mut c), before);
    assert_no_trace(&env, "fresh");

    // The bounds themselves are accepted.
    ok(&mut c, &split("MEMBER.CREATE edge ERROR 0.5 CAPACITY 1"));
    let l = "MEMBER.CREATE edge2 ERROR 0.000001 CAPACITY 100 CACHE-TTL 31536000 RECENT-TTL 86400";
    ok(&mut c, &split(l));
    assert_eq!(n(&mut c, "MEMBER.ADD s t1 TTL 315360000"), 1);
    assert_eq!(n(&mut c, "MEMBER.ADD s t2 TTL 1"), 1);
    assert_eq!(n(&mut c, &format!("MEMBER.ADD s t3 EXPIREAT {soon}")), 1);
    assert_eq!(rows(&env, "s"), 4);
}

#[test]
fn bad_items_and_scopes() {
    let (env, mut c) = setup();
    let before = snap(&env, &mut c);
    let long = vec![b'a'; 1025];
    let long_utf8 = [&"é".repeat(512).into_bytes()[..], b"a"].concat();
    let long_scope = vec![b's'; 257];
    // 1024 bytes that lowercase to 1536.
    let lengthened = "İ".repeat(512).into_bytes();
    let cases: [(&[&[u8]], &str); 16] = [
        (&[b"s", b""], EMPTY_ITEM),
        (&[b"s", b"", b"SCOPE", b"m"], EMPTY_ITEM),
        (&[b"s", &long], ITEM_TOO_LONG),
        (&[b"s", &long_utf8], ITEM_TOO_LONG),
        (&[b"l", &long], ITEM_TOO_LONG),
        (&[b"s", b"a\0b"], ITEM_NOT_TEXT),
        (&[b"s", b"keep\0"], ITEM_NOT_TEXT),
        (&[b"s", b"a\xff"], ITEM_NOT_TEXT),
        (&[b"s", b"\xc3"], ITEM_NOT_TEXT),
        (&[b"s", b"keep", b"SCOPE", &long_scope], SCOPE_TOO_LONG),
        (&[b"s", b"keep", b"SCOPE", b"m\0"], SCOPE_NOT_TEXT),
        (&[b"s", b"keep", b"SCOPE", b"m\xff"], SCOPE_NOT_TEXT),
        (&[b"l", b"   "], ITEM_EMPTY_AFTER_NORMALIZE),
        (&[b"l", &lengthened], ITEM_TOO_LONG_AFTER_NORMALIZE),
        (&[b"l", b" \t\n "], ITEM_EMPTY_AFTER_NORMALIZE),
        (&[b"l", b"   ", b"SCOPE", b"m"], ITEM_EMPTY_AFTER_NORMALIZE),
    ];
    for cmd in ITEM_CMDS {
        for (rest, want) in cases {
            refused_bytes(&mut c, &[&[cmd.as_bytes()][..], rest].concat(), want);
        }
    }
    for (ttl, want) in [(b"10", ITEM_NOT_TEXT), (b"-1", BAD_TTL)] {
        refused_bytes(&mut c, &[b"MEMBER.ADD", b"s", b"a\xff", b"TTL", ttl], want);
    }
    assert_eq!(snap(&env, &mut c), before);

    // 1024 bytes of item and 256 of scope are accepted; so is "   " where nothing is trimmed.
    let (max, max_utf8, max_scope) = ("a".repeat(1024), "é".repeat(512), "s".repeat(256));
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", &max]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", &max]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", &max_utf8]), 1);
    assert_eq!(n(&mut c, &format!("MEMBER.ADD s x SCOPE {max_scope}")), 1);
    assert_eq!(
        n(&mut c, &format!("MEMBER.EXISTS s x SCOPE {max_scope}")),
        1
    );
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "   "]), 1);
    assert_eq!((rows(&env, "s"), rows(&env, "l")), (5, 1));
}

#[test]
fn unknown_and_invalid_set_names() {
    let (env, mut c) = setup();
    let before = snap(&env, &mut c);
    let too_long = "a".repeat(41);
    let invalid = ["Users", "a-b", "", &too_long, "naïve", "s ", "member:x"];
    for name in invalid {
        refused(&mut c, &["MEMBER.CREATE", name], BAD_SET_NAME);
        let args = ["MEMBER.CREATE", name, "NORMALIZE", "lower"];
        refused(&mut c, &args, BAD_SET_NAME);
        refused(&mut c, &["MEMBER.INFO", name], BAD_SET_NAME);
        for cmd in ITEM_CMDS {
            refused(&mut c, &[cmd, name, "x"], BAD_SET_NAME);
            refused(&mut c, &[cmd, name, "x", "SCOPE", "m"], BAD_SET_NAME);
        }
    }
    refused_bytes(&mut c, &[b"MEMBER.CREATE", b"a\xff"], BAD_SET_NAME);
    refused_bytes(&mut c, &[b"MEMBER.CREATE", b"a\0"], BAD_SET_NAME);
    bad(&mut c, "MEMBER.INFO nosuch", UNKNOWN_SET);
    for cmd in ITEM_CMDS {
        bad(&mut c, &format!("{cmd} nosuch x"), UNKNOWN_SET);
        bad(&mut c, &format!("{cmd} nosuch x SCOPE m"), UNKNOWN_SET);
    }
    bad(&mut c, "MEMBER.ADD nosuch x TTL 10", UNKNOWN_SET);
    assert_eq!(snap(&env, &mut c), before);
    for name in invalid.iter().chain(&["nosuch", "users", "a"]) {
        assert_no_trace(&env, name);
    }

    // 40 characters is the longest name.
    let forty = "a_1".repeat(13) + "z";
    ok(&mut c, &["MEMBER.CREATE", &forty]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", &forty, "x"]), 1);
    assert_eq!(rows(&env, &forty), 1);
}

/// A set's table `member_<set>` shares PostgreSQL's namespace with the module's own tables
/// and with every set's indexes: a new set whose table would take one of those names is
/// refused (it failed with a database error, or quietly left another set without its index).
#[test]
fn names_whose_table_would_collide_are_refused() {
    let (env, mut c) = setup();
    let before = snap(&env, &mut c);
    for name in [
        "catalog",
        "catalog_version",
        "changes",
        "changes_floor",
        "changes_seq_seq",
        "s_updated_at",
        "s_pkey",
        "s_slot",
        "later_updated_at",
    ] {
        refused(&mut c, &["MEMBER.CREATE", name], RESERVED_SET_NAME);
    }
    assert_eq!(snap(&env, &mut c), before);
    // So a set created later gets its own indexes, whatever was tried before.
    ok(&mut c, &["MEMBER.CREATE", "later"]);
    let n: i64 = env
        .pg()
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'member_later'
                AND indexname IN ('member_later_updated_at', 'member_later_pkey')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
}

#[test]
fn create_with_different_settings_is_refused() {
    let env = Env::new();
    let mut c = env.conn();
    let base = "NORMALIZE username CACHE-TTL 60 CAPACITY 1000";
    ok(&mut c, &split(&format!("MEMBER.CREATE u {base}")));
    assert_eq!(int(&mut c, &["MEMBER.ADD", "u", "Alice"]), 1);
    let before = snap(&env, &mut c);
    for opts in [
        "NORMALIZE lower",
        "NORMALIZE none",
        "ERROR 0.05",
        "CAPACITY 1001",
        "CACHE-TTL 61",
        "RECENT-TTL 11",
        "NORMALIZE username CACHE-TTL 300",
    ] {
        let l = format!("MEMBER.CREATE u {opts}");
        bad(&mut c, &l, SET_EXISTS_DIFFERENT);
    }
    assert_eq!(snap(&env, &mut c), before);
    let normalize = set_info(&mut c, "u", "normalize");
    assert_eq!(normalize.as_deref(), Ok("username"));
    assert_eq!(set_info(&mut c, "u", "cache_ttl").as_deref(), Ok("60"));

    // The same settings, a subset of them, or none at all: OK, and the stored ones are kept.
    ok(&mut c, &["MEMBER.CREATE", "u"]);
    for opts in [
        base,
        "NORMALIZE USERNAME",
        "CACHE-TTL 60",
        "ERROR 0.01 RECENT-TTL 10",
        "capacity 1000 normalize username",
    ] {
        ok(&mut c, &split(&format!("MEMBER.CREATE u {opts}")));
    }
    assert_eq!(snap(&env, &mut c), before);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "u", "ALICE "]), 1);
}
