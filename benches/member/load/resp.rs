//! Load generator 2: raw RESP over many non-blocking connections per thread, pipelined, each
//! reply checked against what the generator knows to be true.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::*;

/// What the generator knows about the answer to a command.
#[derive(Clone, Copy)]
pub(crate) enum Expect {
    /// `:1` or a bulk string.
    Yes,
    /// `:0` or nil.
    No,
}

pub(crate) enum Reply {
    Int(i64),
    Nil,
    Bulk,
    Simple,
    Array,
    Error(String),
}

pub(crate) fn push_cmd(buf: &mut Vec<u8>, args: &[&[u8]]) {
    let _ = write!(buf, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(buf, "${}\r\n", a.len());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

pub(crate) fn bad_reply(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Parses one reply from the front of `b`: Some((reply, bytes used)), or None if `b` does not
/// hold a whole reply yet.
pub(crate) fn parse_reply(b: &[u8]) -> io::Result<Option<(Reply, usize)>> {
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
pub(crate) struct RawConn {
    pub(crate) s: TcpStream,
    pub(crate) rbuf: Vec<u8>,
    pub(crate) rpos: usize,
    pub(crate) wbuf: Vec<u8>,
    pub(crate) wpos: usize,
    pub(crate) expects: Vec<Expect>,
    pub(crate) answered: usize,
    pub(crate) sent_at: Instant,
    pub(crate) busy: bool,
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

pub(crate) enum Limit {
    Time(Duration),
    /// Exactly this many commands across all connections.
    Total(u64),
}

pub(crate) struct RawLoad {
    pub(crate) threads: usize,
    pub(crate) conns_per_thread: usize,
    pub(crate) pipeline: usize,
    pub(crate) limit: Limit,
}

/// Per-thread tallies of the RESP generator.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) ops: u64,
    pub(crate) errors: u64,
    pub(crate) wrong: u64,
    pub(crate) first: Option<String>,
    pub(crate) lat: Vec<u64>,
}

/// Drives `threads × conns_per_thread` non-blocking connections, each with one batch of
/// `pipeline` commands in flight: as soon as a connection has all replies of its batch, it
/// sends the next one (like valkey-benchmark; a slow reply holds up only its own connection).
/// Latency is per batch, from its write to its last reply. `gen(rng, buf)` appends a command
/// to `buf` and says what its answer must be.
pub(crate) fn raw_load<G>(port: u16, load: &RawLoad, gen: &G) -> Stats
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
pub(crate) fn raw_total<G>(port: u16, total: u64, gen: &G) -> Stats
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
