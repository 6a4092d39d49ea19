//! The world a chaos run breaks (PostgreSQL, the proxy in front of it, a primary and a replica
//! with AOF on) and the faults: each one does its damage, waits as long as it lasts and heals.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use redis::Connection;

use super::checker::Switchovers;
use super::history::{Fault, Kind, Op, Outcome};
use super::Rng;
use crate::support::failover::Standby;
use crate::support::member::{cmd, set_info, start_loaded};
use crate::support::proxy::{Mode, Proxy};
use crate::support::{wait_until, OwnPg, Valkey};

/// Every fault the schedule knows. `demote`: a switchover without a restart (what Sentinel
/// does to an old primary that comes back, or an operator's `REPLICAOF`): the replica is
/// promoted, clients move to it, and the old primary, filters and all in memory, becomes its
/// replica while readers keep asking it.
pub const ALL: [&str; 13] = [
    "pg-restart",
    "pg-terminate",
    "proxy-delay",
    "proxy-cut",
    "proxy-refuse",
    "proxy-stall",
    "rebuild",
    "valkey-kill9",
    "old-filter",
    "lost-filter",
    "pg-url",
    "failover",
    "demote",
];

/// The faults only `make chaos` runs: a base backup and a promotion take seconds, more than
/// the short run of `make test` gives each fault. `pg-promote-behind`: PostgreSQL fails over
/// to a standby that was behind (docs/failover.md). `pg-restore-cold`: PostgreSQL is put back
/// from a cold copy of its data directory taken moments before (a storage snapshot restored:
/// same system identifier, same timeline, an older state). Both take back what was committed
/// meanwhile ([`taken_back`]).
pub const LONG_ONLY: [&str; 2] = ["pg-promote-behind", "pg-restore-cold"];

/// PostgreSQL, the proxy, two servers (one primary, one replica) and the port clients use.
pub struct World {
    pub pg: OwnPg,
    /// A streaming standby of `pg` for the next `pg-promote-behind` (made on first use).
    standby: Option<Standby>,
    pub proxy: Proxy,
    pub nodes: Vec<Valkey>,
    pub primary: usize,
    /// The port every client sends its next command to: the primary's.
    pub target: Arc<AtomicU16>,
    /// The port replica readers send theirs to: the other node's.
    pub replica_target: Arc<AtomicU16>,
}

/// Each chaos set's CACHE-TTL: how long a replica whose link is down or behind may still
/// answer 1 from a cached confirmation of an item deleted since (docs/contract.md, Replicas).
pub const CACHE_TTL_S: u64 = 2;

/// The replica staleness bound for the chaos nodes' settings (docs/replicas.md):
/// `sync-interval-ms` (the default, 1 s) + `db-timeout-ms` + 1 s, plus the 100 ms between two
/// looks and a little for a busy main thread.
pub fn replica_lag_bound_ms(db_timeout_ms: u64) -> u64 {
    1000 + db_timeout_ms + 1000 + 300
}

/// Configs for both servers: AOF with fsync on every write, the module through the proxy.
fn node_configs(timeout: &str) -> Vec<(&'static str, String)> {
    vec![
        ("appendonly", "yes".into()),
        ("appendfsync", "always".into()),
        ("member.db-timeout-ms", timeout.into()),
    ]
}

pub fn pg_url(port: u16) -> String {
    format!("host=127.0.0.1 port={port} user=postgres dbname=postgres")
}

impl World {
    /// Starts everything and creates `sets` on the primary; returns once the replica has them.
    pub fn start(sets: &[String], db_timeout_ms: u64) -> World {
        let pg = OwnPg::start_new();
        // The harness runs PostgreSQL with synchronous_commit=off, which loses the last
        // acknowledged commits in an immediate shutdown: the truth itself would forget writes.
        // Every session of the module's role commits durably here (a role setting wins over the
        // command line).
        pg.client()
            .batch_execute("ALTER ROLE postgres SET synchronous_commit = on")
            .expect("ALTER ROLE");
        let proxy = Proxy::start(pg.port());
        let url = pg_url(proxy.port());
        let t = db_timeout_ms.to_string();
        let cfg = node_configs(&t);
        let cfg: Vec<(&str, &str)> = cfg.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let a = start_loaded(&url, &cfg);
        let b = start_loaded(&url, &cfg);
        let mut c = a.conn();
        for s in sets {
            // RECENT-TTL 1: the marks are a safety net that would hide other faults for 10 s.
            let ttl = CACHE_TTL_S.to_string();
            let v = cmd(
                &mut c,
                &[
                    "MEMBER.CREATE",
                    s,
                    "CAPACITY",
                    "20000",
                    "RECENT-TTL",
                    "1",
                    "CACHE-TTL",
                    &ttl,
                ],
            );
            assert!(v.is_ok(), "CREATE {s}: {v:?}\n{}", a.log());
        }
        let target = Arc::new(AtomicU16::new(a.port()));
        let replica_target = Arc::new(AtomicU16::new(b.port()));
        let mut w = World {
            pg,
            standby: None,
            proxy,
            nodes: vec![a, b],
            primary: 0,
            target,
            replica_target,
        };
        w.make_replica(1);
        let mut rc = w.nodes[1].conn();
        for s in sets {
            assert!(
                wait_until(Duration::from_secs(30), || set_info(
                    &mut rc,
                    s,
                    "filter_complete"
                )
                .as_deref()
                    == Ok("1")),
                "the replica never got set {s}\n{}",
                w.nodes[1].log()
            );
        }
        w
    }

    pub fn replica(&self) -> usize {
        1 - self.primary
    }

    pub fn primary_conn(&self) -> Connection {
        self.nodes[self.primary].conn()
    }

    fn make_replica(&mut self, i: usize) {
        let p = self.nodes[1 - i].port().to_string();
        let mut c = self.nodes[i].conn();
        let v = cmd(&mut c, &["REPLICAOF", "127.0.0.1", &p]);
        assert!(v.is_ok(), "REPLICAOF: {v:?}");
    }

    /// Runs one fault of kind `kind`; blocks while the fault lasts. `Ok` says what was done,
    /// `Err` why nothing was (a command that failed, nothing there to break): the run counts
    /// only the first as injected.
    pub fn inject(&mut self, kind: &str, rng: &mut Rng, sets: &[String]) -> Result<String, String> {
        let done = match kind {
            "pg-restart" => {
                let immediate = rng.below(2) == 0;
                if immediate {
                    self.pg.kill();
                } else {
                    self.pg.stop();
                }
                let down = 200 + rng.below(1200);
                thread::sleep(Duration::from_millis(down));
                self.pg.start();
                format!(
                    "{} shutdown, down {down} ms",
                    if immediate { "immediate" } else { "fast" }
                )
            }
            "pg-terminate" => {
                let n = self.terminate_backends()?;
                if n == 0 {
                    return Err("no module backend to terminate".into());
                }
                format!("terminated {n} module backends")
            }
            "proxy-delay" => {
                let ms = 50 + rng.below(1200);
                let lasts = 500 + rng.below(2500);
                self.proxy.set(Mode::Delay(ms));
                thread::sleep(Duration::from_millis(lasts));
                self.proxy.set(Mode::Pass);
                format!("{ms} ms per chunk for {lasts} ms")
            }
            "proxy-cut" => match self.proxy.cut() {
                0 => return Err("no connection to cut".into()),
                n => format!("cut {n} connections"),
            },
            "proxy-refuse" => {
                let lasts = 300 + rng.below(2000);
                self.proxy.set(Mode::Refuse);
                let n = self.proxy.cut();
                thread::sleep(Duration::from_millis(lasts));
                self.proxy.set(Mode::Pass);
                format!("cut {n}, refused new connections for {lasts} ms")
            }
            "proxy-stall" => {
                let lasts = 300 + rng.below(2500);
                let cut = rng.below(2) == 0;
                self.proxy.set(Mode::StallExisting);
                thread::sleep(Duration::from_millis(lasts));
                let n = if cut { self.proxy.cut() } else { 0 };
                self.proxy.set(Mode::Pass);
                if cut {
                    format!("stalled open connections {lasts} ms, then cut {n}")
                } else {
                    format!("stalled open connections {lasts} ms, then released")
                }
            }
            "rebuild" => {
                let s = &sets[rng.below(sets.len() as u64) as usize];
                let sync = rng.below(2) == 0;
                let mut c = self.primary_conn();
                let mut args = vec!["MEMBER.REBUILD", s.as_str()];
                if sync {
                    args.push("SYNC");
                }
                let r = cmd(&mut c, &args);
                ok_or(&r, format!("{} -> {}", args.join(" "), short(&r)))?
            }
            "valkey-kill9" => {
                let p = self.primary;
                self.nodes[p].kill9();
                thread::sleep(Duration::from_millis(rng.below(500)));
                self.nodes[p].restart();
                format!(
                    "primary :{} killed, restarted from its AOF",
                    self.nodes[p].port()
                )
            }
            "old-filter" => self.old_filter(rng, sets)?,
            "lost-filter" => {
                let s = &sets[rng.below(sets.len() as u64) as usize];
                let mut c = self.primary_conn();
                let key = format!("member:{s}:bloom");
                let r = cmd(&mut c, &["UNLINK", &key]);
                let text = format!("UNLINK {key} -> {}", short(&r));
                if !matches!(r, Ok(redis::Value::Int(1))) {
                    return Err(text);
                }
                text
            }
            "pg-url" => {
                let direct = rng.below(2) == 0;
                let port = if direct {
                    self.pg.port()
                } else {
                    self.proxy.port()
                };
                let url = pg_url(port);
                let mut c = self.primary_conn();
                let r = cmd(&mut c, &["CONFIG", "SET", "member.pg-url", &url]);
                let text = format!(
                    "member.pg-url -> {} port -> {}",
                    if direct { "direct" } else { "proxy" },
                    short(&r)
                );
                ok_or(&r, text)?
            }
            "failover" => self.failover(rng)?,
            "demote" => self.demote(rng)?,
            "pg-promote-behind" => self.promote_behind(rng),
            "pg-restore-cold" => {
                let copy = self.pg.cold_copy();
                let lasts = 300 + rng.below(1500);
                thread::sleep(Duration::from_millis(lasts));
                self.pg.restore(&copy);
                format!(
                    "cold copy of :{} taken, {lasts} ms of commits after it, then the copy put \
                     back in place",
                    self.pg.port()
                )
            }
            other => panic!("unknown fault {other}"),
        };
        Ok(done)
    }

    /// `pg_terminate_backend` of every connection the module holds: how many.
    fn terminate_backends(&mut self) -> Result<i64, String> {
        let mut c = self
            .pg
            .try_client()
            .map_err(|e| format!("connect to PostgreSQL: {e}"))?;
        c.query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'libmember' AND pid <> pg_backend_pid()",
            &[],
        )
        .map(|r| r.get::<_, i64>(0))
        .map_err(|e| format!("pg_terminate_backend: {e}"))
    }

    /// Takes a `DUMP` of a filter, lets writes go on for longer than RECENT-TTL, and restores
    /// it over the live filter (`RESTORE … REPLACE`): an old value that missed those ADDs.
    fn old_filter(&mut self, rng: &mut Rng, sets: &[String]) -> Result<String, String> {
        let mut c = self.primary_conn();
        let s = &sets[rng.below(sets.len() as u64) as usize];
        let key = format!("member:{s}:bloom");
        let dump = match redis::cmd("DUMP")
            .arg(&key)
            .query::<Option<Vec<u8>>>(&mut c)
        {
            Ok(Some(d)) => d,
            other => return Err(format!("DUMP {key} -> {other:?}")),
        };
        let age = 1200 + rng.below(2000);
        thread::sleep(Duration::from_millis(age));
        let r: redis::RedisResult<redis::Value> = redis::cmd("RESTORE")
            .arg(&key)
            .arg(0)
            .arg(dump)
            .arg("REPLACE")
            .query(&mut c);
        let text = format!(
            "RESTORE {key} REPLACE with its DUMP of {age} ms before -> {}",
            short(&r)
        );
        ok_or(&r, text)
    }

    /// The primary dies; the replica is promoted and clients move to it; the old primary comes
    /// back from its AOF and becomes the new primary's replica.
    fn failover(&mut self, rng: &mut Rng) -> Result<String, String> {
        let old = self.primary;
        let new = self.replica();
        self.nodes[old].kill9();
        let mut c = self.nodes[new].conn();
        let r = cmd(&mut c, &["REPLICAOF", "NO", "ONE"]);
        self.primary = new;
        self.target.store(self.nodes[new].port(), Ordering::SeqCst);
        self.replica_target
            .store(self.nodes[new].port(), Ordering::SeqCst);
        thread::sleep(Duration::from_millis(rng.below(300)));
        self.nodes[old].restart();
        self.make_replica(old);
        self.replica_target
            .store(self.nodes[old].port(), Ordering::SeqCst);
        let text = format!(
            ":{} killed, :{} promoted ({}), :{} back as its replica",
            self.nodes[old].port(),
            self.nodes[new].port(),
            short(&r),
            self.nodes[old].port()
        );
        ok_or(&r, text)
    }

    /// A switchover without a restart: the replica is promoted and clients move to it; after a
    /// moment the old primary, still running with its filters in memory (and a moment of
    /// writes it never sees), is made the new primary's replica. Replica readers ask it
    /// throughout: the new primary while there are two, then the node that was just demoted.
    fn demote(&mut self, rng: &mut Rng) -> Result<String, String> {
        let old = self.primary;
        let new = self.replica();
        let mut c = self.nodes[new].conn();
        let r = cmd(&mut c, &["REPLICAOF", "NO", "ONE"]);
        if r.is_err() {
            return Err(format!("REPLICAOF NO ONE -> {}", short(&r)));
        }
        self.primary = new;
        self.target.store(self.nodes[new].port(), Ordering::SeqCst);
        // Two primaries on one database meanwhile: replica readers ask the new one until the
        // old one is a replica (the contract judges a replica's answers, not a stray primary's).
        self.replica_target
            .store(self.nodes[new].port(), Ordering::SeqCst);
        // Half the time a client that still reaches the old primary writes to it meanwhile
        // (a partition's stray write): its history then diverges, so it needs a full sync, and
        // the new primary waits 2-6 s before sending it (diskless): longer than the replica
        // staleness bound, a demoted node with its filters in memory and its link down. The
        // fault lasts until the link is up.
        let full = rng.below(2) == 0;
        let mut oc = self.nodes[old].conn();
        let delay = 2 + rng.below(5);
        if full {
            let d = delay.to_string();
            let r = cmd(
                &mut c,
                &[
                    "CONFIG",
                    "SET",
                    "repl-diskless-sync",
                    "yes",
                    "repl-diskless-sync-delay",
                    &d,
                ],
            );
            if r.is_err() {
                return Err(format!(
                    "CONFIG SET repl-diskless-sync-delay -> {}",
                    short(&r)
                ));
            }
            let _ = cmd(&mut oc, &["SET", "chaos:stray", &d]);
        }
        let apart = rng.below(800);
        thread::sleep(Duration::from_millis(apart));
        let p = self.nodes[new].port().to_string();
        let r = cmd(&mut oc, &["REPLICAOF", "127.0.0.1", &p]);
        self.replica_target
            .store(self.nodes[old].port(), Ordering::SeqCst);
        let linked = wait_until(Duration::from_secs(20), || {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut oc)
                .is_ok_and(|i| i.contains("master_link_status:up"))
        });
        let text = format!(
            ":{} promoted, :{} made its replica {apart} ms later without a restart{}, link {} -> {}",
            self.nodes[new].port(),
            self.nodes[old].port(),
            if full {
                format!(" (a stray write first: a full sync sent after {delay} s)")
            } else {
                String::new()
            },
            if linked { "up" } else { "NOT up after 20 s" },
            short(&r)
        );
        ok_or(&r, text)
    }

    /// PostgreSQL fails over to a standby that was behind: the standby stops (commits go on on
    /// the primary alone for a while), the primary is killed, the standby promoted, and the
    /// proxy sends new connections to it. What the old primary committed meanwhile is gone;
    /// [`taken_back`] tells the checker.
    fn promote_behind(&mut self, rng: &mut Rng) -> String {
        let mut standby = self.standby.take().unwrap_or_else(|| Standby::of(&self.pg));
        standby.wait_caught_up(&self.pg);
        standby.stop();
        let behind = 300 + rng.below(1200);
        thread::sleep(Duration::from_millis(behind));
        let old = self.pg.port();
        self.pg.kill();
        self.pg = standby.promote();
        self.proxy.retarget(self.pg.port());
        let cut = self.proxy.cut();
        format!(
            "standby stopped, {behind} ms of commits on :{old} alone, :{old} killed, the \
             standby promoted at :{}; proxy moved, {cut} connections cut",
            self.pg.port()
        )
    }

    /// Undoes whatever is still broken: PostgreSQL up, proxy passing, module on the proxy.
    pub fn heal(&mut self) {
        self.proxy.set(Mode::Pass);
        if !self.pg.is_running() {
            self.pg.start();
        }
        let url = pg_url(self.proxy.port());
        for n in &self.nodes {
            let mut c = n.conn();
            let _ = cmd(&mut c, &["CONFIG", "SET", "member.pg-url", &url]);
        }
    }
}

/// `text` as an injected fault when the command behind it succeeded, else as a failed one.
fn ok_or(r: &redis::RedisResult<redis::Value>, text: String) -> Result<String, String> {
    if r.is_ok() {
        Ok(text)
    } else {
        Err(text)
    }
}

fn short(r: &redis::RedisResult<redis::Value>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("error {e}"),
    }
    .chars()
    .take(80)
    .collect()
}

/// What a `pg-promote-behind` or a `pg-restore-cold` takes back, for the checker: every write
/// that may have taken effect while it ran (from the standby's stop to the promotion, from the
/// copy to its restore) may be gone from the database. Each gets a write of the other kind, as if failed: it may take effect at any time
/// from the fault's start until the checker's settle time after its end (the node answers
/// from the old history until it learns the new one; docs/failover.md).
pub fn taken_back(ops: &[Op], faults: &[Fault], settle_us: u64) -> Vec<Op> {
    let mut out = Vec::new();
    for f in faults.iter().filter(|f| LONG_ONLY.contains(&f.kind)) {
        for w in ops.iter().filter(|o| o.kind != Kind::Exists) {
            let effect_end = match w.outcome {
                Outcome::Int(_) => w.end,
                Outcome::Failed(_) => w.end.saturating_add(settle_us),
            };
            if w.start >= f.end || effect_end <= f.start {
                continue;
            }
            out.push(Op {
                client: usize::MAX,
                kind: if w.kind == Kind::Del {
                    Kind::Add
                } else {
                    Kind::Del
                },
                set: w.set.clone(),
                item: w.item.clone(),
                port: 0,
                replica: false,
                start: f.start,
                end: f.end,
                outcome: Outcome::Failed("taken back by a failover of PostgreSQL".into()),
            });
        }
    }
    out
}

/// What each switchover of Valkey (`failover`, `demote`) changes in judging reads
/// ([`Switchovers`]): for `window` µs after it (CACHE-TTL and the replica staleness bound) a 1
/// may come from a cache entry that a DEL lost with it never dropped; and from a demotion's
/// start until its end (its `REPLICAOF` until the demoted node's link was seen up; replica
/// readers ask it only after that `REPLICAOF`) a replica read gets no window.
pub fn switchovers(faults: &[Fault], window: u64) -> Switchovers {
    let mut sw = Switchovers::default();
    for f in faults
        .iter()
        .filter(|f| f.injected && matches!(f.kind, "failover" | "demote"))
    {
        sw.stale_ones.push((f.start, f.end.saturating_add(window)));
        if f.kind == "demote" && f.detail.contains("link up") {
            sw.link_down.push((f.start, f.end));
        }
    }
    sw
}
