//! A hostile client: thousands of random calls to every command (public ones from a client,
//! internal ones from a primary's replication stream), with random arity, random bytes (NUL,
//! invalid UTF-8, characters whose code point ends in 0x00), random option names and extreme
//! numbers. The server must answer every call with valid, printable text and stay up, with no
//! crash or contained panic in its log. And runaway filter sizes are refused before anything
//! is allocated. Seed: `MEMBER_FUZZ_SEED` (printed on failure).
use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use redis::{Connection, ErrorKind, Value};
use support::member::*;
use support::{wait_until, Valkey};

/// splitmix64: small, seedable, good enough to pick arguments.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = std::env::var("MEMBER_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("MEMBER_FUZZ_SEED={seed}");
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// Characters whose code point is a multiple of 256 (the ones that became NUL), and others.
const CHARS: [&str; 12] = [
    "Ā",
    "܀",
    "😀",
    "Ȁ",
    "𐀀",
    "é",
    "ß",
    "ａ",
    "\u{feff}",
    "\u{202e}",
    "\u{10fff0}",
    "İ",
];
const OPTIONS: [&str; 16] = [
    "SCOPE",
    "TTL",
    "EXPIREAT",
    "ERROR",
    "CAPACITY",
    "CACHE-TTL",
    "RECENT-TTL",
    "NORMALIZE",
    "SYNC",
    "ITEMS",
    "DELETE-DATA",
    "scope",
    "Sync",
    "SCOPE\0",
    "TTL ",
    "%s%n",
];
const NUMBERS: [&str; 24] = [
    "-1",
    "0",
    "1",
    "2",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
    "1e308",
    "-1e308",
    "nan",
    "inf",
    "-inf",
    "0.5",
    "0.000001",
    "0.0000001",
    "4000000000",
    "4000000001",
    "315360000",
    "999999999999999999999999",
    "0x10",
    " 1",
    "1 ",
    "1.5",
    "",
];
const WORDS: [&str; 8] = [
    "none", "lower", "username", "s", "t", "fz1", "SET", "%p%p%p%p",
];
const SETS: [&str; 5] = ["s", "t", "fz1", "fz2", "fz_3"];

fn random_bytes(r: &mut Rng, max: usize) -> Vec<u8> {
    let n = r.below(max + 1);
    (0..n).map(|_| r.next() as u8).collect()
}

fn random_arg(r: &mut Rng) -> Vec<u8> {
    match r.below(10) {
        0 => random_bytes(r, 24),
        1 => {
            let mut s = String::new();
            for _ in 0..1 + r.below(3) {
                s.push_str(CHARS[r.below(CHARS.len())]);
                if r.below(2) == 0 {
                    s.push('x');
                }
            }
            s.into_bytes()
        }
        2 | 3 => r.pick(&OPTIONS).as_bytes().to_vec(),
        4 | 5 => r.pick(&NUMBERS).as_bytes().to_vec(),
        6 => r.pick(&WORDS).as_bytes().to_vec(),
        7 => r.pick(&SETS).as_bytes().to_vec(),
        8 => match r.below(4) {
            0 => vec![b'a'; 1025],
            1 => vec![b'b'; 257],
            2 => "Ā".repeat(600).into_bytes(),
            _ => vec![0u8; 3],
        },
        _ => format!("item{}", r.below(50)).into_bytes(),
    }
}

/// A random call to `name`: usually a plausible shape (set, item, option pairs), sometimes
/// pure noise, with any arity from 0 to 9 arguments.
fn random_call(r: &mut Rng, name: &str) -> Vec<Vec<u8>> {
    let mut args = vec![name.as_bytes().to_vec()];
    let n = r.below(10);
    for i in 0..n {
        let a = match (i, r.below(3)) {
            (0, 0 | 1) => r.pick(&SETS).as_bytes().to_vec(),
            (1, 0) => format!("item{}", r.below(50)).into_bytes(),
            (j, 0) if j >= 2 && j % 2 == 0 => r.pick(&OPTIONS).as_bytes().to_vec(),
            (j, 1) if j >= 2 && j % 2 == 1 => r.pick(&NUMBERS).as_bytes().to_vec(),
            _ => random_arg(r),
        };
        args.push(a);
    }
    args
}

fn printable(s: &str) -> bool {
    s.bytes().all(|b| (b' '..=b'~').contains(&b))
}

fn show(args: &[Vec<u8>]) -> String {
    let shown: Vec<String> = args
        .iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(&a[..a.len().min(40)])))
        .collect();
    shown.join(" ")
}

/// Sends one raw call; the reply must be a well-formed answer with printable text.
fn call(c: &mut Connection, args: &[Vec<u8>], vk: &Valkey) {
    let mut cmd = redis::cmd(std::str::from_utf8(&args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(&a[..]);
    }
    match cmd.query::<Value>(c) {
        Ok(v) => check_value(&v, args),
        Err(e) => {
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ResponseError | ErrorKind::ExtensionError | ErrorKind::TryAgain
                ) || e.code().is_some(),
                "{} -> transport error {e:?}\nlog tail:\n{}",
                show(args),
                tail(&vk.log())
            );
            let text = format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""));
            assert!(
                printable(&text),
                "{} -> unprintable error {text:?}",
                show(args)
            );
            assert!(
                !text.contains("internal error"),
                "{} -> a contained panic: {text}",
                show(args)
            );
        }
    }
}

fn check_value(v: &Value, args: &[Vec<u8>]) {
    match v {
        Value::SimpleString(s) => assert!(printable(s), "{} -> {s:?}", show(args)),
        Value::Array(items) => items.iter().for_each(|i| check_value(i, args)),
        _ => {}
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// No crash report, no panic, no contained internal error in the server log.
fn assert_clean_log(vk: &Valkey) {
    let log = vk.log();
    for bad in [
        "BUG REPORT",
        "crashed by signal",
        "panicked",
        "internal error",
    ] {
        assert!(
            !log.contains(bad),
            "server log mentions {bad:?}:\n{}",
            tail(&log)
        );
    }
}

const PUBLIC: [&str; 10] = [
    "MEMBER.CREATE",
    "MEMBER.MEXISTS",
    "MEMBER.MADD",
    "MEMBER.DROP",
    "MEMBER.ADD",
    "MEMBER.EXISTS",
    "MEMBER.DEL",
    "MEMBER.EXPLAIN",
    "MEMBER.REBUILD",
    "MEMBER.INFO",
];
const INTERNAL: [&str; 5] = [
    "MEMBER._ADD",
    "MEMBER._DEL",
    "MEMBER._LOAD",
    "MEMBER._SET",
    "MEMBER._DROP",
];

#[test]
fn random_calls_from_a_client_never_crash_the_server() {
    let env = Env::with(&[
        ("member.max-filter-bytes", "16mb"),
        ("member.db-timeout-ms", "2000"),
    ]);
    let mut c = env.conn();
    for s in ["s", "t"] {
        assert_eq!(
            cmd(&mut c, &["MEMBER.CREATE", s, "CAPACITY", "1000"]).unwrap(),
            Value::Okay
        );
    }
    // The three calls that used to abort the server, first.
    for args in [
        &["MEMBER.CREATE", "s", "Ā", "1"][..],
        &["MEMBER.EXISTS", "s", "x", "Ā", "1"],
        &["MEMBER.REBUILD", "s", "Ā"],
        &["MEMBER.ADD", "s", "x", "😀", "܀"],
    ] {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        call(&mut c, &args, &env.vk);
    }
    // Echoed text stays readable: escaped, valid UTF-8.
    assert_eq!(
        err(&mut c, &["MEMBER.CREATE", "s", "Ā\u{e9}", "1"]),
        "ERR unknown option '\\u{100}\\u{e9}'"
    );
    // The commands that carry items never echo one (it may be a misplaced item).
    assert_eq!(
        err(&mut c, &["MEMBER.EXISTS", "s", "x", "Ā\u{e9}", "1"]),
        "ERR unknown option at argument 3"
    );
    // Every command that echoes an option escapes it and shows at most 64 bytes of it.
    let long = format!("Ā\\{}", "x".repeat(100_000));
    let shown = format!("\\u{{100}}\\\\{}...", "x".repeat(61));
    for args in [
        &["MEMBER.CREATE", "s", long.as_str(), "1"][..],
        &["MEMBER.REBUILD", "s", long.as_str()],
        &["MEMBER.DROP", "s", long.as_str()],
    ] {
        assert_eq!(
            err(&mut c, args),
            format!("ERR unknown option '{shown}'"),
            "{}",
            args[0]
        );
    }
    let mut r = Rng::seeded();
    for _ in 0..2500 {
        let name = *r.pick(&PUBLIC);
        let args = random_call(&mut r, name);
        call(&mut c, &args, &env.vk);
    }
    // Internal commands from an ordinary client are refused, whatever their arguments.
    for _ in 0..300 {
        let name = *r.pick(&INTERNAL);
        let args = random_call(&mut r, name);
        call(&mut c, &args, &env.vk);
    }
    assert_eq!(redis::cmd("PING").query::<String>(&mut c).unwrap(), "PONG");
    // The run may have dropped it (MEMBER.DROP is fuzzed too): a fresh set must work.
    assert_eq!(
        cmd(&mut c, &["MEMBER.CREATE", "after"]).unwrap(),
        Value::Okay
    );
    assert_eq!(int(&mut c, &["MEMBER.ADD", "after", "alive"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "after", "alive"]), 1);
    assert_clean_log(&env.vk);
}

/// RESP encoding of one command.
fn resp(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one RESP array of bulk strings (what a replica sends during the handshake).
fn read_command(r: &mut BufReader<TcpStream>) -> Vec<String> {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let n: usize = line.trim_start_matches('*').trim().parse().unwrap_or(0);
    let mut out = Vec::new();
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).unwrap();
        let len: usize = line.trim_start_matches('$').trim().parse().unwrap();
        let mut buf = vec![0; len + 2];
        r.read_exact(&mut buf).unwrap();
        out.push(String::from_utf8_lossy(&buf[..len]).into_owned());
    }
    out
}

/// An empty snapshot written by the server binary under test (its own RDB version).
fn empty_rdb() -> Vec<u8> {
    let plain = Valkey::start_plain();
    let mut c = plain.conn();
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    std::fs::read(plain.dir().join("dump.rdb")).unwrap()
}

#[test]
fn random_internal_commands_from_a_primary_never_crash_the_replica() {
    let env = Env::with(&[("member.max-filter-bytes", "16mb")]);
    let mut c = env.conn();
    assert_eq!(
        cmd(&mut c, &["MEMBER.CREATE", "s", "CAPACITY", "1000"]).unwrap(),
        Value::Okay
    );
    let rdb = empty_rdb();
    // A primary played by the test: full resync with an empty dataset, then random effects.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(port)
        .query(&mut c)
        .unwrap();
    let (stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rd = BufReader::new(stream.try_clone().unwrap());
    let mut w = stream;
    loop {
        let cmd = read_command(&mut rd);
        let name = cmd
            .first()
            .map(|s| s.to_ascii_uppercase())
            .unwrap_or_default();
        match name.as_str() {
            "PING" => w.write_all(b"+PONG\r\n").unwrap(),
            "PSYNC" | "SYNC" => {
                w.write_all(format!("+FULLRESYNC {} 0\r\n", "a".repeat(40)).as_bytes())
                    .unwrap();
                w.write_all(format!("${}\r\n", rdb.len()).as_bytes())
                    .unwrap();
                w.write_all(&rdb).unwrap();
                break;
            }
            _ => w.write_all(b"+OK\r\n").unwrap(),
        }
    }
    assert!(
        wait_until(Duration::from_secs(20), || info_replication(&mut c)
            .contains("master_link_status:up")),
        "replica never linked:\n{}",
        tail(&env.vk.log())
    );
    let mut r = Rng::seeded();
    let mut stream_out = Vec::new();
    for _ in 0..2000 {
        let name = *r.pick(&INTERNAL);
        let mut args = random_call(&mut r, name);
        // Payload-shaped noise for _LOAD: a real header prefix with random bytes after it.
        if name == "MEMBER._LOAD" && args.len() >= 3 && r.below(2) == 0 {
            let mut p = b"LMBF\x01\x00".to_vec();
            p.extend(random_bytes(&mut r, 80));
            args[2] = p;
        }
        stream_out.extend(resp(&args));
    }
    stream_out.extend(resp(&[
        b"SET".to_vec(),
        b"fuzz:done".to_vec(),
        b"1".to_vec(),
    ]));
    w.write_all(&stream_out).unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || redis::cmd("GET")
            .arg("fuzz:done")
            .query::<Option<String>>(&mut c)
            .ok()
            .flatten()
            .is_some()),
        "the replica did not get through the stream:\n{}",
        tail(&env.vk.log())
    );
    assert_eq!(redis::cmd("PING").query::<String>(&mut c).unwrap(), "PONG");
    assert_clean_log(&env.vk);
    // A set definition out of bounds never registers a set (nor sizes a filter).
    let sets: u64 = info_field(&mut c, "sets").unwrap().parse().unwrap();
    assert!(sets <= SETS.len() as u64, "{sets} sets registered");
}

fn info_replication(c: &mut Connection) -> String {
    redis::cmd("INFO")
        .arg("replication")
        .query(c)
        .unwrap_or_default()
}

fn used_memory(c: &mut Connection) -> i64 {
    info_number(c, "memory", "used_memory")
}

#[test]
fn a_filter_over_the_ceiling_is_refused_before_anything_is_allocated() {
    let env = Env::new();
    let mut c = env.conn();
    let before = used_memory(&mut c);
    let e = err(
        &mut c,
        &[
            "MEMBER.CREATE",
            "big",
            "CAPACITY",
            "4000000000",
            "ERROR",
            "0.000001",
        ],
    );
    assert!(e.starts_with("ERR the filter would need 14"), "{e}");
    assert!(
        e.contains("more than member.max-filter-bytes (1073741824 bytes)"),
        "{e}"
    );
    // Nothing written anywhere, nothing kept.
    assert!(err(&mut c, &["MEMBER.INFO", "big"]).contains("no such set"));
    let rows: i64 = env
        .pg()
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename IN ('member_big')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    let after = used_memory(&mut c);
    assert!((after - before).abs() < 4 << 20, "{before} -> {after}");
    // The ceiling is a config: lowered, it refuses what fitted before.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("member.max-filter-bytes")
        .arg("1mb")
        .query(&mut c)
        .unwrap();
    let e = err(&mut c, &["MEMBER.CREATE", "mid", "CAPACITY", "1000000"]);
    assert!(e.contains("member.max-filter-bytes (1048576 bytes)"), "{e}");
    assert_eq!(
        cmd(&mut c, &["MEMBER.CREATE", "small", "CAPACITY", "100000"]).unwrap(),
        Value::Okay
    );
}

#[test]
fn a_create_whose_client_timed_out_completes_into_a_usable_set_or_frees_everything() {
    // The client gives up long before a 24 MB filter is built; the set must still end usable
    // with its memory in the filter, or not exist with its memory returned.
    let env = Env::with(&[("member.db-timeout-ms", "10")]);
    let mut c = env.conn();
    let before = used_memory(&mut c);
    let reply = cmd(
        &mut c,
        &[
            "MEMBER.CREATE",
            "big",
            "CAPACITY",
            "20000000",
            "ERROR",
            "0.01",
        ],
    );
    let settled = wait_until(Duration::from_secs(120), || {
        set_info(&mut c, "big", "filter_complete").as_deref() == Ok("1")
    });
    if !settled {
        // The catalog step itself failed (a 10 ms connect timeout on a busy machine): then
        // nothing may exist or be held.
        eprintln!(
            "path: the CREATE failed before its catalog row ({reply:?}); checking nothing is left"
        );
        assert!(
            reply.is_err(),
            "OK but never complete:\n{}",
            tail(&env.vk.log())
        );
        let rows: i64 = env
            .pg()
            .query_one(
                "SELECT count(*) FROM member_catalog WHERE name = 'big'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            rows,
            0,
            "in the catalog but never complete:\n{}",
            tail(&env.vk.log())
        );
        let after = used_memory(&mut c);
        assert!((after - before).abs() < 16 << 20, "{before} -> {after}");
        return;
    }
    eprintln!("path: the set completed after its client's CREATE ({reply:?}); checking its memory");
    let filter: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("member:big:bloom")
        .query(&mut c)
        .unwrap();
    assert!(filter > 20 << 20, "{filter}");
    // The allocator rounds a block this large up to its size class (24 MiB here), which
    // MEMORY USAGE does not show; anything beyond that would be memory held outside the set.
    // The build's serialized copy (replicated at the swap) is freed on a thread of its own a
    // moment after the set is complete, so the check waits for that, not longer.
    let settled = wait_until(Duration::from_secs(10), || {
        used_memory(&mut c) - before < filter + filter / 5
    });
    let after = used_memory(&mut c);
    assert!(
        settled,
        "used_memory {before} -> {after}, filter {filter}: memory held outside the set"
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "big", "nobody"]), 0);
}

/// PRODUCT, docs/commands.md "Errors": a worker that panics produces an error reply, never a
/// hung client. Debug builds (the ones tested) panic on an ADD of a failpoint item
/// (`members::PANIC_ITEM`): its client gets one error, the single worker goes on serving, nothing is
/// written for it, and the server lives.
#[test]
fn a_panicking_worker_job_answers_its_client_once_and_the_worker_goes_on() {
    const PANIC_ITEM: &str = "libmember-test-failpoint-panic-in-worker";
    // A generous database timeout: on a busy machine the default one can end the wait before
    // the worker's panic is reported, and the reply would be the timeout's.
    // The failpoint exists in debug builds only: this test loads one whatever module the
    // others load (`make test` runs them against the release build).
    let env = Env::debug_build(&[("member.workers", "1"), ("member.db-timeout-ms", "30000")]);
    let mut c = env.conn();
    assert_eq!(cmd(&mut c, &["MEMBER.CREATE", "p"]).unwrap(), Value::Okay);
    for _ in 0..3 {
        let e = err(&mut c, &["MEMBER.ADD", "p", PANIC_ITEM]);
        assert_eq!(e, "UNAVAILABLE database worker failed before answering");
        // One reply: the next one on this connection is the PING's.
        assert_eq!(redis::cmd("PING").query::<String>(&mut c).unwrap(), "PONG");
    }
    assert_eq!(int(&mut c, &["MEMBER.ADD", "p", "after"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "p", "after"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "p", PANIC_ITEM]), 0);
    let rows: i64 = env
        .pg()
        .query_one("SELECT count(*) FROM member_p", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
    // The warning comes through the main thread's queue: wait for it.
    let said = "a database job panicked (contained; its clients got UNAVAILABLE): libmember test \
                failpoint";
    assert!(
        wait_until(Duration::from_secs(10), || env.vk.log().contains(said)),
        "the failpoint did not fire:\n{}",
        tail(&env.vk.log())
    );
}

/// Every string config, and a few others, for the random config run.
const CONFIGS: [&str; 9] = [
    "member.pg-url",
    "member.attach-allow",
    "member.pg-rebuild-url",
    "member.pg-password-file",
    "member.token-key-file",
    "member.default-error-rate",
    "member.workers",
    "member.max-filter-bytes",
    "member.acl-sets",
];

/// A hostile value for a config: control bytes spliced into plausible connection strings
/// (quoted, backslash-escaped, percent-encoded), random bytes, huge values, and paths of
/// files that must never be read (a FIFO nobody writes to, a directory, a device, a sparse
/// file of 1 GiB, a file with a NUL inside).
fn random_config_value(r: &mut Rng, files: &[String]) -> Vec<u8> {
    const CONTROL: [&str; 7] = ["\0", "\t", "\n", "\r", "\x1b", "\x7f", "\u{85}"];
    const ENCODED: [&str; 5] = ["%00", "%0a", "%7f", "%c2%85", "%ff"];
    let c = *r.pick(&CONTROL);
    let e = *r.pick(&ENCODED);
    match r.below(12) {
        0 => format!("dbname='ac{c}l'").into_bytes(),
        1 => format!("host='127.0.0.1{c}' user=postgres").into_bytes(),
        2 => format!("host=127.0.0.1 sslrootcert=a\\{c}b sslmode=verify-ca").into_bytes(),
        3 => format!("postgres://postgres@127.0.0.1/postgres?sslrootcert=a{e}b").into_bytes(),
        4 => format!("postgres://u:p{e}w@h{e}/d{e}b?application_name={e}").into_bytes(),
        5 => format!("/tmp/{c}/key").into_bytes(),
        6 | 7 => r.pick(files).as_bytes().to_vec(),
        8 => random_bytes(r, 40),
        9 => match r.below(3) {
            0 => vec![b'a'; 1 << 20],
            1 => vec![0u8; 5000],
            _ => format!("host={}", "h".repeat(4100)).into_bytes(),
        },
        10 => r.pick(&NUMBERS).as_bytes().to_vec(),
        _ => {
            let mut v = random_arg(r);
            v.insert(r.below(v.len() + 1), 0);
            v
        }
    }
}

#[test]
fn random_config_values_never_crash_hang_or_exhaust_the_server() {
    let env = Env::new();
    let mut c = env.conn();
    // Far longer than any refusal takes; a FIFO opened for reading blocked forever.
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let dir = std::env::temp_dir().join(format!("member-hostile-cfg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let cpath = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let sparse = dir.join("sparse");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let nul = dir.join("nul");
    std::fs::write(&nul, "pass\0word\n").unwrap();
    let files: Vec<String> = [fifo.as_path(), &sparse, &nul, &dir]
        .iter()
        .map(|p| p.to_str().unwrap().to_string())
        .chain(["/dev/zero", "/dev/urandom", "/proc/self/mem"].map(String::from))
        .collect();
    // What a fresh server has: put back after the run.
    let fresh: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.*")
        .query(&mut c)
        .unwrap();
    let mut r = Rng::seeded();
    for _ in 0..300 {
        let name = *r.pick(&CONFIGS);
        let value = random_config_value(&mut r, &files);
        let args = vec![b"CONFIG".to_vec(), b"SET".to_vec(), name.into(), value];
        call(&mut c, &args, &env.vk);
        let pong: Result<String, _> = redis::cmd("PING").query(&mut c);
        assert_eq!(
            pong.as_deref().ok(),
            Some("PONG"),
            "{} -> the server is gone\n{}",
            show(&args),
            tail(&env.vk.log())
        );
        let all: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("member.*")
            .query(&mut c)
            .unwrap();
        assert!(
            all.iter().all(|v| !v.chars().any(char::is_control)),
            "{} -> a control character stored",
            show(&args)
        );
        let info: String = redis::cmd("INFO").arg("member").query(&mut c).unwrap();
        assert!(info.contains("member_sets"), "{}", show(&args));
    }
    // Whatever the run left set, the fresh server's values make the module serve again (one
    // left at a valid but small member.max-filter-bytes refuses CREATE, rightly).
    for pair in fresh.chunks(2) {
        let _ = cmd(&mut c, &["CONFIG", "SET", &pair[0], &pair[1]]);
    }
    let mut last = None;
    let served = wait_until(Duration::from_secs(30), || {
        last = cmd(&mut c, &["MEMBER.CREATE", "after"]).err();
        last.is_none()
    });
    assert!(
        served,
        "CREATE after the run: {last:?}; configs {:?}\n{}",
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("member.*")
            .query::<Vec<String>>(&mut c),
        tail(&env.vk.log())
    );
    assert_eq!(int(&mut c, &["MEMBER.ADD", "after", "alive"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "after", "alive"]), 1);
    assert_clean_log(&env.vk);
    // The 1 GiB sparse file and /dev/zero were never read.
    let status = std::fs::read_to_string(format!("/proc/{}/status", env.vk.pid())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(peak_kib < 512 * 1024, "peak RSS {peak_kib} KiB");
    let _ = std::fs::remove_dir_all(&dir);
}
