//! The load of the cluster history tests (issue 8): writers ADD fresh items and DEL a few of
//! their own, readers EXISTS acknowledged, never-added and in-flight items, all through
//! [`Router`]s that follow MOVED and ASK; then the final check against the database and the
//! slot owners (`cluster_check.rs`). On an attached set ([`LoadConfig::source`]) the writers insert each row into
//! the set's table before its ADD or MADD, never DEL, and one more writer inserts rows the
//! module learns only from the change log.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use redis::Value;

use super::attached::Source;
use super::checker::{Rules, Violation};
use super::history::{Kind, Op, Outcome, Recorder};
use super::router::{is_conn_error, keyslot, Router};
use super::Rng;

/// What the load does.
pub struct LoadConfig {
    pub seed: u64,
    pub writers: usize,
    pub readers: usize,
    /// Pause after each write and (a tenth of it) after each read.
    pub pause_ms: u64,
    pub db_timeout_ms: u64,
    /// Slack over `db_timeout_ms` before an operation counts as a hang.
    pub slack_ms: u64,
    /// Half of the new items (written and never-written alike) hash to these slots: the ones
    /// being moved or failed over. Empty: no preference.
    pub hot: Vec<u16>,
    /// Items per MADD and MEXISTS of the batch clients (one batch writer and one batch
    /// reader, besides `writers` and `readers`); 0: none.
    pub batch: usize,
    /// The set normalizes with `lower`, and half of the items go out with some letters in
    /// upper case: such a spelling hashes to another slot than the item, so the node a call
    /// reaches serves it for the item's slot's owner (the cluster bus's forwarding, or the
    /// batch split). The history records the item as stored, the lower-case one.
    pub spell: bool,
    /// The set is attached to this table (docs/attach.md): ADD and MADD follow an INSERT of
    /// their rows, and an outside writer inserts rows without telling the module.
    pub source: Option<Source>,
    /// The set is tokenized (docs/security.md), its chain's keys by the load's end, in hex:
    /// its table holds its items' tokens under them (`member_catalog_token`). Empty: it is not.
    pub chain_keys: Vec<String>,
}

/// Client numbers: writers from 0, readers from 100, the batch writer and reader these, and
/// on an attached set the outside writer.
pub const BATCH_WRITER: usize = 200;
pub const BATCH_READER: usize = 300;
pub const OUTSIDE_WRITER: usize = 400;

impl LoadConfig {
    /// The checker's rules for this load.
    pub fn rules(&self) -> Rules {
        Rules {
            hang_us: (self.db_timeout_ms + self.slack_ms) * 1000,
            settle_us: (8 * self.db_timeout_ms + 4000) * 1000,
            outside_us: self.source.as_ref().map_or(0, |s| s.outside_ms * 1000),
            // This load reads primaries only.
            replica_absent_us: 0,
            replica_present_us: 0,
        }
    }

    /// How long to wait after the load before the final check: a failed write may land.
    pub fn settle_wait(&self) -> Duration {
        Duration::from_millis(3 * self.db_timeout_ms + 2000)
    }
}

/// Replies that are not answers but allowed: the node is gone, the cluster is reconfiguring,
/// the database is slow. Anything else that is not an integer is a violation.
/// `UNBLOCKED` is what a primary tells the clients it had blocked when it becomes a replica.
const ALLOWED_ERRORS: [&str; 7] = [
    "conn",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "UNAVAILABLE",
    "LOADING",
    "MASTERDOWN",
    "UNBLOCKED",
];

/// What every thread shares.
struct Shared<'a> {
    cfg: &'a LoadConfig,
    set: &'a str,
    seeds: &'a [u16],
    rec: &'a Recorder,
    stop: AtomicBool,
    hot: Vec<bool>,
    /// Every item whose ADD answered 1, in order.
    acked: Mutex<Vec<String>>,
    /// Each writer's item whose ADD is in flight (or was last sent); the batch writer's last.
    inflight: Vec<Mutex<String>>,
}

impl Shared<'_> {
    /// `<prefix>_<n>` for the next n, drawn from the hot slots half of the time.
    fn fresh(&self, prefix: &str, next: &mut u64, rng: &mut Rng) -> String {
        let want_hot = self.cfg.hot.is_empty() || rng.below(2) == 0;
        loop {
            let s = format!("{prefix}_{next}");
            *next += 1;
            if !want_hot || self.cfg.hot.is_empty() || self.hot[keyslot(s.as_bytes()) as usize] {
                return s;
            }
        }
    }

    /// How `item` goes out: itself, or (with `spell`, half of the time) with each letter in
    /// upper case at even odds.
    fn spelling(&self, item: &str, rng: &mut Rng) -> String {
        if !self.cfg.spell || rng.below(2) == 0 {
            return item.to_string();
        }
        item.chars()
            .map(|c| {
                if rng.below(2) == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect()
    }

    fn router(&self) -> Router {
        let t = Duration::from_millis(3 * (self.cfg.db_timeout_ms + self.cfg.slack_ms));
        Router::new(self.seeds.to_vec(), t)
    }

    /// Runs one command through `router` (the item spelled as [`Shared::spelling`] draws) and
    /// records it, as begun at `since` when given (the INSERT of an attached set's row).
    fn run(
        &self,
        router: &mut Router,
        rng: &mut Rng,
        client: usize,
        (kind, since): (Kind, Option<u64>),
        item: &str,
    ) -> Outcome {
        let spelled = self.spelling(item, rng);
        router.prepare();
        let start = since.unwrap_or_else(|| self.rec.now());
        let (port, res) = router.call(&[kind.command(), self.set, &spelled]);
        let end = self.rec.now();
        let outcome = match res {
            Ok(Value::Int(n)) => Outcome::Int(n),
            Ok(v) => Outcome::Failed(format!("ERR unexpected reply {v:?}")),
            Err(e) if is_conn_error(&e) => Outcome::Failed(format!("conn: {e}")),
            Err(e) if e.code().is_some() => Outcome::Failed(
                format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
                    .trim()
                    .to_string(),
            ),
            Err(e) => Outcome::Failed(format!("ERR client: {e}")),
        };
        self.rec.op(Op {
            client,
            kind,
            set: self.set.to_string(),
            item: item.to_string(),
            port,
            replica: false,
            start,
            end,
            outcome: outcome.clone(),
        });
        outcome
    }

    /// Runs one MADD or MEXISTS of `items` through `router` (routed by the set name) and
    /// records it as one operation per item, each with the call's interval and its own
    /// answer, or the call's error: the checker then holds every item to what a single call
    /// would have answered somewhere in that interval. `since` as for [`Shared::run`].
    fn run_many(
        &self,
        router: &mut Router,
        rng: &mut Rng,
        client: usize,
        (kind, since): (Kind, Option<u64>),
        items: &[String],
    ) -> Vec<Outcome> {
        let spelled: Vec<String> = items.iter().map(|i| self.spelling(i, rng)).collect();
        router.prepare();
        let command = match kind {
            Kind::Add => "MEMBER.MADD",
            Kind::Exists => "MEMBER.MEXISTS",
            Kind::Del | Kind::Insert => unreachable!("no batch {kind:?}"),
        };
        let mut args = vec![command, self.set, "ITEMS"];
        args.extend(spelled.iter().map(String::as_str));
        let start = since.unwrap_or_else(|| self.rec.now());
        let (port, res) = router.call_by(self.set, &args);
        let end = self.rec.now();
        let failed = |t: String| vec![Outcome::Failed(t); items.len()];
        let outcomes = match res {
            Ok(Value::Array(v)) if v.len() == items.len() => v
                .into_iter()
                .map(|x| match x {
                    Value::Int(n) => Outcome::Int(n),
                    other => Outcome::Failed(format!("ERR unexpected element {other:?}")),
                })
                .collect(),
            Ok(v) => failed(format!("ERR unexpected reply {v:?}")),
            Err(e) if is_conn_error(&e) => failed(format!("conn: {e}")),
            Err(e) if e.code().is_some() => failed(
                format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
                    .trim()
                    .to_string(),
            ),
            Err(e) => failed(format!("ERR client: {e}")),
        };
        for (item, outcome) in items.iter().zip(&outcomes) {
            self.rec.op(Op {
                client,
                kind,
                set: self.set.to_string(),
                item: item.clone(),
                port,
                replica: false,
                start,
                end,
                outcome: outcome.clone(),
            });
        }
        outcomes
    }

    /// On an attached set, inserts `items` into its table as the application does before it
    /// tells the module, and returns when that began; an INSERT that fails is recorded for
    /// each item (an unexpected error: the database is not faulted in these runs), and
    /// `Err` says to skip the call. On an owned set: `Ok(None)`.
    fn insert_first(
        &self,
        pg: &mut Option<postgres::Client>,
        client: usize,
        items: &[String],
    ) -> Result<Option<u64>, ()> {
        let (Some(src), Some(pg)) = (&self.cfg.source, pg.as_mut()) else {
            return Ok(None);
        };
        let start = self.rec.now();
        match src.insert(pg, items) {
            Ok(()) => Ok(Some(start)),
            Err(e) => {
                let end = self.rec.now();
                for item in items {
                    self.rec.op(Op {
                        client,
                        kind: Kind::Add,
                        set: self.set.to_string(),
                        item: item.clone(),
                        port: 0,
                        replica: false,
                        start,
                        end,
                        outcome: Outcome::Failed(e.clone()),
                    });
                }
                Err(())
            }
        }
    }

    /// An item for a reader: never written (2 in 10), one whose write is in flight (2 in
    /// 10), or an acknowledged one, recent ones preferred (6 in 10).
    fn pick(&self, rng: &mut Rng, next: &mut u64, prefix: &str) -> String {
        let chosen = match rng.below(10) {
            2 | 3 => {
                let w = rng.below(self.inflight.len() as u64) as usize;
                Some(self.inflight[w].lock().unwrap().clone()).filter(|s| !s.is_empty())
            }
            4.. => {
                let acked = self.acked.lock().unwrap();
                let n = acked.len() as u64;
                (n > 0).then(|| {
                    let lo = if rng.below(2) == 0 {
                        n.saturating_sub(64)
                    } else {
                        0
                    };
                    acked[(lo + rng.below(n - lo)) as usize].clone()
                })
            }
            _ => None,
        };
        chosen.unwrap_or_else(|| self.fresh(prefix, next, rng))
    }
}

/// The batch writer: MADD of `batch` fresh items at a time (their in-flight mark is the last
/// of them). An item whose MADD failed is never written again.
fn batch_writer(x: &Shared) {
    let mut rng = Rng::new(x.cfg.seed ^ 0x3000_u64.wrapping_mul(0x9e37_79b9));
    let mut router = x.router();
    let mut pg = x.cfg.source.as_ref().map(Source::connect);
    let mut next = 0;
    let w = x.cfg.writers;
    while !x.stop.load(Ordering::Relaxed) {
        let items: Vec<String> = (0..x.cfg.batch)
            .map(|_| x.fresh("mw", &mut next, &mut rng))
            .collect();
        *x.inflight[w].lock().unwrap() = items.last().unwrap().clone();
        let Ok(since) = x.insert_first(&mut pg, BATCH_WRITER, &items) else {
            continue;
        };
        let got = x.run_many(
            &mut router,
            &mut rng,
            BATCH_WRITER,
            (Kind::Add, since),
            &items,
        );
        let mut acked = x.acked.lock().unwrap();
        for (it, o) in items.into_iter().zip(got) {
            if o == Outcome::Int(1) {
                acked.push(it);
            }
        }
        drop(acked);
        thread::sleep(Duration::from_millis(x.cfg.pause_ms));
    }
}

/// The batch reader: MEXISTS of `batch` items chosen as a reader chooses.
fn batch_reader(x: &Shared) {
    let mut rng = Rng::new(x.cfg.seed ^ 0x4000_u64.wrapping_mul(0x85eb_ca6b));
    let mut router = x.router();
    let mut next = 0;
    while !x.stop.load(Ordering::Relaxed) {
        let items: Vec<String> = (0..x.cfg.batch)
            .map(|_| x.pick(&mut rng, &mut next, "mghost"))
            .collect();
        x.run_many(
            &mut router,
            &mut rng,
            BATCH_READER,
            (Kind::Exists, None),
            &items,
        );
        thread::sleep(Duration::from_millis(x.cfg.pause_ms / 2 + 1));
    }
}

/// Writer `w`: ADD a fresh item (nine times in ten) or DEL one of its acknowledged members;
/// on an attached set, INSERT a fresh row and ADD it, never DEL. An item whose write failed
/// is never written again.
fn writer(w: usize, x: &Shared) {
    let mut rng = Rng::new(x.cfg.seed ^ (0x1000 + w as u64).wrapping_mul(0x9e37_79b9));
    let mut router = x.router();
    let mut pg = x.cfg.source.as_ref().map(Source::connect);
    let mut next = 0;
    let mut mine: Vec<String> = Vec::new();
    while !x.stop.load(Ordering::Relaxed) {
        if !mine.is_empty() && pg.is_none() && rng.below(10) == 0 {
            let it = mine.swap_remove(rng.below(mine.len() as u64) as usize);
            x.run(&mut router, &mut rng, w, (Kind::Del, None), &it);
        } else {
            let it = x.fresh(&format!("w{w}"), &mut next, &mut rng);
            *x.inflight[w].lock().unwrap() = it.clone();
            let Ok(since) = x.insert_first(&mut pg, w, std::slice::from_ref(&it)) else {
                continue;
            };
            if x.run(&mut router, &mut rng, w, (Kind::Add, since), &it) == Outcome::Int(1) {
                x.acked.lock().unwrap().push(it.clone());
                mine.push(it);
            }
        }
        thread::sleep(Duration::from_millis(x.cfg.pause_ms));
    }
}

/// Reader `r`: EXISTS of items chosen by [`Shared::pick`].
fn reader(r: usize, x: &Shared) {
    let mut rng = Rng::new(x.cfg.seed ^ (0x2000 + r as u64).wrapping_mul(0x85eb_ca6b));
    let mut router = x.router();
    let mut next = 0;
    let prefix = format!("ghost{r}");
    while !x.stop.load(Ordering::Relaxed) {
        let it = x.pick(&mut rng, &mut next, &prefix);
        x.run(&mut router, &mut rng, 100 + r, (Kind::Exists, None), &it);
        thread::sleep(Duration::from_millis(x.cfg.pause_ms / 10 + 1));
    }
}

/// The outside writer of an attached set: INSERTs a fresh row (its own transaction) and tells
/// the module nothing; readers then pick it as they pick acknowledged items.
fn outside_writer(src: &Source, x: &Shared) {
    let mut rng = Rng::new(x.cfg.seed ^ 0x5000_u64.wrapping_mul(0x9e37_79b9));
    let mut pg = src.connect();
    let mut next = 0;
    while !x.stop.load(Ordering::Relaxed) {
        let it = x.fresh("ow", &mut next, &mut rng);
        let start = x.rec.now();
        let done = src.insert(&mut pg, std::slice::from_ref(&it));
        let end = x.rec.now();
        x.rec.op(Op {
            client: OUTSIDE_WRITER,
            kind: Kind::Insert,
            set: x.set.to_string(),
            item: it.clone(),
            port: 0,
            replica: false,
            start,
            end,
            outcome: done
                .as_ref()
                .map_or_else(|e| Outcome::Failed(e.clone()), |_| Outcome::Int(1)),
        });
        if done.is_ok() {
            x.acked.lock().unwrap().push(it);
        }
        thread::sleep(Duration::from_millis(2 * x.cfg.pause_ms));
    }
}

/// Runs the load on `set` through routers seeded with `seeds` while `during` runs on this
/// thread (the reshard or the failover, with load before and after it); returns once every
/// client has stopped, and panics (after stopping them) when `during` panicked.
pub fn run(cfg: &LoadConfig, set: &str, seeds: &[u16], rec: &Recorder, during: impl FnOnce()) {
    let mut hot = vec![false; 16384];
    for s in &cfg.hot {
        hot[*s as usize] = true;
    }
    let x = Shared {
        cfg,
        set,
        seeds,
        rec,
        stop: AtomicBool::new(false),
        hot,
        acked: Mutex::new(Vec::new()),
        inflight: (0..cfg.writers + usize::from(cfg.batch > 0))
            .map(|_| Mutex::new(String::new()))
            .collect(),
    };
    let x = &x;
    thread::scope(|sc| {
        for w in 0..cfg.writers {
            sc.spawn(move || writer(w, x));
        }
        for r in 0..cfg.readers {
            sc.spawn(move || reader(r, x));
        }
        if cfg.batch > 0 {
            sc.spawn(move || batch_writer(x));
            sc.spawn(move || batch_reader(x));
        }
        if let Some(src) = &cfg.source {
            sc.spawn(move || outside_writer(src, x));
        }
        // A panic in `during` (a failed step of the scenario) must stop the clients too, or
        // the scope would wait for them for ever; it is raised again once they have stopped.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(during));
        x.stop.store(true, Ordering::SeqCst);
        if let Err(p) = outcome {
            std::panic::resume_unwind(p);
        }
    });
}

/// Every failure that is neither an answer nor an allowed error.
pub fn unexpected_errors(ops: &[Op]) -> Vec<Violation> {
    ops.iter()
        .filter(|o| {
            o.outcome.answer().is_none() && !ALLOWED_ERRORS.contains(&o.outcome.class().as_str())
        })
        .map(|o| Violation {
            rule: "unexpected error",
            text: o.describe(),
        })
        .collect()
}
