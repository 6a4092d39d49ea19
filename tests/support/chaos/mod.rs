//! The chaos run of issue 9: writers ADD and DEL their own items, readers EXISTS any item, on
//! several sets at once, while a fault schedule breaks the world; then the history checker.

pub mod attached;
pub mod checker;
pub mod cluster_check;
pub mod cluster_load;
pub mod faults;
pub mod history;
pub mod router;
mod truth;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use checker::{Rules, Violation};
use faults::World;
use history::{Fault, Kind, Op, Outcome, Recorder};

/// A small deterministic generator (xorshift64*), so a run can be repeated from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a run does.
pub struct Config {
    pub duration: Duration,
    pub seed: u64,
    pub sets: usize,
    pub writers: usize,
    pub readers: usize,
    /// Readers that ask the replica (whichever node is not the primary now).
    pub replica_readers: usize,
    /// Items each writer works on at a time, per set (its window).
    pub items_per_writer: usize,
    /// Every this many ms each writer's window moves on by one item, so that new items keep
    /// being added for the first time (an old filter value lacks their bits).
    pub window_step_ms: u64,
    /// Pause after each write: each item is written about every
    /// `sets × items_per_writer × writer_pause_ms`, longer than RECENT-TTL.
    pub writer_pause_ms: u64,
    /// Pause between two faults (the fault itself lasts on top of it).
    pub fault_gap_ms: (u64, u64),
    pub db_timeout_ms: u64,
    /// Slack over `db_timeout_ms` before an operation counts as a hang.
    pub slack_ms: u64,
}

/// The outcome of a run.
pub struct Report {
    pub ops: usize,
    pub violations: Vec<Violation>,
    /// Each fault kind of the run and how many times it was injected (failed tries not counted).
    pub injected: BTreeMap<&'static str, usize>,
}

/// The client's read timeout: well past the hang bound, so a hang is recorded, not endured.
fn client_timeout(cfg: &Config) -> Duration {
    Duration::from_millis(3 * (cfg.db_timeout_ms + cfg.slack_ms))
}

/// Items of set `s` owned by writer `w`, and the items nobody ever writes.
fn item(w: usize, n: usize) -> String {
    format!("w{w}_{n}")
}
fn ghost(n: usize) -> String {
    format!("ghost_{n}")
}
const GHOSTS: usize = 10;

/// One client's connection to whichever server it asks now (the primary, or the replica).
struct Client {
    id: usize,
    con: Option<(u16, redis::Connection)>,
    timeout: Duration,
    /// It asks the replica: its operations are judged with the replica's window.
    replica: bool,
}

impl Client {
    /// Runs one command and records it. Returns None when no connection could be made (the
    /// command was not sent; nothing is recorded).
    fn run(
        &mut self,
        rec: &Recorder,
        port: u16,
        kind: Kind,
        set: &str,
        item: &str,
    ) -> Option<Outcome> {
        if self.con.as_ref().is_none_or(|(p, _)| *p != port) {
            let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
            let con = c
                .get_connection_with_timeout(Duration::from_millis(500))
                .ok()?;
            con.set_read_timeout(Some(self.timeout)).ok()?;
            con.set_write_timeout(Some(self.timeout)).ok()?;
            self.con = Some((port, con));
        }
        let (_, con) = self.con.as_mut().unwrap();
        let start = rec.now();
        let res = redis::cmd(kind.command())
            .arg(set)
            .arg(item)
            .query::<redis::Value>(con);
        let end = rec.now();
        let outcome = match res {
            Ok(redis::Value::Int(n)) => Outcome::Int(n),
            Ok(v) => Outcome::Failed(format!("unexpected reply {v:?}")),
            Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
                self.con = None;
                Outcome::Failed(format!("conn: {e}"))
            }
            Err(e) => Outcome::Failed(
                format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
                    .trim()
                    .to_string(),
            ),
        };
        rec.op(Op {
            client: self.id,
            kind,
            set: set.to_string(),
            item: item.to_string(),
            port,
            replica: self.replica,
            start,
            end,
            outcome: outcome.clone(),
        });
        Some(outcome)
    }
}

/// What every client thread shares.
struct Shared<'a> {
    cfg: &'a Config,
    sets: &'a [String],
    /// The primary's port, and the replica's.
    target: &'a AtomicU16,
    replica_target: &'a AtomicU16,
    rec: &'a Recorder,
    stop: &'a AtomicBool,
    /// Where each writer's window begins now.
    bases: &'a [AtomicUsize],
    /// How long a failed write may still land.
    settle: Duration,
}

/// Writer `w`: ADD (60 %) or DEL its own items; an item whose write failed is left alone
/// until that write can no longer land (`settle`), so every later acknowledged write settles it.
fn writer(w: usize, x: &Shared) {
    let (cfg, sets, target, rec, stop, settle) = (x.cfg, x.sets, x.target, x.rec, x.stop, x.settle);
    let base = &x.bases[w];
    let began = Instant::now();
    let mut rng = Rng::new(cfg.seed ^ (0x1000 + w as u64).wrapping_mul(0x9e37_79b9));
    let mut client = Client {
        id: w,
        con: None,
        timeout: client_timeout(cfg),
        replica: false,
    };
    let mut quiet: BTreeMap<(usize, usize), Instant> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let s = rng.below(sets.len() as u64) as usize;
        let b = (began.elapsed().as_millis() as u64 / cfg.window_step_ms) as usize;
        base.store(b, Ordering::Relaxed);
        let n = b + rng.below(cfg.items_per_writer as u64) as usize;
        if quiet.get(&(s, n)).is_some_and(|t| t.elapsed() < settle) {
            continue;
        }
        let kind = if rng.below(10) < 6 {
            Kind::Add
        } else {
            Kind::Del
        };
        let port = target.load(Ordering::SeqCst);
        match client.run(rec, port, kind, &sets[s], &item(w, n)) {
            Some(Outcome::Int(_)) => {
                quiet.remove(&(s, n));
            }
            Some(Outcome::Failed(_)) => {
                quiet.insert((s, n), Instant::now());
                thread::sleep(Duration::from_millis(20));
            }
            None => thread::sleep(Duration::from_millis(50)),
        }
        thread::sleep(Duration::from_millis(cfg.writer_pause_ms));
    }
}

/// Reader `r`: EXISTS of any writer's items and of items nobody writes, on the primary, or on
/// the replica (`on_replica`: whichever node is not the primary now, the demoted one included).
fn reader(r: usize, on_replica: bool, x: &Shared) {
    let (cfg, sets, rec, stop, bases) = (x.cfg, x.sets, x.rec, x.stop, x.bases);
    let target = if on_replica {
        x.replica_target
    } else {
        x.target
    };
    let mut rng = Rng::new(cfg.seed ^ (0x2000 + r as u64).wrapping_mul(0x85eb_ca6b));
    let mut client = Client {
        id: 100 + r,
        con: None,
        timeout: client_timeout(cfg),
        replica: on_replica,
    };
    while !stop.load(Ordering::Relaxed) {
        let s = rng.below(sets.len() as u64) as usize;
        let it = if rng.below(10) == 0 {
            ghost(rng.below(GHOSTS as u64) as usize)
        } else {
            // Mostly the writer's window, sometimes any item it ever had.
            let w = rng.below(cfg.writers as u64) as usize;
            let top = bases[w].load(Ordering::Relaxed) + cfg.items_per_writer;
            let lo = if rng.below(5) == 0 {
                0
            } else {
                top - cfg.items_per_writer
            };
            item(w, lo + rng.below((top - lo) as u64) as usize)
        };
        let port = target.load(Ordering::SeqCst);
        match client.run(rec, port, Kind::Exists, &sets[s], &it) {
            Some(Outcome::Int(_)) => {}
            Some(Outcome::Failed(_)) => thread::sleep(Duration::from_millis(10)),
            None => thread::sleep(Duration::from_millis(50)),
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Runs the whole thing: world, clients, faults (`kinds` round-robin in a shuffled order), heal,
/// final check, history check. Prints the summary.
pub fn run(cfg: &Config, kinds: &[&'static str]) -> Report {
    let sets: Vec<String> = (0..cfg.sets).map(|i| format!("chaos{i}")).collect();
    eprintln!(
        "chaos: seed {} ({} s, {} writers, {} readers, {} on the replica, {} sets; faults {:?})",
        cfg.seed,
        cfg.duration.as_secs(),
        cfg.writers,
        cfg.readers,
        cfg.replica_readers,
        cfg.sets,
        kinds
    );
    let mut world = World::start(&sets, cfg.db_timeout_ms);
    let rec = Recorder::new();
    let stop = AtomicBool::new(false);
    let settle = Duration::from_millis(8 * cfg.db_timeout_ms + 4000);
    let rules = Rules {
        hang_us: (cfg.db_timeout_ms + cfg.slack_ms) * 1000,
        settle_us: settle.as_micros() as u64,
        outside_us: 0,
        replica_absent_us: faults::replica_lag_bound_ms(cfg.db_timeout_ms) * 1000,
        replica_present_us: (faults::replica_lag_bound_ms(cfg.db_timeout_ms)
            + faults::CACHE_TTL_S * 1000)
            * 1000,
    };
    let mut rng = Rng::new(cfg.seed);
    let mut order: Vec<&'static str> = Vec::new();
    let mut injected: BTreeMap<&'static str, usize> = kinds.iter().map(|k| (*k, 0)).collect();
    let mut retried: Vec<&'static str> = Vec::new();
    let began = Instant::now();
    let target = world.target.clone();
    let replica_target = world.replica_target.clone();
    let bases: Vec<AtomicUsize> = (0..cfg.writers).map(|_| AtomicUsize::new(0)).collect();
    let x = Shared {
        cfg,
        sets: &sets,
        target: &target,
        replica_target: &replica_target,
        rec: &rec,
        stop: &stop,
        bases: &bases,
        settle,
    };
    let x = &x;
    thread::scope(|sc| {
        for i in 0..cfg.writers {
            sc.spawn(move || writer(i, x));
        }
        for i in 0..cfg.readers + cfg.replica_readers {
            sc.spawn(move || reader(i, i >= cfg.readers, x));
        }
        // The fault schedule, on this thread: every kind once per round, in a shuffled order.
        // A kind whose injection failed is tried once more at the end of its round. Past the
        // run's length the schedule goes on only while a kind was never injected, and for at
        // most one more round of tries, so a short run still injects every kind once.
        thread::sleep(Duration::from_millis(1000));
        let mut extra = kinds.len();
        loop {
            let missing = kinds.iter().any(|k| injected[k] == 0);
            if began.elapsed() >= cfg.duration {
                if !missing || extra == 0 {
                    break;
                }
                extra -= 1;
            }
            if order.is_empty() {
                retried.clear();
                order = kinds.to_vec();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
            }
            let kind = order.pop().unwrap();
            let start = rec.now();
            let (detail, ok) = match world.inject(kind, &mut rng, &sets) {
                Ok(d) => (d, true),
                Err(d) => (d, false),
            };
            rec.fault(Fault {
                start,
                end: rec.now(),
                kind,
                detail,
                injected: ok,
            });
            if ok {
                *injected.get_mut(kind).unwrap() += 1;
            } else if injected[kind] == 0 && !retried.contains(&kind) {
                // Once more at the end of this round (the next round has it again anyway).
                retried.push(kind);
                order.insert(0, kind);
            }
            let (lo, hi) = cfg.fault_gap_ms;
            thread::sleep(Duration::from_millis(lo + rng.below(hi - lo + 1)));
        }
        world.heal();
        // Clients go on through the healed world for a while: the answers after faults count.
        thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::SeqCst);
    });
    let ops = rec.ops();
    let faults = rec.faults();
    // Let every failed write land or die, then compare each item with the database.
    thread::sleep(settle.min(Duration::from_millis(3 * cfg.db_timeout_ms + 2000)));
    // What a failover of PostgreSQL took back (`faults::taken_back`) is part of the history
    // the checks judge.
    let taken = faults::taken_back(&ops, &faults, rules.settle_us);
    let switched = faults::switchovers(&faults, rules.replica_present_us);
    let mut violations = checker::check_with(&ops, &taken, &switched, &rules);
    let tops: Vec<usize> = bases
        .iter()
        .map(|b| b.load(Ordering::Relaxed) + cfg.items_per_writer)
        .collect();
    let judged: Vec<Op> = ops.iter().chain(&taken).cloned().collect();
    violations.extend(final_check(&world, &sets, &tops, &judged, &rules));
    summary("chaos", &ops, &faults, &violations, began.elapsed());
    if let Ok(path) = std::env::var("MEMBER_CHAOS_HISTORY") {
        write_history(&path, &ops, &faults, &violations);
    }
    Report {
        ops: ops.len(),
        violations,
        injected,
    }
}

/// After the run: every item's answer on the primary must be the database's, and the database
/// must hold what the history says it holds (an acknowledged member is still one).
fn final_check(
    world: &World,
    sets: &[String],
    tops: &[usize],
    ops: &[Op],
    rules: &Rules,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut pg = world.pg.client();
    let mut c = world.primary_conn();
    let end = u64::MAX / 2;
    let mut writes_of: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.kind != Kind::Exists) {
        writes_of.entry((&o.set, &o.item)).or_default().push(o);
    }
    for s in sets {
        let mut items: Vec<String> = (0..GHOSTS).map(ghost).collect();
        for (w, top) in tops.iter().enumerate() {
            items.extend((0..*top).map(|n| item(w, n)));
        }
        for it in items {
            let truth = pg
                .query_opt(
                    &format!(
                        "SELECT 1 FROM member_{s} WHERE entity_id = $1 AND scope = '' AND status = 1 \
                         AND (expires_at IS NULL OR expires_at > now())"
                    ),
                    &[&it],
                )
                .expect("read the truth")
                .is_some();
            let writes = writes_of
                .get(&(s.as_str(), it.as_str()))
                .cloned()
                .unwrap_or_default();
            let (known, by) = checker::known_state_at(&writes, end, rules);
            if let Some(k) = known {
                if k != truth {
                    out.push(Violation {
                        rule: "final: database differs from history",
                        text: format!(
                            "{s} {it}: the database says {}, the history {}{}",
                            truth as u8,
                            k as u8,
                            by.map(|b| format!(" (by {})", b.describe()))
                                .unwrap_or_default()
                        ),
                    });
                }
            }
            let mut answer = None;
            let deadline = Instant::now() + Duration::from_secs(10);
            while answer.is_none() && Instant::now() < deadline {
                match redis::cmd("MEMBER.EXISTS")
                    .arg(s)
                    .arg(&it)
                    .query::<i64>(&mut c)
                {
                    Ok(n) => answer = Some(n),
                    Err(_) => thread::sleep(Duration::from_millis(100)),
                }
            }
            match answer {
                Some(n) if (n == 1) == truth => {}
                Some(n) => out.push(Violation {
                    rule: "final: answer differs from the database",
                    text: format!(
                        "{s} {it}: EXISTS answers {n}, the database says {}",
                        truth as u8
                    ),
                }),
                None => out.push(Violation {
                    rule: "final: no answer",
                    text: format!("{s} {it}: EXISTS gave no answer for 10 s after healing"),
                }),
            }
        }
    }
    out
}

/// Prints operations, faults, errors and violations, each line starting with `tag:`.
pub fn summary(tag: &str, ops: &[Op], faults: &[Fault], violations: &[Violation], took: Duration) {
    // Each operation's time, by command and outcome: the count and the median are printed.
    let mut by_kind: BTreeMap<(Kind, String), Vec<u64>> = BTreeMap::new();
    for o in ops {
        by_kind
            .entry((o.kind, o.outcome.class()))
            .or_default()
            .push(o.end.saturating_sub(o.start));
    }
    let mut fk: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failed: BTreeMap<&str, usize> = BTreeMap::new();
    for f in faults {
        *(if f.injected { &mut fk } else { &mut failed })
            .entry(f.kind)
            .or_default() += 1;
    }
    let mut vk: BTreeMap<&str, usize> = BTreeMap::new();
    for v in violations {
        *vk.entry(v.rule).or_default() += 1;
    }
    eprintln!("{tag}: ---- summary after {:.1} s ----", took.as_secs_f64());
    eprintln!("{tag}: operations {}", ops.len());
    for ((k, class), took) in &mut by_kind {
        took.sort_unstable();
        let median_ms = took[took.len() / 2] as f64 / 1e3;
        eprintln!(
            "{tag}:   {:<14} {:<40} {:>7}  median {median_ms:.1} ms",
            k.command(),
            class,
            took.len()
        );
    }
    eprintln!(
        "{tag}: faults injected {}: {fk:?}",
        fk.values().sum::<usize>()
    );
    if !failed.is_empty() {
        eprintln!("{tag}: faults NOT injected (tried): {failed:?}");
    }
    eprintln!("{tag}: violations {}: {vk:?}", violations.len());
    for v in violations.iter().take(25) {
        eprintln!("{tag}: VIOLATION [{}] {}", v.rule, v.text);
    }
}

/// Writes every operation and fault, in start order, one a line (`MEMBER_CHAOS_HISTORY`).
pub fn write_history(path: &str, ops: &[Op], faults: &[Fault], violations: &[Violation]) {
    let mut lines: Vec<(u64, String)> = ops.iter().map(|o| (o.start, o.describe())).collect();
    lines.extend(faults.iter().map(|f| {
        let (s, e) = (f.start as f64 / 1e6, f.end as f64 / 1e6);
        (
            f.start,
            format!(
                "FAULT {} [{s:.3} s, {e:.3} s] {}{}",
                f.kind,
                if f.injected { "" } else { "NOT INJECTED: " },
                f.detail
            ),
        )
    }));
    lines.sort();
    let text: Vec<String> = lines.into_iter().map(|(_, l)| l).collect();
    let mut text = text;
    text.extend(
        violations
            .iter()
            .map(|v| format!("VIOLATION [{}] {}", v.rule, v.text)),
    );
    match std::fs::write(path, text.join("\n") + "\n") {
        Ok(()) => eprintln!("chaos: history written to {path}"),
        Err(e) => eprintln!("chaos: cannot write {path}: {e}"),
    }
}
