//! Small client helpers: connections to Valkey and PostgreSQL, MEMBER.INFO and INFO fields, and
//! a PING loop that measures what an operation costs every other client.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::*;

pub(crate) fn vk_conn(port: u16) -> redis::Connection {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let con = c
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("connect to valkey");
    con.set_read_timeout(Some(Duration::from_secs(600)))
        .unwrap();
    con
}

pub(crate) fn set_info_all(c: &mut redis::Connection) -> HashMap<String, String> {
    let v: Vec<String> = redis::cmd("MEMBER.NODEINFO")
        .arg(SET)
        .query(c)
        .expect("MEMBER.NODEINFO");
    v.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect()
}

pub(crate) fn num(info: &HashMap<String, String>, k: &str) -> f64 {
    info.get(k)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("MEMBER.INFO has no numeric {k}: {info:?}"))
}

pub(crate) fn info_stat(c: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(c).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|r| r.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// A counter of `INFO member` (`member_…`), 0 when absent.
pub(crate) fn member_counter(c: &mut redis::Connection, f: &str) -> f64 {
    info_stat(c, "member", f)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A config's value (`CONFIG GET`), if the server has it.
pub(crate) fn config_value(c: &mut redis::Connection, name: &str) -> Option<String> {
    redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query::<Vec<String>>(c)
        .ok()
        .and_then(|v| v.get(1).cloned())
}

pub(crate) fn pg_connect(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect to postgres")
}

/// A PostgreSQL connection with `POINT_QUERY` prepared on it (one per load thread).
pub(crate) fn pg_point_query(url: &str) -> (postgres::Client, postgres::Statement) {
    let mut pg = pg_connect(url);
    let st = pg
        .prepare(crate::POINT_QUERY)
        .expect("prepare the point query");
    (pg, st)
}

/// A thread that PINGs in a loop on its own connection and keeps the worst latency.
pub(crate) struct Pinger {
    pub(crate) stop: std::sync::Arc<AtomicBool>,
    pub(crate) handle: thread::JoinHandle<Stats>,
}

impl Pinger {
    pub(crate) fn start(port: u16) -> Pinger {
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
    pub(crate) fn finish(self) -> Stats {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("pinger panicked")
    }
}

pub(crate) fn is_unknown_command(e: &redis::RedisError) -> bool {
    e.to_string()
        .to_ascii_lowercase()
        .contains("unknown command")
}
