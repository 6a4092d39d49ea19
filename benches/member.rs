//! libmember benchmark: `make bench` (1 000 000 members) or `make bench ARGS=--ten-million`.
//!
//! Starts its own PostgreSQL and valkey-server (release build of the module), loads the
//! members with SQL, then measures every figure against its baseline in the same run on the
//! same servers and prints one markdown table (also written to `bench/results.md`, with a
//! latency chart in `bench/latency.svg`).
//!
//! Load generators, each used for both sides of a ratio:
//! * `valkey-benchmark` for the negative path (EXISTS of absent items vs GET);
//! * a small RESP load generator (threads × connections, pipelining) for the mixed workload;
//! * one-operation-per-call threads (one connection each) for everything that compares with
//!   PostgreSQL or with the application-level pattern.
//!
//! Each side of a ratio runs twice, in A B B A order, and the two runs are pooled
//! (throughput = all operations / all seconds, percentiles = mean of the two runs), so a
//! slow drift of the machine does not favour either side.

#[path = "member/batch.rs"]
mod batch;
#[path = "member/big_filters.rs"]
mod big_filters;
#[path = "../tests/support/mod.rs"]
mod support;
// One file per section added since the bench grew large (benches/sections/).
#[path = "sections/cluster.rs"]
mod cluster;
#[path = "sections/idle_sync.rs"]
mod idle_sync;
#[path = "sections/tokenize.rs"]
mod tokenize;
#[path = "sections/visibility.rs"]
mod visibility;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::member::{start_loaded, wait_catalog_loaded};

const SET: &str = "bench";
const TABLE: &str = "member_bench";
/// The application-level pattern's keys: a Valkey SET standing in for the Bloom gate, a
/// recent-writes SET and exact-match cache keys.
const APP_SET: &str = "app:members";
const APP_RECENT: &str = "app:recent";
const APP_HIT: &str = "app:hit:";
/// The module's exact-match key prefix for an unscoped item (`member:<set>:hit:<item>\0`).
const HIT_PREFIX: &str = "member:bench:hit:";
/// The key GET reads in the negative-path baseline.
const PRESENT_KEY: &str = "bench:present";
const CONFIGURED_FPR: f64 = 0.01;
const CACHE_TTL_S: u64 = 3600;
/// Share of present items in the mixed workload, in percent.
const PRESENT_PCT: u64 = 5;
const POINT_QUERY: &str = "SELECT 1 FROM member_bench WHERE entity_id = $1 AND scope = ''";
const COPY_SQL: &str = "COPY (SELECT entity_id, scope FROM member_bench WHERE status = 1 \
     AND (expires_at IS NULL OR expires_at > now())) TO STDOUT";

// ---------------------------------------------------------------------------------------------
// options

struct Opts {
    members: u64,
    /// Seconds of load per side of each comparison (split over two runs).
    secs: f64,
    workers: Option<u32>,
    fpr_probes: u64,
    /// Sections to run (all when None); a partial run prints its table and writes no files.
    only: Option<Vec<String>>,
}

/// One part of a run.
type Section = fn(&mut Bench);

/// The sections of a run, in order, by the name `--only` takes (a comma-separated list).
/// `cluster` comes last: it adds items to the standalone set.
const SECTIONS: [(&str, Section); 12] = [
    ("memory", Bench::memory),
    ("negative", Bench::negative_path),
    ("mixed", Bench::mixed),
    ("cold", Bench::cold_path),
    ("rebuild", Bench::rebuild),
    ("writes", Bench::adds),
    ("bigfilter", Bench::big_filters),
    ("idle", Bench::idle_sync),
    ("batch", Bench::batch),
    ("tokenize", Bench::tokenize),
    ("visibility", Bench::visibility),
    ("cluster", Bench::cluster),
];

impl Opts {
    fn runs(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|s| s == section))
    }
}

const USAGE: &str = "usage: cargo bench --bench member -- [--ten-million] [--members N] \
     [--seconds S] [--workers N] [--fpr-probes N] [--only SECTIONS]
  --ten-million   load 10 000 000 members instead of 1 000 000
  --members N     load N members
  --seconds S     seconds of load per side of each comparison (default 4)
  --workers N     member.workers for the module (default: the module's default)
  --fpr-probes N  absent probes for the measured false-positive rate (default 1 000 000)
  --only SECTIONS run only these, comma-separated: memory,negative,mixed,cold,rebuild,writes,bigfilter,idle,batch,
                  tokenize,visibility,cluster
                  (prints the table; bench/results.md and the chart are kept as they are)";

impl Opts {
    fn parse() -> Opts {
        // `cargo bench` passes --bench; `cargo test --all-targets` (make test) runs this binary
        // too, without it and with the test harness' arguments: do nothing there.
        if !std::env::args().any(|a| a == "--bench") {
            println!("bench member: not run under `cargo test`; use `make bench`");
            std::process::exit(0);
        }
        let mut o = Opts {
            members: 1_000_000,
            secs: 4.0,
            workers: None,
            fpr_probes: 1_000_000,
            only: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = |name: &str| -> String {
                args.next()
                    .unwrap_or_else(|| die(&format!("{name} needs a value")))
            };
            match a.as_str() {
                // `cargo bench` passes --bench to harness = false targets.
                "--bench" => {}
                "--ten-million" => o.members = 10_000_000,
                "--members" => o.members = parse_num(&value("--members")),
                "--seconds" => {
                    o.secs = value("--seconds")
                        .parse()
                        .unwrap_or_else(|_| die("--seconds needs a number"))
                }
                "--workers" => o.workers = Some(parse_num(&value("--workers")) as u32),
                "--fpr-probes" => o.fpr_probes = parse_num(&value("--fpr-probes")),
                "--only" => {
                    let list: Vec<String> = value("--only")
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .collect();
                    let names: Vec<&str> = SECTIONS.iter().map(|(n, _)| *n).collect();
                    if let Some(bad) = list.iter().find(|s| !names.contains(&s.as_str())) {
                        die(&format!(
                            "--only: unknown section {bad:?} (one of {names:?})"
                        ));
                    }
                    o.only = Some(list);
                }
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => die(&format!("unknown argument {other:?}")),
            }
        }
        if o.members < 1000 {
            die("--members must be at least 1000");
        }
        if o.secs.is_nan() || o.secs < 0.5 {
            die("--seconds must be at least 0.5");
        }
        o
    }
}

fn parse_num(s: &str) -> u64 {
    s.replace(['_', ','], "")
        .parse()
        .unwrap_or_else(|_| die(&format!("not a number: {s}")))
}

fn die(msg: &str) -> ! {
    eprintln!("bench: {msg}\n{USAGE}");
    std::process::exit(2);
}

fn progress(msg: &str) {
    eprintln!("[bench] {msg}");
}

// ---------------------------------------------------------------------------------------------
// measurements

/// One measured load: operations over seconds, latency percentiles, and what went wrong.
#[derive(Clone, Debug, Default)]
struct Stats {
    ops: u64,
    secs: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Samples over 2 ms (where samples were kept).
    over_2ms: u64,
    /// Error replies.
    errors: u64,
    /// Replies that contradict what the load generator knows to be true.
    wrong: u64,
    first_error: Option<String>,
}

impl Stats {
    fn rps(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }

    fn from_samples(ops: u64, secs: f64, mut ns: Vec<u64>) -> Stats {
        ns.sort_unstable();
        let q = |p: f64| -> f64 {
            if ns.is_empty() {
                return 0.0;
            }
            let i = ((ns.len() as f64 * p).ceil() as usize).clamp(1, ns.len()) - 1;
            ns[i] as f64 / 1e6
        };
        Stats {
            ops,
            secs,
            p50_ms: q(0.50),
            p99_ms: q(0.99),
            max_ms: q(1.0),
            over_2ms: ns.iter().filter(|&&x| x > 2_000_000).count() as u64,
            ..Stats::default()
        }
    }

    /// Pools runs of the same load: throughput over all of them, mean percentiles.
    fn pool(runs: &[Stats]) -> Stats {
        let n = runs.len().max(1) as f64;
        Stats {
            ops: runs.iter().map(|r| r.ops).sum(),
            secs: runs.iter().map(|r| r.secs).sum(),
            p50_ms: runs.iter().map(|r| r.p50_ms).sum::<f64>() / n,
            p99_ms: runs.iter().map(|r| r.p99_ms).sum::<f64>() / n,
            max_ms: runs.iter().map(|r| r.max_ms).fold(0.0, f64::max),
            over_2ms: runs.iter().map(|r| r.over_2ms).sum(),
            errors: runs.iter().map(|r| r.errors).sum(),
            wrong: runs.iter().map(|r| r.wrong).sum(),
            first_error: runs.iter().find_map(|r| r.first_error.clone()),
        }
    }
}

/// Runs `a` and `b` in A B B A order and pools each side's two runs.
fn abba(mut a: impl FnMut() -> Stats, mut b: impl FnMut() -> Stats) -> (Stats, Stats) {
    let a1 = a();
    let b1 = b();
    let b2 = b();
    let a2 = a();
    (Stats::pool(&[a1, a2]), Stats::pool(&[b1, b2]))
}

/// splitmix64: a small, fast, good-enough generator for picking items.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ t)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// An item of the mixed workload: 95 % absent (never a member), 5 % one of the `warm` first
/// members (whose cache entries were filled before). Returns (item, is_member).
fn mixed_item(rng: &mut Rng, warm: u64) -> (String, bool) {
    if rng.below(100) < PRESENT_PCT {
        (format!("m{}", 1 + rng.below(warm)), true)
    } else {
        (format!("absent:{}", rng.next()), false)
    }
}

// ---------------------------------------------------------------------------------------------
// load generator 1: threads with one connection each, one operation per call

/// `threads` threads, each with the worker `make(thread)` returns, calling `op` in a loop for
/// `dur`. `op` returns Ok(true) for a correct answer, Ok(false) for a wrong one.
fn thread_load<W, M, O>(threads: usize, dur: Duration, make: M, op: O) -> Stats
where
    M: Fn(usize) -> W + Sync,
    O: Fn(&mut W, &mut Rng) -> Result<bool, String> + Sync,
{
    let barrier = Barrier::new(threads);
    let results: Mutex<Vec<ThreadResult>> = Mutex::new(Vec::new());
    thread::scope(|s| {
        for t in 0..threads {
            let (barrier, results, make, op) = (&barrier, &results, &make, &op);
            s.spawn(move || {
                let mut w = make(t);
                let mut rng = Rng::new(t as u64 + 1);
                let mut lat = Vec::with_capacity(1 << 16);
                let (mut ops, mut errors, mut wrong, mut first) = (0u64, 0u64, 0u64, None);
                barrier.wait();
                let start = Instant::now();
                let deadline = start + dur;
                loop {
                    let t0 = Instant::now();
                    if t0 >= deadline {
                        break;
                    }
                    match op(&mut w, &mut rng) {
                        Ok(true) => {}
                        Ok(false) => wrong += 1,
                        Err(e) => {
                            errors += 1;
                            first.get_or_insert(e);
                        }
                    }
                    lat.push(t0.elapsed().as_nanos() as u64);
                    ops += 1;
                }
                let end = Instant::now();
                results
                    .lock()
                    .unwrap()
                    .push((start, end, ops, errors, wrong, first, lat));
            });
        }
    });
    merge(results.into_inner().unwrap())
}

/// pgbench, `-S` style: `clients` connections on 2 threads, each running one prepared point
/// query of a random member after another, for `dur` (rounded up to whole seconds).
fn pgbench(db: &support::TestDb, members: u64, clients: usize, dur: Duration) -> Stats {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "member-pgbench-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create pgbench dir");
    let script = dir.join("point.sql");
    std::fs::write(
        &script,
        format!(
            "\\set id random(1, {members})\n\
             SELECT 1 FROM member_bench WHERE entity_id = 'm' || :id AND scope = '';\n"
        ),
    )
    .expect("write pgbench script");
    let secs = dur.as_secs_f64().ceil().max(1.0) as u64;
    let out = Command::new(support::pg_bin("pgbench"))
        .current_dir(&dir)
        .args(["-h", "127.0.0.1", "-U", "postgres", "-n", "-M", "prepared"])
        .args(["-p", &support::Pg::get().port().to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-T",
            &secs.to_string(),
        ])
        .arg("-f")
        .arg(&script)
        .args(["-l", "--log-prefix=tx"])
        .arg(&db.name)
        .output()
        .unwrap_or_else(|e| die(&format!("cannot run pgbench: {e}")));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        die(&format!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let tps: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| die(&format!("no tps in pgbench output: {stdout}")));
    // Log lines: client_id transaction_no latency_us script_no epoch_s epoch_us.
    let mut lat = Vec::new();
    for e in std::fs::read_dir(&dir).expect("read pgbench dir").flatten() {
        if !e.file_name().to_string_lossy().starts_with("tx.") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        lat.extend(text.lines().filter_map(|l| {
            l.split_whitespace()
                .nth(2)
                .and_then(|us| us.parse::<u64>().ok())
                .map(|us| us * 1000)
        }));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ops = lat.len() as u64;
    Stats::from_samples(ops, ops as f64 / tps.max(1.0), lat)
}

type ThreadResult = (Instant, Instant, u64, u64, u64, Option<String>, Vec<u64>);

fn merge(results: Vec<ThreadResult>) -> Stats {
    let start = results.iter().map(|r| r.0).min().unwrap();
    let end = results.iter().map(|r| r.1).max().unwrap();
    let ops = results.iter().map(|r| r.2).sum();
    let errors = results.iter().map(|r| r.3).sum();
    let wrong = results.iter().map(|r| r.4).sum();
    let first_error = results.iter().find_map(|r| r.5.clone());
    let mut all = Vec::with_capacity(results.iter().map(|r| r.6.len()).sum());
    for r in results {
        all.extend(r.6);
    }
    let mut st = Stats::from_samples(ops, (end - start).as_secs_f64(), all);
    st.errors = errors;
    st.wrong = wrong;
    st.first_error = first_error;
    st
}

// ---------------------------------------------------------------------------------------------
// load generator 2: raw RESP over many connections per thread, pipelined

/// What the generator knows about the answer to a command.
#[derive(Clone, Copy)]
enum Expect {
    /// `:1` or a bulk string.
    Yes,
    /// `:0` or nil.
    No,
}

enum Reply {
    Int(i64),
    Nil,
    Bulk,
    Simple,
    Array,
    Error(String),
}

fn push_cmd(buf: &mut Vec<u8>, args: &[&[u8]]) {
    let _ = write!(buf, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(buf, "${}\r\n", a.len());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

fn bad_reply(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Parses one reply from the front of `b`: Some((reply, bytes used)), or None if `b` does not
/// hold a whole reply yet.
fn parse_reply(b: &[u8]) -> io::Result<Option<(Reply, usize)>> {
    let Some(nl) = b.iter().position(|&c| c == b'\n') else {
        return Ok(None);
    };
    if nl < 2 || b[nl - 1] != b'\r' {
        return Err(bad_reply("malformed reply line"));
    }
    let body = &b[1..nl - 1];
    let head = nl + 1;
    let num = || -> io::Result<i64> {
        std::str::from_utf8(body)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad_reply("bad number in reply"))
    };
    let reply = match b[0] {
        b':' => (Reply::Int(num()?), head),
        b'+' => (Reply::Simple, head),
        b'-' => (
            Reply::Error(String::from_utf8_lossy(body).into_owned()),
            head,
        ),
        b'_' => (Reply::Nil, head),
        b'$' => {
            let n = num()?;
            if n < 0 {
                (Reply::Nil, head)
            } else {
                let end = head + n as usize + 2;
                if b.len() < end {
                    return Ok(None);
                }
                (Reply::Bulk, end)
            }
        }
        b'*' => {
            let mut pos = head;
            for _ in 0..num()?.max(0) {
                match parse_reply(&b[pos..])? {
                    Some((_, used)) => pos += used,
                    None => return Ok(None),
                }
            }
            (Reply::Array, pos)
        }
        _ => return Err(bad_reply("unknown reply type")),
    };
    Ok(Some(reply))
}

/// One non-blocking connection of the RESP generator with at most one batch in flight.
struct RawConn {
    s: TcpStream,
    rbuf: Vec<u8>,
    rpos: usize,
    wbuf: Vec<u8>,
    wpos: usize,
    expects: Vec<Expect>,
    answered: usize,
    sent_at: Instant,
    busy: bool,
}

impl RawConn {
    fn open(port: u16) -> RawConn {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to valkey");
        s.set_nodelay(true).unwrap();
        s.set_nonblocking(true).unwrap();
        RawConn {
            s,
            rbuf: Vec::with_capacity(1 << 16),
            rpos: 0,
            wbuf: Vec::with_capacity(4096),
            wpos: 0,
            expects: Vec::new(),
            answered: 0,
            sent_at: Instant::now(),
            busy: false,
        }
    }

    /// Writes what it can of the pending batch.
    fn flush(&mut self) {
        while self.wpos < self.wbuf.len() {
            match self.s.write(&self.wbuf[self.wpos..]) {
                Ok(0) => panic!("valkey closed the connection"),
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("write to valkey: {e}"),
            }
        }
    }

    /// Reads what is there; false if nothing could be read.
    fn fill(&mut self) -> bool {
        if self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        }
        let old = self.rbuf.len();
        self.rbuf.resize(old + (1 << 16), 0);
        let r = self.s.read(&mut self.rbuf[old..]);
        match r {
            Ok(0) => panic!("valkey closed the connection"),
            Ok(n) => {
                self.rbuf.truncate(old + n);
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                self.rbuf.truncate(old);
                false
            }
            Err(e) => panic!("read from valkey: {e}"),
        }
    }
}

enum Limit {
    Time(Duration),
    /// Exactly this many commands across all connections.
    Total(u64),
}

struct RawLoad {
    threads: usize,
    conns_per_thread: usize,
    pipeline: usize,
    limit: Limit,
}

/// Per-thread tallies of the RESP generator.
#[derive(Default)]
struct Tally {
    ops: u64,
    errors: u64,
    wrong: u64,
    first: Option<String>,
    lat: Vec<u64>,
}

/// Drives `threads × conns_per_thread` non-blocking connections, each with one batch of
/// `pipeline` commands in flight: as soon as a connection has all replies of its batch, it
/// sends the next one (like valkey-benchmark; a slow reply holds up only its own connection).
/// Latency is per batch, from its write to its last reply. `gen(rng, buf)` appends a command
/// to `buf` and says what its answer must be.
fn raw_load<G>(port: u16, load: &RawLoad, gen: &G) -> Stats
where
    G: Fn(&mut Rng, &mut Vec<u8>) -> Expect + Sync,
{
    let barrier = Barrier::new(load.threads);
    let next = AtomicU64::new(0);
    let results: Mutex<Vec<ThreadResult>> = Mutex::new(Vec::new());
    thread::scope(|s| {
        for t in 0..load.threads {
            let (barrier, next, results) = (&barrier, &next, &results);
            s.spawn(move || {
                let mut conns: Vec<RawConn> = (0..load.conns_per_thread)
                    .map(|_| RawConn::open(port))
                    .collect();
                let mut rng = Rng::new(1000 + t as u64);
                let mut tally = Tally {
                    lat: Vec::with_capacity(1 << 16),
                    ..Tally::default()
                };
                barrier.wait();
                let start = Instant::now();
                // Starts the next batch on `c`, unless the load is over.
                let start_batch = |c: &mut RawConn, rng: &mut Rng| -> bool {
                    let n = match load.limit {
                        Limit::Time(d) => {
                            if start.elapsed() >= d {
                                return false;
                            }
                            load.pipeline as u64
                        }
                        Limit::Total(total) => {
                            let first = next.fetch_add(load.pipeline as u64, Ordering::Relaxed);
                            if first >= total {
                                return false;
                            }
                            (total - first).min(load.pipeline as u64)
                        }
                    };
                    c.wbuf.clear();
                    c.wpos = 0;
                    c.expects.clear();
                    c.answered = 0;
                    for _ in 0..n {
                        c.expects.push(gen(rng, &mut c.wbuf));
                    }
                    c.sent_at = Instant::now();
                    c.busy = true;
                    c.flush();
                    true
                };
                for c in conns.iter_mut() {
                    start_batch(c, &mut rng);
                }
                let mut fds: Vec<libc::pollfd> = conns
                    .iter()
                    .map(|c| libc::pollfd {
                        fd: c.s.as_raw_fd(),
                        events: 0,
                        revents: 0,
                    })
                    .collect();
                let mut idle_since = Instant::now();
                while conns.iter().any(|c| c.busy) {
                    for (f, c) in fds.iter_mut().zip(&conns) {
                        f.events = if !c.busy {
                            0
                        } else if c.wpos < c.wbuf.len() {
                            libc::POLLIN | libc::POLLOUT
                        } else {
                            libc::POLLIN
                        };
                        f.revents = 0;
                    }
                    // SAFETY: `fds` is a valid array of pollfd for the call's duration.
                    let n =
                        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
                    if n < 0 {
                        let e = io::Error::last_os_error();
                        assert_eq!(e.kind(), io::ErrorKind::Interrupted, "poll: {e}");
                        continue;
                    }
                    if n == 0 {
                        assert!(
                            idle_since.elapsed() < Duration::from_secs(60),
                            "no reply from valkey for 60 s"
                        );
                        continue;
                    }
                    idle_since = Instant::now();
                    for (f, c) in fds.iter().zip(conns.iter_mut()) {
                        if f.revents == 0 {
                            continue;
                        }
                        if f.revents & libc::POLLOUT != 0 {
                            c.flush();
                        }
                        if f.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) == 0
                            || !c.fill()
                        {
                            continue;
                        }
                        while c.busy {
                            let parsed = parse_reply(&c.rbuf[c.rpos..])
                                .unwrap_or_else(|e| panic!("reply from valkey: {e}"));
                            let Some((reply, used)) = parsed else { break };
                            c.rpos += used;
                            let expect = c.expects[c.answered];
                            c.answered += 1;
                            tally.ops += 1;
                            match (expect, reply) {
                                (_, Reply::Error(msg)) => {
                                    tally.errors += 1;
                                    tally.first.get_or_insert(msg);
                                }
                                (Expect::Yes, Reply::Int(1) | Reply::Bulk) => {}
                                (Expect::No, Reply::Int(0) | Reply::Nil) => {}
                                _ => tally.wrong += 1,
                            }
                            if c.answered == c.expects.len() {
                                tally.lat.push(c.sent_at.elapsed().as_nanos() as u64);
                                c.busy = false;
                                assert!(
                                    c.rpos == c.rbuf.len(),
                                    "valkey sent more replies than commands"
                                );
                                start_batch(c, &mut rng);
                            }
                        }
                    }
                }
                let end = Instant::now();
                results.lock().unwrap().push((
                    start,
                    end,
                    tally.ops,
                    tally.errors,
                    tally.wrong,
                    tally.first,
                    tally.lat,
                ));
            });
        }
    });
    merge(results.into_inner().unwrap())
}

/// Fixed-total raw load: `gen(n, buf)` appends command `n` (0 ≤ n < total, each exactly once)
/// to `buf`. Used to warm caches and probe the false-positive rate.
fn raw_total<G>(port: u16, total: u64, gen: &G) -> Stats
where
    G: Fn(u64, &mut Vec<u8>) -> Expect + Sync,
{
    let counter = AtomicU64::new(0);
    let load = RawLoad {
        threads: 2,
        conns_per_thread: 25,
        pipeline: 32,
        limit: Limit::Total(total),
    };
    raw_load(port, &load, &|_: &mut Rng, buf: &mut Vec<u8>| {
        gen(counter.fetch_add(1, Ordering::Relaxed), buf)
    })
}

// ---------------------------------------------------------------------------------------------
// load generator 3: valkey-benchmark

/// One valkey-benchmark run of `n` requests; parses its CSV line.
/// `keyspace`: the range of `__rand_int__` (`-r`), when the command uses it.
fn vb_run(
    port: u16,
    clients: usize,
    pipeline: usize,
    n: u64,
    keyspace: Option<u64>,
    cmd: &[&str],
) -> Stats {
    let mut c = Command::new("valkey-benchmark");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-n", &n.to_string(), "--csv", "--precision", "3"]);
    if let Some(r) = keyspace {
        c.args(["-r", &r.to_string()]);
    }
    c.args(cmd);
    let out = c
        .output()
        .expect("run valkey-benchmark (valkey-tools installed?)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('"') && !l.starts_with("\"test\""))
        .unwrap_or_else(|| {
            panic!(
                "valkey-benchmark printed no result:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let f: Vec<f64> = line
        .split("\",\"")
        .skip(1)
        .map(|x| x.trim_matches('"').parse().unwrap_or(0.0))
        .collect();
    // "test","rps","avg","min","p50","p95","p99","max"
    assert!(f.len() >= 7, "unexpected valkey-benchmark line: {line}");
    Stats {
        ops: n,
        secs: n as f64 / f[0].max(1.0),
        p50_ms: f[3],
        p99_ms: f[5],
        max_ms: f[6],
        ..Stats::default()
    }
}

/// Sizes a valkey-benchmark run to about `secs` from a short calibration run.
fn vb_timed(port: u16, pipeline: usize, secs: f64, keyspace: Option<u64>, cmd: &[&str]) -> Stats {
    let probe = if pipeline > 1 { 200_000 } else { 40_000 };
    let cal = vb_run(port, 50, pipeline, probe, keyspace, cmd);
    let n = ((cal.rps() * secs) as u64).clamp(probe, 50_000_000);
    vb_run(port, 50, pipeline, n, keyspace, cmd)
}

/// `__rand_int__` range of the random absent probes: practically never repeated.
const ABSENT_KEYSPACE: u64 = 1_000_000_000;
/// A pool of absent items checked again and again (names re-typed at sign-up, cards seen on
/// every payment): its false positives are remembered after their first database answer.
const REPEATED_KEYSPACE: u64 = 100_000;

// ---------------------------------------------------------------------------------------------
// small client helpers

fn vk_conn(port: u16) -> redis::Connection {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let con = c
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("connect to valkey");
    con.set_read_timeout(Some(Duration::from_secs(600)))
        .unwrap();
    con
}

fn set_info_all(c: &mut redis::Connection) -> HashMap<String, String> {
    let v: Vec<String> = redis::cmd("MEMBER.INFO")
        .arg(SET)
        .query(c)
        .expect("MEMBER.INFO");
    v.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect()
}

fn num(info: &HashMap<String, String>, k: &str) -> f64 {
    info.get(k)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("MEMBER.INFO has no numeric {k}: {info:?}"))
}

fn info_stat(c: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(c).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|r| r.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

fn pg_connect(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect to postgres")
}

/// A thread that PINGs in a loop on its own connection and keeps the worst latency.
struct Pinger {
    stop: std::sync::Arc<AtomicBool>,
    handle: thread::JoinHandle<Stats>,
}

impl Pinger {
    fn start(port: u16) -> Pinger {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || {
            let mut c = vk_conn(port);
            let mut lat = Vec::new();
            let t = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let _: String = redis::cmd("PING").query(&mut c).expect("PING");
                lat.push(t0.elapsed().as_nanos() as u64);
            }
            Stats::from_samples(lat.len() as u64, t.elapsed().as_secs_f64(), lat)
        });
        Pinger { stop, handle }
    }

    /// Stops the thread: PING latencies (max_ms is the worst).
    fn finish(self) -> Stats {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("pinger panicked")
    }
}

fn is_unknown_command(e: &redis::RedisError) -> bool {
    e.to_string()
        .to_ascii_lowercase()
        .contains("unknown command")
}

// ---------------------------------------------------------------------------------------------
// the report

struct Row {
    section: &'static str,
    figure: String,
    lib: String,
    base: String,
    ratio: Option<f64>,
    target: String,
    met: Option<bool>,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    notes: Vec<String>,
    /// (label, p50 ms, p99 ms, is libmember) for the latency chart.
    bars: Vec<(String, f64, f64, bool)>,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    fn row(
        &mut self,
        section: &'static str,
        figure: impl Into<String>,
        lib: impl Into<String>,
        base: impl Into<String>,
        ratio: Option<f64>,
        target: impl Into<String>,
        met: Option<bool>,
    ) {
        self.rows.push(Row {
            section,
            figure: figure.into(),
            lib: lib.into(),
            base: base.into(),
            ratio,
            target: target.into(),
            met,
        });
    }

    fn note(&mut self, n: impl Into<String>) {
        let n = n.into();
        progress(&format!("note: {n}"));
        self.notes.push(n);
    }

    /// Throughput row (+ latency row) for a pair measured with the same generator.
    #[allow(clippy::too_many_arguments)]
    fn pair(
        &mut self,
        section: &'static str,
        what: &str,
        lib: &Stats,
        base: &Stats,
        min_ratio: Option<f64>,
        max_p99_ratio: Option<f64>,
        baseline_name: &str,
    ) {
        let ratio = lib.rps() / base.rps().max(1e-9);
        self.row(
            section,
            format!("{what}: ops/s"),
            rate(lib.rps()),
            format!("{} ({baseline_name})", rate(base.rps())),
            Some(ratio),
            min_ratio.map_or("—".into(), |m| format!("≥ {m:.2}×")),
            min_ratio.map(|m| ratio >= m),
        );
        let p99_ratio = lib.p99_ms / base.p99_ms.max(1e-9);
        self.row(
            section,
            format!("{what}: p50 / p99 latency"),
            lat(lib),
            lat(base),
            Some(p99_ratio),
            max_p99_ratio.map_or("—".into(), |m| format!("p99 ≤ {m:.2}×")),
            max_p99_ratio.map(|m| p99_ratio <= m),
        );
        for (st, side) in [(lib, "libmember"), (base, baseline_name)] {
            if st.errors > 0 || st.wrong > 0 {
                self.note(format!(
                    "{what} ({side}): {} error replies, {} wrong answers; first error: {}",
                    st.errors,
                    st.wrong,
                    st.first_error.as_deref().unwrap_or("-")
                ));
            }
        }
    }

    fn table(&self) -> String {
        let mut s = String::new();
        s.push_str("| figure | libmember | baseline | ratio | target | met? |\n");
        s.push_str("|---|---|---|---|---|---|\n");
        let mut section = "";
        for r in &self.rows {
            if r.section != section {
                section = r.section;
                let _ = writeln!(s, "| **{section}** | | | | | |");
            }
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                r.figure,
                r.lib,
                r.base,
                r.ratio.map_or("—".into(), |x| format!("{x:.3}×")),
                r.target,
                match r.met {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "—",
                }
            );
        }
        s
    }
}

fn rate(x: f64) -> String {
    let n = x.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(ch);
    }
    out + "/s"
}

fn lat(s: &Stats) -> String {
    format!("{:.3} / {:.3} ms", s.p50_ms, s.p99_ms)
}

fn thousands(n: u64) -> String {
    rate(n as f64).trim_end_matches("/s").to_string()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A horizontal bar chart: per load, a light p99 bar with the p50 bar drawn over it.
fn latency_svg(bars: &[(String, f64, f64, bool)], subtitle: &str) -> String {
    let (left, chart_w, row_h, top) = (330.0, 520.0, 30.0, 70.0);
    let width = left + chart_w + 90.0;
    let height = top + row_h * bars.len() as f64 + 60.0;
    let max = bars.iter().map(|b| b.2).fold(0.0, f64::max).max(1e-3);
    // A round axis maximum: 1, 2 or 5 × 10^k.
    let mag = 10f64.powf(max.log10().floor());
    let axis_max = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|m| *m >= max)
        .unwrap_or(10.0 * mag);
    let x = |v: f64| left + v / axis_max * chart_w;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="white"/>
<text x="20" y="24" font-size="16" font-weight="bold">libmember: request latency, p50 (dark) and p99 (light), ms</text>
<text x="20" y="44" fill="#555">{}</text>"##,
        xml_escape(subtitle)
    );
    for i in 0..=5 {
        let v = axis_max * i as f64 / 5.0;
        let xx = x(v);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            top + row_h * bars.len() as f64,
            top + row_h * bars.len() as f64 + 16.0,
            format_axis(v)
        );
    }
    for (i, (label, p50, p99, lib)) in bars.iter().enumerate() {
        let y = top + row_h * i as f64;
        let (dark, light) = if *lib {
            ("#d9480f", "#ffc9a8")
        } else {
            ("#1c7ed6", "#a5d8ff")
        };
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>
<rect x="{left}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{light}"/>
<rect x="{left}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{dark}"/>
<text x="{:.1}" y="{:.1}" fill="#333">{p50:.3} / {p99:.3}</text>"##,
            left - 8.0,
            y + row_h * 0.6,
            xml_escape(label),
            y + 4.0,
            (x(*p99) - left).max(1.0),
            row_h - 8.0,
            y + 9.0,
            (x(*p50) - left).max(1.0),
            row_h - 18.0,
            x(*p99) + 6.0,
            y + row_h * 0.6,
        );
    }
    let ly = top + row_h * bars.len() as f64 + 40.0;
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{:.1}" width="12" height="12" fill="#1c7ed6"/><text x="{:.1}" y="{ly:.1}">GET (baseline)</text>
<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="#d9480f"/><text x="{:.1}" y="{ly:.1}">MEMBER.EXISTS</text>
<text x="{:.1}" y="{ly:.1}" fill="#555">labels: p50 / p99 ms</text>
</svg>"##,
        ly - 10.0,
        left + 18.0,
        left + 140.0,
        ly - 10.0,
        left + 158.0,
        left + 280.0,
    );
    s
}

fn format_axis(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

// ---------------------------------------------------------------------------------------------
// machine

fn machine() -> Vec<(String, String)> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|r| r.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let nproc = thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or("unknown".into(), |kb| {
            format!("{:.1} GiB", kb as f64 / 1048576.0)
        });
    let vb = Command::new("valkey-benchmark")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    vec![
        ("nproc".into(), nproc.to_string()),
        ("CPU".into(), model),
        ("memory".into(), mem),
        ("valkey-benchmark".into(), vb),
    ]
}

/// (busy, total) clock ticks of all CPUs since boot, from /proc/stat.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 8 {
        return (0, 0);
    }
    // user nice system idle iowait irq softirq steal
    (v[0] + v[1] + v[2] + v[5] + v[6] + v[7], v.iter().sum())
}

/// Clock ticks used by this process and all its descendants (live ones, and the reaped ones
/// through their parents' cutime/cstime).
fn own_tree_ticks() -> u64 {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    let mut ticks: HashMap<u32, u64> = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // Fields after "(comm)": state ppid ... utime(14) stime cutime cstime (1-based).
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < 15 {
            continue;
        }
        let n = |i: usize| f[i - 3].parse::<u64>().unwrap_or(0);
        parent.insert(pid, n(4) as u32);
        ticks.insert(pid, n(14) + n(15) + n(16) + n(17));
    }
    let me = std::process::id();
    ticks
        .iter()
        .filter(|(pid, _)| {
            let mut p = **pid;
            for _ in 0..64 {
                if p == me {
                    return true;
                }
                match parent.get(&p) {
                    Some(&pp) if pp != 0 && pp != p => p = pp,
                    _ => return false,
                }
            }
            false
        })
        .map(|(_, t)| *t)
        .sum()
}

/// 1-minute load average.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// the benchmark

struct Bench {
    opts: Opts,
    db: support::TestDb,
    vk: support::Valkey,
    port: u16,
    /// Present items whose cache entries are warm: m1 ..= m<warm>.
    warm: u64,
    /// Next never-looked-up member for the cold path.
    cold_next: AtomicU64,
    rebuild_available: bool,
    /// Filter build observed at start-up (seconds, PINGs meanwhile), when MEMBER.REBUILD is
    /// not available.
    startup_build: Option<(f64, Stats)>,
    r: Report,
}

fn main() {
    let opts = Opts::parse();
    let module = check_module();
    let started = Instant::now();
    let cpu_before = (loadavg(), cpu_ticks(), own_tree_ticks());
    let mut b = Bench::setup(opts);
    for (name, section) in SECTIONS {
        if b.opts.runs(name) {
            section(&mut b);
        }
    }
    b.finish(&module, started.elapsed(), cpu_before);
}

/// The module the harness will load: target/release/deps/libmember.so beside this binary (or
/// MEMBER_MODULE). `cargo bench` does not build the cdylib, so it must exist and be at least as
/// new as the sources.
fn check_module() -> PathBuf {
    let module = support::module_path();
    progress(&format!("module: {}", module.display()));
    let overridden = std::env::var_os("MEMBER_MODULE").is_some();
    let Ok(meta) = std::fs::metadata(&module) else {
        eprintln!(
            "bench: {} not found: run `cargo build --release` first (`make bench` does)",
            module.display()
        );
        std::process::exit(2);
    };
    if overridden {
        return module;
    }
    if !module.components().any(|c| c.as_os_str() == "release") {
        progress("warning: not a release build of the module");
    }
    let newest_src = newest_mtime(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src"));
    if let (Ok(built), Some(src)) = (meta.modified(), newest_src) {
        if src > built {
            eprintln!(
                "bench: {} is older than src/: run `cargo build --release` first (`make bench` does)",
                module.display()
            );
            std::process::exit(2);
        }
    }
    module
}

fn newest_mtime(dir: &std::path::Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let m = if e.path().is_dir() {
            newest_mtime(&e.path())
        } else {
            e.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(m);
    }
    newest
}

impl Bench {
    fn extra(opts: &Opts) -> Vec<(&'static str, String)> {
        let mut v = vec![];
        if let Some(w) = opts.workers {
            v.push(("member.workers", w.to_string()));
        }
        v
    }

    fn start_valkey(db: &support::TestDb, opts: &Opts) -> support::Valkey {
        let extra = Self::extra(opts);
        let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        start_loaded(&db.url(), &extra)
    }

    fn create(c: &mut redis::Connection, n: u64) {
        let _: String = redis::cmd("MEMBER.CREATE")
            .arg(SET)
            .arg("ERROR")
            .arg(CONFIGURED_FPR)
            .arg("CAPACITY")
            .arg(n)
            .arg("CACHE-TTL")
            .arg(CACHE_TTL_S)
            .query(c)
            .expect("MEMBER.CREATE");
    }

    /// PostgreSQL, Valkey, N members in the table and in the filter, the application
    /// pattern's keys, warm caches.
    fn setup(opts: Opts) -> Bench {
        let n = opts.members;
        progress("starting PostgreSQL and valkey-server");
        let db = support::fresh_db();
        let mut vk = Self::start_valkey(&db, &opts);
        let mut c = vk.conn();
        Self::create(&mut c, n);

        progress(&format!("loading {} members with SQL", thousands(n)));
        let t0 = Instant::now();
        let mut pg = db.client();
        pg.batch_execute(&format!(
            "INSERT INTO {TABLE} (entity_id) SELECT 'm' || g FROM generate_series(1, {n}) g"
        ))
        .expect("load members");
        // Set hint bits and the visibility map now, so neither the filter build nor the COPY
        // baseline pays for the first read of fresh rows.
        pg.batch_execute(&format!("VACUUM (ANALYZE) {TABLE}"))
            .expect("vacuum");
        pg.batch_execute("CHECKPOINT").expect("checkpoint");
        progress(&format!("  loaded in {:.1} s", t0.elapsed().as_secs_f64()));

        let mut rebuild_available = true;
        let mut startup_build = None;
        match redis::cmd("MEMBER.REBUILD")
            .arg(SET)
            .arg("SYNC")
            .query::<i64>(&mut c)
        {
            Ok(rows) => progress(&format!("MEMBER.REBUILD SYNC loaded {rows} members")),
            Err(e) if is_unknown_command(&e) => {
                rebuild_available = false;
                progress("MEMBER.REBUILD is not in this build: building the filter on a fresh valkey-server instead");
                drop(c);
                drop(vk);
                let extra = Self::extra(&opts);
                let extra: Vec<(&str, &str)> =
                    extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
                vk = support::start_with(&db.url(), &extra);
                c = vk.conn();
                assert!(
                    wait_catalog_loaded(&mut c, Duration::from_secs(60)),
                    "catalog never loaded:\n{}",
                    vk.log()
                );
                // The build starts from the next housekeeping pass after the catalog load.
                let pinger = Pinger::start(vk.port());
                let done = support::wait_until(Duration::from_secs(1800), || {
                    let i = set_info_all(&mut c);
                    i.get("filter_complete").map(String::as_str) == Some("1")
                        && i.get("last_rebuild").map(String::as_str) == Some("ok")
                });
                let pings = pinger.finish();
                assert!(done, "the filter was never built:\n{}", vk.log());
                let info = set_info_all(&mut c);
                startup_build = Some((num(&info, "last_rebuild_s"), pings));
                Self::create(&mut c, n);
            }
            Err(e) => panic!("MEMBER.REBUILD {SET} SYNC: {e}"),
        }
        let info = set_info_all(&mut c);
        let items = num(&info, "filter_items") as u64;
        assert!(
            info.get("filter_complete").map(String::as_str) == Some("1")
                && items as f64 >= n as f64 * 0.99,
            "filter not built from the table: {info:?}"
        );

        let port = vk.port();
        let warm = 20_000.min(n / 10);
        let mut b = Bench {
            opts,
            db,
            vk,
            port,
            warm,
            cold_next: AtomicU64::new(n / 2 + 1),
            rebuild_available,
            startup_build,
            r: Report::default(),
        };
        b.load_app_pattern();
        b.warm_caches();
        b
    }

    /// The application-level pattern's state: the members in a Valkey SET, an empty recent
    /// set, and a present key for the bare GET.
    fn load_app_pattern(&mut self) {
        let n = self.opts.members;
        progress(&format!(
            "loading {} members into the Valkey SET {APP_SET}",
            thousands(n)
        ));
        let t0 = Instant::now();
        let mut c = self.vk.conn();
        let mut i = 1;
        while i <= n {
            let mut p = redis::pipe();
            for _ in 0..10 {
                if i > n {
                    break;
                }
                let end = (i + 999).min(n);
                let mut cmd = redis::cmd("SADD");
                cmd.arg(APP_SET);
                for k in i..=end {
                    cmd.arg(format!("m{k}"));
                }
                p.add_command(cmd).ignore();
                i = end + 1;
            }
            p.query::<()>(&mut c).expect("SADD");
        }
        let _: () = redis::cmd("SET")
            .arg(PRESENT_KEY)
            .arg("1")
            .query(&mut c)
            .unwrap();
        progress(&format!("  loaded in {:.1} s", t0.elapsed().as_secs_f64()));
    }

    /// Fills the module's cache for m1..=warm (one EXISTS each) and the application
    /// pattern's cache for the same items.
    fn warm_caches(&mut self) {
        progress(&format!(
            "warming the caches: {} present items",
            thousands(self.warm)
        ));
        let st = raw_total(self.port, self.warm, &|i: u64, buf: &mut Vec<u8>| {
            let item = format!("m{}", i + 1);
            push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
            Expect::Yes
        });
        assert!(
            st.errors == 0 && st.wrong == 0,
            "warming EXISTS failed: {st:?}"
        );
        let mut c = self.vk.conn();
        let mut p = redis::pipe();
        for i in 1..=self.warm {
            p.cmd("SET")
                .arg(format!("{APP_HIT}m{i}"))
                .arg("1")
                .arg("EX")
                .arg(CACHE_TTL_S)
                .ignore();
            if i % 1000 == 0 || i == self.warm {
                p.query::<()>(&mut c).expect("SET app cache");
                p = redis::pipe();
            }
        }
        let (a, path): (i64, String) = redis::cmd("MEMBER.EXPLAIN")
            .arg(SET)
            .arg("m1")
            .query(&mut c)
            .unwrap();
        assert_eq!((a, path.as_str()), (1, "cache-hit"), "cache not warm");
    }

    fn half(&self) -> Duration {
        Duration::from_secs_f64(self.opts.secs / 2.0)
    }

    // --- memory and false-positive rate ------------------------------------------------------

    fn memory(&mut self) {
        progress("memory and false-positive rate");
        let mut c = self.vk.conn();
        let info = set_info_all(&mut c);
        let bytes = num(&info, "filter_bytes");
        let items = num(&info, "filter_items");
        let bits = bytes * 8.0 / items;
        let set_bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(APP_SET)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut c)
            .unwrap_or(0);
        let set_bits = set_bytes as f64 * 8.0 / self.opts.members as f64;
        self.r.row(
            "Memory",
            "filter size per member at 1 % FPR (filter_bytes × 8 / filter_items)",
            format!("{bits:.2} bits ({:.2} B)", bits / 8.0),
            format!(
                "{set_bits:.0} bits ({:.1} B) (Valkey SET of the members)",
                set_bits / 8.0
            ),
            Some(bits / set_bits.max(1e-9)),
            "≤ 10 bits",
            Some(bits <= 10.0),
        );
        let filter_mem: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(format!("member:{SET}:bloom"))
            .query(&mut c)
            .unwrap_or(-1);
        self.r.note(format!(
            "filter: {} bits, {} hashes, {} items, {} bytes (MEMORY USAGE of the filter key: {} bytes), \
             fill {}, filter_fpr_est {}",
            info.get("filter_bits").map_or("?", |s| s.as_str()),
            info.get("filter_hashes").map_or("?", |s| s.as_str()),
            info.get("filter_items").map_or("?", |s| s.as_str()),
            info.get("filter_bytes").map_or("?", |s| s.as_str()),
            filter_mem,
            info.get("filter_fill").map_or("?", |s| s.as_str()),
            info.get("filter_fpr_est").map_or("?", |s| s.as_str()),
        ));

        // False positives: probes the filter did not reject (they went on to the database).
        let probes = self.opts.fpr_probes;
        let before = set_info_all(&mut c);
        let st = raw_total(self.port, probes, &|i: u64, buf: &mut Vec<u8>| {
            let item = format!("fp:{i}");
            push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
            Expect::No
        });
        let after = set_info_all(&mut c);
        let d = |k: &str| num(&after, k) - num(&before, k);
        let calls = d("exists_calls");
        let passed = calls - d("path_bloom_negative");
        let fpr = passed / calls.max(1.0);
        // The promise is what MEMBER.INFO estimates for the filter as it stands (issue 11);
        // the configured rate is only its ceiling.
        let promised = num(&before, "filter_fpr_est");
        let ratio = fpr / promised.max(1e-12);
        self.r.row(
            "Memory",
            format!(
                "false-positive rate over {} absent probes, vs MEMBER.INFO filter_fpr_est ({})",
                thousands(probes),
                before.get("filter_design").map_or("?", |s| s.as_str()),
            ),
            format!("{:.3} % ({} passed the filter)", fpr * 100.0, passed as u64),
            format!(
                "{:.3} % promised ({:.1} % configured)",
                promised * 100.0,
                CONFIGURED_FPR * 100.0
            ),
            Some(ratio),
            "0.85–1.15×",
            Some((0.85..=1.15).contains(&ratio)),
        );
        // Issue 11: half the false positives of the Bloom filter alone (1.005 % at 9.60 bits
        // a member, measured at 1 000 000 members) for the same memory or less.
        let vs_bloom = fpr / 0.01005;
        self.r.row(
            "Memory",
            "false-positive rate vs a Bloom filter alone at 9.60 bits a member",
            format!("{:.3} % at {bits:.2} bits", fpr * 100.0),
            "1.005 % at 9.60 bits".to_string(),
            Some(vs_bloom),
            "≤ 0.5× at ≤ 9.60 bits",
            Some(vs_bloom <= 0.5 && bits <= 9.60),
        );
        if st.errors > 0 || st.wrong > 0 || calls as u64 != probes {
            self.r.note(format!(
                "FPR probes: {} EXISTS counted for {probes} sent, {} error replies, {} wrong answers ({})",
                calls as u64,
                st.errors,
                st.wrong,
                st.first_error.as_deref().unwrap_or("-")
            ));
        }
    }

    // --- negative path: valkey-benchmark --------------------------------------------------

    fn negative_path(&mut self) {
        let port = self.port;
        let half = self.opts.secs / 2.0;
        let mut c = self.vk.conn();
        let errors_before = info_stat(&mut c, "stats", "total_error_replies");
        for pipeline in [16usize, 1] {
            progress(&format!(
                "negative path: EXISTS of absent items vs GET, 50 connections, pipeline {pipeline}"
            ));
            let (get, ex) = abba(
                || vb_timed(port, pipeline, half, None, &["GET", PRESENT_KEY]),
                || {
                    vb_timed(
                        port,
                        pipeline,
                        half,
                        Some(ABSENT_KEYSPACE),
                        &["MEMBER.EXISTS", SET, "absent:__rand_int__"],
                    )
                },
            );
            let what = if pipeline > 1 {
                format!("absent items, pipeline {pipeline}, 50 conns")
            } else {
                "absent items, no pipeline, 50 conns".to_string()
            };
            self.r.pair(
                "Negative path (valkey-benchmark)",
                &what,
                &ex,
                &get,
                Some(0.95),
                None,
                "GET of a present key",
            );
            let tag = if pipeline > 1 { "P16" } else { "P1" };
            self.r.bars.push((
                format!("negative, {tag}: GET"),
                get.p50_ms,
                get.p99_ms,
                false,
            ));
            self.r.bars.push((
                format!("negative, {tag}: EXISTS absent"),
                ex.p50_ms,
                ex.p99_ms,
                true,
            ));
        }
        // Diagnostic: the same load with one absent item the filter rejects, so no probe is a
        // false positive that waits for PostgreSQL (holding up the rest of its pipeline).
        let rejected = (0..)
            .map(|i| format!("absent:rejected{i}"))
            .find(|item| {
                let (_, path): (i64, String) = redis::cmd("MEMBER.EXPLAIN")
                    .arg(SET)
                    .arg(item)
                    .query(&mut c)
                    .expect("MEMBER.EXPLAIN");
                path == "bloom-negative"
            })
            .unwrap();
        progress(
            "negative path, diagnostic: one filter-rejected item (no false positives), pipeline 16",
        );
        let (get, ex) = abba(
            || vb_timed(port, 16, half, None, &["GET", PRESENT_KEY]),
            || vb_timed(port, 16, half, None, &["MEMBER.EXISTS", SET, &rejected]),
        );
        self.r.pair(
            "Negative path (valkey-benchmark)",
            "diagnostic: one filter-rejected item (no false positives), pipeline 16, 50 conns",
            &ex,
            &get,
            None,
            None,
            "GET of a present key",
        );
        // The same absent probes drawn from a pool of 100 000 items that recur: each false
        // positive waits for PostgreSQL once, then the fp-cache tier answers it.
        progress("negative path: absent items from a recurring pool of 100 000, pipeline 16");
        let before = set_info_all(&mut c);
        let (get, ex) = abba(
            || vb_timed(port, 16, half, None, &["GET", PRESENT_KEY]),
            || {
                vb_timed(
                    port,
                    16,
                    half,
                    Some(REPEATED_KEYSPACE),
                    &["MEMBER.EXISTS", SET, "absent:__rand_int__"],
                )
            },
        );
        self.r.pair(
            "Negative path (valkey-benchmark)",
            "absent items from a recurring pool of 100 000, pipeline 16, 50 conns",
            &ex,
            &get,
            Some(0.95),
            None,
            "GET of a present key",
        );
        let after = set_info_all(&mut c);
        let d = |k: &str| num(&after, k) - num(&before, k);
        self.r.note(format!(
            "recurring absent pool: {:.3} % of EXISTS answered by the fp-cache tier, {:.3} % waited for \
             PostgreSQL (first sight of a false positive); fp_cache_entries {}",
            100.0 * d("path_fp_cache") / d("exists_calls").max(1.0),
            100.0 * d("path_db_miss") / d("exists_calls").max(1.0),
            after.get("fp_cache_entries").map_or("?", |v| v.as_str()),
        ));
        let errors_after = info_stat(&mut c, "stats", "total_error_replies");
        if errors_before != errors_after {
            self.r.note(format!(
                "valkey-benchmark runs got error replies: total_error_replies {errors_before:?} → {errors_after:?}"
            ));
        }
    }

    // --- mixed workload ---------------------------------------------------------------------

    fn mixed(&mut self) {
        let port = self.port;
        let warm = self.warm;
        let half = self.half();
        let mut c = self.vk.conn();
        let before = set_info_all(&mut c);
        for pipeline in [16usize, 1] {
            progress(&format!(
                "mixed 95 % absent / 5 % present: EXISTS vs GET of the cache key, 50 connections, pipeline {pipeline}"
            ));
            let load = RawLoad {
                threads: 2,
                conns_per_thread: 25,
                pipeline,
                limit: Limit::Time(half),
            };
            let exists = |rng: &mut Rng, buf: &mut Vec<u8>| {
                let (item, present) = mixed_item(rng, warm);
                push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
                if present {
                    Expect::Yes
                } else {
                    Expect::No
                }
            };
            let get = |rng: &mut Rng, buf: &mut Vec<u8>| {
                let (item, present) = mixed_item(rng, warm);
                let key = format!("{HIT_PREFIX}{item}\0");
                push_cmd(buf, &[b"GET", key.as_bytes()]);
                if present {
                    Expect::Yes
                } else {
                    Expect::No
                }
            };
            let (g, e) = abba(
                || raw_load(port, &load, &get),
                || raw_load(port, &load, &exists),
            );
            let what = if pipeline > 1 {
                format!("mixed, pipeline {pipeline}, 50 conns")
            } else {
                "mixed, no pipeline, 50 conns".to_string()
            };
            self.r.pair(
                "Mixed 95 % absent / 5 % present, warm cache",
                &what,
                &e,
                &g,
                Some(0.95),
                Some(1.2),
                "GET of the same items' cache keys",
            );
            let tag = if pipeline > 1 { "P16" } else { "P1" };
            self.r
                .bars
                .push((format!("mixed, {tag}: GET"), g.p50_ms, g.p99_ms, false));
            self.r
                .bars
                .push((format!("mixed, {tag}: EXISTS"), e.p50_ms, e.p99_ms, true));
        }
        let after = set_info_all(&mut c);
        let d = |k: &str| num(&after, k) - num(&before, k);
        self.r.note(format!(
            "mixed EXISTS paths: {:.2} % bloom-negative, {:.2} % cache-hit, {:.2} % db-miss (false positives, \
             each waiting for PostgreSQL and holding up the rest of its pipeline), {:.3} % db-hit",
            100.0 * d("path_bloom_negative") / d("exists_calls").max(1.0),
            100.0 * d("path_cache_hit") / d("exists_calls").max(1.0),
            100.0 * d("path_db_miss") / d("exists_calls").max(1.0),
            100.0 * d("path_db_hit") / d("exists_calls").max(1.0),
        ));

        // One lookup per call, 16 threads with a connection each: the module vs the
        // application-level pattern vs PostgreSQL alone.
        const THREADS: usize = 16;
        progress("mixed, 16 threads: EXISTS vs the application-level pattern vs a PostgreSQL point query");
        let url = self.db.url();
        let exists = || {
            thread_load(
                THREADS,
                half,
                |_| vk_conn(port),
                |c, rng| {
                    let (item, present) = mixed_item(rng, warm);
                    let v: i64 = redis::cmd("MEMBER.EXISTS")
                        .arg(SET)
                        .arg(&item)
                        .query(c)
                        .map_err(|e| e.to_string())?;
                    Ok((v == 1) == present)
                },
            )
        };
        let app = || {
            thread_load(
                THREADS,
                half,
                |_| {
                    let mut pg = pg_connect(&url);
                    let st = pg.prepare(POINT_QUERY).unwrap();
                    (vk_conn(port), pg, st)
                },
                |(vk, pg, st), rng| {
                    let (item, present) = mixed_item(rng, warm);
                    app_lookup(vk, pg, st, &item).map(|a| a == present)
                },
            )
        };
        let direct = || {
            thread_load(
                THREADS,
                half,
                |_| {
                    let mut pg = pg_connect(&url);
                    let st = pg.prepare(POINT_QUERY).unwrap();
                    (pg, st)
                },
                |(pg, st), rng| {
                    let (item, present) = mixed_item(rng, warm);
                    let row = pg.query_opt(&*st, &[&item]).map_err(|e| e.to_string())?;
                    Ok(row.is_some() == present)
                },
            )
        };
        let (e, a) = abba(&exists, &app);
        let (e2, p) = abba(&exists, &direct);
        let e = Stats::pool(&[e, e2]);
        let section = "Mixed 95 % absent / 5 % present, warm cache";
        self.r.pair(
            section,
            "mixed, 16 threads × 1 conn: vs app pattern",
            &e,
            &a,
            None,
            None,
            "SISMEMBER+SISMEMBER+GET pipeline, SELECT+SET on a miss",
        );
        self.r.pair(
            section,
            "mixed, 16 threads × 1 conn: vs PostgreSQL",
            &e,
            &p,
            None,
            None,
            "prepared point query per lookup",
        );
    }

    // --- cold path --------------------------------------------------------------------------

    fn cold_path(&mut self) {
        const CLIENTS: usize = 64;
        progress(
            "cold path: EXISTS of present, uncached items vs pgbench (prepared point query), 64 clients",
        );
        let port = self.port;
        let half = self.half();
        let n = self.opts.members;
        let cold_next = &self.cold_next;
        let mut c = self.vk.conn();
        let before = set_info_all(&mut c);
        // Both sides use an event-loop client (2 threads), so the figure compares what the
        // servers spend per lookup, not 64 client threads fighting over two CPUs.
        let load = RawLoad {
            threads: 2,
            conns_per_thread: CLIENTS / 2,
            pipeline: 1,
            limit: Limit::Time(half),
        };
        let gen = |_: &mut Rng, buf: &mut Vec<u8>| {
            // Members from n/2 on were never looked up; wrap (warm) only if a run ever gets
            // through half the set.
            let k = cold_next.fetch_add(1, Ordering::Relaxed);
            let item = format!("m{}", (k - 1) % n + 1);
            push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
            Expect::Yes
        };
        let db = &self.db;
        let (e, p) = abba(
            || raw_load(port, &load, &gen),
            || pgbench(db, n, CLIENTS, half),
        );
        self.r.pair(
            "Cold path (every lookup needs PostgreSQL), 64 clients",
            "present, uncached items",
            &e,
            &p,
            Some(2.0),
            None,
            "pgbench -M prepared -c 64 -j 2: one point query per lookup",
        );
        // The ceiling on this machine: the same generator and connections running GET, which
        // does no database work at all, against the same pgbench.
        let get = |_: &mut Rng, buf: &mut Vec<u8>| {
            push_cmd(buf, &[b"GET", PRESENT_KEY.as_bytes()]);
            Expect::Yes
        };
        let (g, p2) = abba(
            || raw_load(port, &load, &get),
            || pgbench(db, n, CLIENTS, half),
        );
        self.r.pair(
            "Cold path (every lookup needs PostgreSQL), 64 clients",
            "diagnostic: ceiling, GET of a present key with the same 64 connections",
            &g,
            &p2,
            None,
            None,
            "pgbench -M prepared -c 64 -j 2: one point query per lookup",
        );
        let after = set_info_all(&mut c);
        let d = |k: &str| num(&after, k) - num(&before, k);
        let used = self.cold_next.load(Ordering::Relaxed) - (n / 2 + 1);
        self.r.note(format!(
            "cold EXISTS: {:.1} % of lookups answered by the database (db-hit), {:.1} % from the cache{}; member.workers = {}",
            100.0 * d("path_db_hit") / d("exists_calls").max(1.0),
            100.0 * d("path_cache_hit") / d("exists_calls").max(1.0),
            if used > n / 2 { " (the cold range wrapped: some items were warm)" } else { "" },
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("member.workers")
                .query::<Vec<String>>(&mut c)
                .ok()
                .and_then(|v| v.get(1).cloned())
                .unwrap_or_else(|| "?".into()),
        ));
    }

    // --- rebuild ------------------------------------------------------------------------------

    /// COPY of the active rows, read and discarded: (seconds, bytes, PINGs meanwhile).
    fn copy_baseline(&self) -> (f64, u64, Stats) {
        let mut pg = pg_connect(&self.db.url());
        let pinger = Pinger::start(self.port);
        let t0 = Instant::now();
        let mut r = pg.copy_out(COPY_SQL).expect("COPY");
        let mut bytes = 0u64;
        loop {
            let n = r.fill_buf().expect("COPY read").len();
            if n == 0 {
                break;
            }
            r.consume(n);
            bytes += n as u64;
        }
        drop(r);
        let secs = t0.elapsed().as_secs_f64();
        (secs, bytes, pinger.finish())
    }

    fn rebuild(&mut self) {
        progress("rebuild vs COPY");
        const SECTION: &str = "Rebuild";
        let port = self.port;
        let timed_rebuild = || -> (f64, Stats) {
            let mut c = vk_conn(port);
            let pinger = Pinger::start(port);
            let t0 = Instant::now();
            let rows: i64 = redis::cmd("MEMBER.REBUILD")
                .arg(SET)
                .arg("SYNC")
                .query(&mut c)
                .expect("MEMBER.REBUILD SYNC");
            let secs = t0.elapsed().as_secs_f64();
            assert!(rows > 0, "MEMBER.REBUILD SYNC loaded {rows} rows");
            (secs, pinger.finish())
        };
        let (c1, bytes, cp1) = self.copy_baseline();
        let (lib_secs, lib_ping, label) = if self.rebuild_available {
            let (r1, p1) = timed_rebuild();
            let (r2, p2) = timed_rebuild();
            (
                (r1 + r2) / 2.0,
                Stats::pool(&[p1, p2]),
                "MEMBER.REBUILD SYNC".to_string(),
            )
        } else {
            let (s, p) = self.startup_build.clone().expect("start-up build measured");
            self.r.note(
                "MEMBER.REBUILD is not in this build (\"unknown command\"): the rebuild rows show the \
                 filter build a fresh valkey-server runs in the background at start-up (same rebuild \
                 code; time = MEMBER.INFO last_rebuild_s, measured inside the module; PINGs during \
                 it include the start-up)",
            );
            (
                s,
                p,
                "start-up filter build (no MEMBER.REBUILD)".to_string(),
            )
        };
        let (c2, _, cp2) = self.copy_baseline();
        // The machine's own noise floor: PINGs with nothing else running.
        let pinger = Pinger::start(self.port);
        thread::sleep(Duration::from_secs_f64(lib_secs.clamp(1.0, 5.0)));
        let idle_ping = pinger.finish();
        let copy_secs = (c1 + c2) / 2.0;
        let copy_ping = Stats::pool(&[cp1, cp2]);
        let ratio = lib_secs / copy_secs;
        self.r.row(
            SECTION,
            format!("{label}: seconds"),
            format!("{lib_secs:.3} s"),
            format!(
                "{copy_secs:.3} s (COPY of {:.1} MB, read and discarded)",
                bytes as f64 / 1e6
            ),
            Some(ratio),
            "≤ 1.30×",
            Some(ratio <= 1.3),
        );
        let ms = lib_ping.max_ms;
        self.r.row(
            SECTION,
            format!("{label}: worst PING latency of another client"),
            format!(
                "{ms:.2} ms (p99 {:.3} ms; {} of {} PINGs > 2 ms)",
                lib_ping.p99_ms, lib_ping.over_2ms, lib_ping.ops
            ),
            format!(
                "{:.2} ms during the COPY baseline (p99 {:.3} ms; {} of {} > 2 ms); \
                 {:.2} ms with nothing else running ({} of {} > 2 ms)",
                copy_ping.max_ms,
                copy_ping.p99_ms,
                copy_ping.over_2ms,
                copy_ping.ops,
                idle_ping.max_ms,
                idle_ping.over_2ms,
                idle_ping.ops
            ),
            Some(ms / copy_ping.max_ms.max(1e-9)),
            "≤ 2 ms",
            Some(ms <= 2.0),
        );
        // What the rebuild itself costs the main thread, as the module logs it: the swap is
        // the only step of a rebuild that runs there. Unlike a PING's round trip, this does
        // not include the CPU scheduling of two shared cores.
        let swaps: Vec<f64> = self
            .vk
            .log()
            .lines()
            .filter_map(|l| l.split("held the main thread ").nth(1))
            .filter_map(|rest| rest.trim().trim_end_matches("ms").trim().parse().ok())
            .collect();
        if let Some(worst) = swaps.iter().copied().reduce(f64::max) {
            self.r.row(
                SECTION,
                format!(
                    "{label}: main-thread time of the swap (server log, worst of {})",
                    swaps.len()
                ),
                format!("{worst:.3} ms"),
                "—",
                None,
                "≤ 2 ms",
                Some(worst <= 2.0),
            );
        }
    }

    // --- writes ------------------------------------------------------------------------------

    fn adds(&mut self) {
        const THREADS: usize = 64;
        progress("ADD vs single-row INSERT, 64 clients");
        let port = self.port;
        let half = self.half();
        let url = self.db.url();
        let seq = AtomicU64::new(0);
        let add = || {
            thread_load(
                THREADS,
                half,
                |_| vk_conn(port),
                |c, _| {
                    let item = format!("add:{}", seq.fetch_add(1, Ordering::Relaxed));
                    let v: i64 = redis::cmd("MEMBER.ADD")
                        .arg(SET)
                        .arg(&item)
                        .query(c)
                        .map_err(|e| e.to_string())?;
                    Ok(v == 1)
                },
            )
        };
        let insert = || {
            thread_load(
                THREADS,
                half,
                |_| {
                    let mut pg = pg_connect(&url);
                    let st = pg
                        .prepare(&format!(
                            "INSERT INTO {TABLE} (entity_id) VALUES ($1) ON CONFLICT DO NOTHING"
                        ))
                        .unwrap();
                    (pg, st)
                },
                |(pg, st), _| {
                    let item = format!("ins:{}", seq.fetch_add(1, Ordering::Relaxed));
                    let n = pg.execute(&*st, &[&item]).map_err(|e| e.to_string())?;
                    Ok(n == 1)
                },
            )
        };
        let (a, i) = abba(&add, &insert);
        self.r.pair(
            "Writes, 64 clients",
            "MEMBER.ADD of new items",
            &a,
            &i,
            None,
            None,
            "INSERT … ON CONFLICT DO NOTHING, 64 connections",
        );
    }

    // --- output --------------------------------------------------------------------------------

    fn finish(
        mut self,
        module: &std::path::Path,
        took: Duration,
        (load_before, (busy0, total0), own0): (f64, (u64, u64), u64),
    ) {
        let (busy1, total1) = cpu_ticks();
        let own = own_tree_ticks().saturating_sub(own0);
        let span = total1.saturating_sub(total0).max(1) as f64;
        let others = busy1.saturating_sub(busy0).saturating_sub(own) as f64 / span;
        if others > 0.05 {
            self.r.note(format!(
                "other processes used {:.0} % of the CPUs during this run: the figures are noisier \
                 than on an idle machine (both sides of each ratio were exposed alike, A B B A)",
                others * 100.0
            ));
        }
        let mut c = self.vk.conn();
        let valkey = info_stat(&mut c, "server", "valkey_version")
            .or_else(|| info_stat(&mut c, "server", "redis_version"))
            .unwrap_or_else(|| "?".into());
        let mut pg = self.db.client();
        let pg_version: String = pg
            .query_one("SELECT version()", &[])
            .map(|r| r.get(0))
            .unwrap_or_else(|_| "?".into());
        let workers = redis::cmd("CONFIG")
            .arg("GET")
            .arg("member.workers")
            .query::<Vec<String>>(&mut c)
            .ok()
            .and_then(|v| v.get(1).cloned())
            .unwrap_or_else(|| "?".into());
        let errors = info_stat(&mut c, "member", "member_db_errors").unwrap_or_default();
        let timeouts = info_stat(&mut c, "member", "member_db_timeouts").unwrap_or_default();
        if errors != "0" || timeouts != "0" {
            self.r.note(format!(
                "module database errors: {errors}, timeouts: {timeouts}"
            ));
        }

        let mut head = String::new();
        let _ = writeln!(head, "# libmember benchmark\n");
        let _ = writeln!(
            head,
            "{} members (`{TABLE}`, 1 % FPR, CACHE-TTL {CACHE_TTL_S} s), member.workers = {workers}, \
             {:.1} s of load per side of each comparison (two runs, A B B A), whole run {:.0} s, {}.\n",
            thousands(self.opts.members),
            self.opts.secs,
            took.as_secs_f64(),
            utc_now()
        );
        let _ = writeln!(head, "Machine (every figure from the same run on the same servers; load generators share the CPU with the servers):\n");
        for (k, v) in machine() {
            let _ = writeln!(head, "- {k}: {v}");
        }
        let _ = writeln!(
            head,
            "- other load: 1-minute load average {load_before:.2} before the run; processes \
             outside the bench used {:.0} % of all CPUs during it (the bench and its servers: {:.0} %)",
            others * 100.0,
            own as f64 / span * 100.0
        );
        let _ = writeln!(head, "- Valkey: {valkey}");
        let _ = writeln!(head, "- PostgreSQL: {pg_version}");
        let _ = writeln!(
            head,
            "- module: `{}`\n",
            module
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap_or(module)
                .display()
        );
        let table = self.r.table();
        let mut notes = String::from(
            "\nHow each figure is measured:\n\n\
             - Negative path: `valkey-benchmark -c 50 [-P 16] -r 1000000000 MEMBER.EXISTS bench absent:__rand_int__` \
             vs `GET bench:present`; latency is per request (a pipelined batch's latency for each of its requests). \
             The recurring pool is the same command with `-r 100000`: 100 000 absent items checked again and again.\n\
             - Mixed: a Rust RESP generator, 2 threads × 25 non-blocking connections, each with one batch in flight \
             (like valkey-benchmark); 95 % `absent:<random>`, \
             5 % one of the first 20 000 members, whose cache entries were filled first. The GET baseline reads the \
             same items' cache keys (`member:bench:hit:<item>\\0`: 5 % hits, 95 % nil). The 16-thread rows use the \
             `redis` crate for both MEMBER.EXISTS and the application pattern.\n\
             - Cold path: items from the second half of the set, each looked up once (never cached), sent by the RESP \
             generator (2 threads × 32 connections, one request in flight each), vs `pgbench -n -M prepared -c 64 -j 2` \
             running `SELECT 1 FROM member_bench WHERE entity_id = 'm' || :id AND scope = ''` for random members \
             (latency from pgbench's per-transaction log).\n\
             - False-positive rate: `exists_calls − path_bloom_negative` over the probes, from MEMBER.INFO before/after.\n\
             - Latency: about 1 % of absent probes pass the filter and wait for PostgreSQL, so the p99 of a \
             mostly-absent load sits at the edge of that slow tail (and, pipelined, a false positive holds up its \
             whole batch).\n\
             - Rebuild: client-side time of MEMBER.REBUILD SYNC vs the same COPY through the postgres crate's \
             `copy_out`, read and discarded; a separate thread PINGs in a loop and keeps its worst latency.\n\
             - Many items per call: `valkey-benchmark -c 50 -r <pool>` running `MEMBER.MEXISTS bench ITEMS` with 100 \
             `absent:__rand_int__` items (each drawn on its own), items/s = calls/s × 100, vs `MEMBER.EXISTS bench \
             absent:__rand_int__` with `-P 100` and vs `MGET` of 100 such keys; MADD of 100 `madd:__rand_int__` vs \
             `MEMBER.ADD` with `-P 100`, 100 000 new items per run.\n\
             - Cluster: 3 primaries (no replicas) with the same set on a database of their own; per node, the same \
             valkey-benchmark / RESP generator command lines sent to one primary and to the standalone node, every \
             item tagged `{<tag>}` with a slot that primary owns (no redirects); memory is MEMBER.INFO \
             `filter_bytes` summed over the primaries.\n",
        );
        if !self.r.notes.is_empty() {
            notes.push_str("\nObservations from this run:\n\n");
            for n in &self.r.notes {
                let _ = writeln!(notes, "- {n}");
            }
        }
        let doc = format!("{head}{table}{notes}");
        println!("\n{doc}");
        if self.opts.only.is_some() {
            progress(
                "partial run (--only): bench/results.md and bench/latency.svg left as they were",
            );
            return;
        }

        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench");
        std::fs::create_dir_all(&dir).expect("create bench/");
        std::fs::write(dir.join("results.md"), &doc).expect("write bench/results.md");
        let svg = latency_svg(
            &self.r.bars,
            &format!(
                "{} members, 50 connections, {} CPUs; negative = absent items, mixed = 95 % absent / 5 % present (warm cache)",
                thousands(self.opts.members),
                thread::available_parallelism().map_or(0, |n| n.get())
            ),
        );
        std::fs::write(dir.join("latency.svg"), svg).expect("write bench/latency.svg");
        progress(&format!(
            "wrote {} and {}",
            dir.join("results.md").display(),
            dir.join("latency.svg").display()
        ));
    }
}

/// The application-level pattern, as a user would write it with plain Valkey commands and SQL:
/// one pipeline with the gate set, the recent set and the cache key; SELECT on a miss, then
/// fill the cache.
fn app_lookup(
    vk: &mut redis::Connection,
    pg: &mut postgres::Client,
    st: &postgres::Statement,
    item: &str,
) -> Result<bool, String> {
    let key = format!("{APP_HIT}{item}");
    let (gate, recent, cached): (bool, bool, Option<Vec<u8>>) = redis::pipe()
        .cmd("SISMEMBER")
        .arg(APP_SET)
        .arg(item)
        .cmd("SISMEMBER")
        .arg(APP_RECENT)
        .arg(item)
        .cmd("GET")
        .arg(&key)
        .query(vk)
        .map_err(|e| e.to_string())?;
    if !gate && !recent {
        return Ok(false);
    }
    if cached.is_some() {
        return Ok(true);
    }
    let found = pg
        .query_opt(st, &[&item])
        .map_err(|e| e.to_string())?
        .is_some();
    if found {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("1")
            .arg("EX")
            .arg(CACHE_TTL_S)
            .query(vk)
            .map_err(|e| e.to_string())?;
    }
    Ok(found)
}
