//! The worker pool: `member.workers` threads, each with its own connection, draining one
//! queue (refusing jobs past QUEUE_LIMIT). A worker takes what is queued (up to `member.batch-size` jobs) and resolves
//! all point lookups of a set with one query and all ADDs of a set with one multi-row insert;
//! ADDs of a set taken by several workers meanwhile wait for the set's running inserts and go
//! in the next one together (`combine.rs`).
//! A job that panics is contained; its blocked client still gets a reply.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

use super::combine::Combiner;
use super::{members, sql, Db, DbErr};
use crate::config;

/// A unit of database work. Each owns its blocked client (if any), so dropping it unrun still
/// answers the client.
pub enum Job {
    /// Is (entity, scope) an active member? Batched per set.
    Lookup(Point<sql::Found>),
    /// Make (entity, scope) a member, expiring at the given unix time. Batched per set.
    Add(Point<bool>, Option<f64>),
    /// Anything else, run alone.
    Run(Box<dyn FnOnce(&mut Db) + Send>),
}

/// One membership to resolve and where its answer goes.
pub struct Point<T> {
    pub set: String,
    pub entity: String,
    pub scope: String,
    /// A write's twin, stored (or deleted) with it while the set's key rotates.
    pub twin: Option<String>,
    pub reply: Box<dyn FnOnce(Result<T, DbErr>) + Send>,
}

/// Batched statements sent, and the points they resolved (INFO shows the average batch).
pub static BATCHES: AtomicU64 = AtomicU64::new(0);
pub static BATCHED_POINTS: AtomicU64 = AtomicU64::new(0);

/// Counts one batched statement resolving `points` items (INFO's average batch).
pub fn count_batch(points: usize) {
    BATCHES.fetch_add(1, Ordering::Relaxed);
    BATCHED_POINTS.fetch_add(points as u64, Ordering::Relaxed);
}

/// Shorthand for `submit(Job::Run(..))`.
pub fn run(f: impl FnOnce(&mut Db) + Send + 'static) {
    submit(Job::Run(Box::new(f)));
}

/// Jobs waiting beyond this many are refused with UNAVAILABLE rather than queued.
pub const QUEUE_LIMIT: usize = 100_000;

struct Pool {
    /// Jobs travel in envelopes: everything one event-loop iteration submitted, sent with a
    /// single wake-up of one worker (and resolved there in shared statements).
    tx: Sender<Vec<Job>>,
    rx: Receiver<Vec<Job>>,
    /// Jobs sent and not yet taken by a worker.
    queued: AtomicUsize,
    alive: Mutex<Vec<bool>>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let (tx, rx) = unbounded();
        Pool {
            tx,
            rx,
            queued: AtomicUsize::new(0),
            alive: Mutex::new(Vec::new()),
        }
    })
}

thread_local! {
    /// Jobs submitted during the current event-loop iteration (main thread).
    static PENDING: RefCell<Vec<Job>> = const { RefCell::new(Vec::new()) };
}

/// True once `flush` is called before each event-loop sleep; until then (or on a server
/// without that event) every job is sent at once.
static FLUSH_BEFORE_SLEEP: AtomicBool = AtomicBool::new(false);

/// Queues a job (main thread). It reaches a worker when the event loop is about to sleep,
/// together with every other job of this iteration. When the queue is full the job is
/// dropped, which answers its client with the job's fallback error.
pub fn submit(job: Job) {
    let waiting = pool().queued.load(Ordering::Relaxed) + PENDING.with(|p| p.borrow().len());
    if waiting >= QUEUE_LIMIT {
        drop(job);
        return;
    }
    let job = counted(job);
    PENDING.with(|p| p.borrow_mut().push(job));
    if !FLUSH_BEFORE_SLEEP.load(Ordering::Relaxed) {
        flush();
    }
}

/// `job`, counted in flight (`in_flight`) until its answer is given, or it is dropped unrun.
fn counted(job: Job) -> Job {
    let flight = super::in_flight::Flight::begin();
    match job {
        Job::Lookup(p) => Job::Lookup(p.holding(flight)),
        Job::Add(p, expires_at) => Job::Add(p.holding(flight), expires_at),
        Job::Run(f) => Job::Run(Box::new(move |db| {
            let _flight = flight;
            f(db)
        })),
    }
}

impl<T: 'static> Point<T> {
    /// This point, `flight` ending as its answer is given (or the point is dropped).
    fn holding(mut self, flight: super::in_flight::Flight) -> Point<T> {
        let reply = self.reply;
        self.reply = Box::new(move |res| {
            let _flight = flight;
            reply(res)
        });
        self
    }
}

/// Sends the jobs of this iteration to the workers in one envelope (main thread).
pub fn flush() {
    let jobs = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if jobs.is_empty() {
        return;
    }
    let p = pool();
    p.queued.fetch_add(jobs.len(), Ordering::Relaxed);
    if let Err(e) = p.tx.send(jobs) {
        p.queued.fetch_sub(e.0.len(), Ordering::Relaxed);
    }
}

/// Switches `submit` to sending once per event-loop iteration; call after subscribing
/// `flush` to the before-sleep event.
pub fn flush_before_sleep() {
    FLUSH_BEFORE_SLEEP.store(true, Ordering::Relaxed);
}

/// Jobs waiting for a worker.
pub fn queued() -> usize {
    pool().queued.load(Ordering::Relaxed) + PENDING.with(|p| p.borrow().len())
}

/// Set once the module load has succeeded: before, a `member.workers` value being loaded
/// must not start threads (a load that then fails would unload their code under them).
static STARTED: AtomicBool = AtomicBool::new(false);

/// Starts the workers, at the end of a successful module load.
pub fn start() {
    STARTED.store(true, Ordering::Release);
    resize();
}

/// Starts or stops workers to match `member.workers` (nothing before `start`).
pub fn resize() {
    if !STARTED.load(Ordering::Acquire) {
        return;
    }
    let want = config::WORKERS.load(Ordering::Relaxed).max(1) as usize;
    let mut alive = pool().alive.lock().unwrap_or_else(|e| e.into_inner());
    if alive.len() < want {
        alive.resize(want, false);
    }
    for (id, up) in alive.iter_mut().enumerate().take(want) {
        if !*up {
            *up = true;
            let _ = std::thread::Builder::new()
                .name(format!("member-db-{id}"))
                .spawn(move || worker(id));
        }
    }
}

fn worker(id: usize) {
    let p = pool();
    let mut db = Db::default();
    loop {
        {
            let mut alive = p.alive.lock().unwrap_or_else(|e| e.into_inner());
            if id >= config::WORKERS.load(Ordering::Relaxed).max(1) as usize {
                alive[id] = false;
                return;
            }
        }
        match p.rx.recv_timeout(Duration::from_secs(1)) {
            Ok(mut batch) => {
                let max = config::BATCH_SIZE.load(Ordering::Relaxed).max(1) as usize;
                while batch.len() < max {
                    match p.rx.try_recv() {
                        Ok(more) => batch.extend(more),
                        Err(_) => break,
                    }
                }
                p.queued.fetch_sub(batch.len(), Ordering::Relaxed);
                let mut adds = Vec::new();
                while !batch.is_empty() {
                    let rest = batch.split_off(batch.len().min(max));
                    adds.extend(run_batch(&mut db, batch));
                    batch = rest;
                }
                // ADDs last: this worker may go on running its sets' lanes for a while, one
                // batch of each in turn, so no set's batch waits behind a busy other set.
                let mut lanes: Vec<(String, Vec<AddJob>)> = by_set(adds, |(p, _)| &p.set)
                    .into_iter()
                    .map(|group| {
                        let set = group[0].0.set.clone();
                        let run = ADDS.offer(&set, group, max);
                        (set, run)
                    })
                    .collect();
                while !lanes.is_empty() {
                    lanes.retain(|(_, run)| !run.is_empty());
                    for (set, run) in &mut lanes {
                        run_adds(&mut db, std::mem::take(run));
                        *run = ADDS.done(set, max);
                    }
                    // The queue stays served while this worker runs lanes: under a steady
                    // stream of ADDs to a few sets every worker may be running a lane, and the
                    // lookups queued meanwhile must not wait for the stream to end.
                    if let Ok(more) = p.rx.try_recv() {
                        p.queued.fetch_sub(more.len(), Ordering::Relaxed);
                        for group in by_set(run_batch(&mut db, more), |(p, _)| &p.set) {
                            let set = group[0].0.set.clone();
                            let run = ADDS.offer(&set, group, max);
                            lanes.push((set, run));
                        }
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Runs `f` on the worker's connection, containing a panic (the jobs it owned are dropped
/// and answer their clients with their fallback).
fn contained(db: &mut Db, f: impl FnOnce(&mut Db)) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(db))) {
        db.reset();
        let what = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message")
            .to_string();
        crate::server::mainq::post(Box::new(move |ctx| {
            crate::server::reply::log(
                ctx,
                crate::server::reply::Level::Warning,
                &format!(
                    "libmember: a database job panicked (contained; its clients got \
                     UNAVAILABLE): {what}"
                ),
            )
        }));
    }
}

/// Groups points by set, keeping arrival order within each group.
fn by_set<T>(points: Vec<T>, set: impl Fn(&T) -> &str) -> Vec<Vec<T>> {
    let mut groups: Vec<Vec<T>> = Vec::new();
    for p in points {
        match groups.iter_mut().find(|g| set(&g[0]) == set(&p)) {
            Some(g) => g.push(p),
            None => groups.push(vec![p]),
        }
    }
    groups
}

/// Answers every point of a group with the result at its index, or the group's error.
fn answer<T: Clone>(points: Vec<Point<T>>, results: Result<Vec<T>, DbErr>) {
    match results {
        Ok(rs) => {
            for (p, r) in points.into_iter().zip(rs) {
                (p.reply)(Ok(r));
            }
        }
        Err(e) => {
            for p in points {
                (p.reply)(Err(e.clone()));
            }
        }
    }
}

/// An ADD waiting for its set's multi-row insert.
type AddJob = (Point<bool>, Option<f64>);

/// The ADDs of each set, combined across workers (`combine.rs`).
static ADDS: LazyLock<Combiner<AddJob>> = LazyLock::new(Combiner::default);

/// ADDs of one set in one multi-row insert (one statement, one commit).
fn run_adds(db: &mut Db, group: Vec<AddJob>) {
    contained(db, |db| {
        let items: Vec<(&str, &str, Option<f64>)> = group
            .iter()
            .map(|(p, exp)| (p.entity.as_str(), p.scope.as_str(), *exp))
            .collect();
        let twins: Vec<Option<&str>> = group.iter().map(|(p, _)| p.twin.as_deref()).collect();
        count_batch(items.len());
        let res = members::add_many(db, &group[0].0.set, &items, &twins);
        answer(group.into_iter().map(|(p, _)| p).collect(), res);
    });
}

/// Runs one ADD at once, alone, on the calling worker (from a job that checked something
/// first).
pub fn add_now(db: &mut Db, point: Point<bool>, expires_at: Option<f64>) {
    run_adds(db, vec![(point, expires_at)]);
}

/// Runs a batch's jobs except its ADDs, which it returns (the caller combines them).
fn run_batch(db: &mut Db, batch: Vec<Job>) -> Vec<AddJob> {
    let mut lookups = Vec::new();
    let mut adds = Vec::new();
    for job in batch {
        match job {
            Job::Lookup(p) => lookups.push(p),
            Job::Add(p, exp) => adds.push((p, exp)),
            Job::Run(f) => contained(db, f),
        }
    }
    for group in by_set(lookups, |p| &p.set) {
        contained(db, |db| {
            let items: Vec<(&str, &str)> = group
                .iter()
                .map(|p| (p.entity.as_str(), p.scope.as_str()))
                .collect();
            let twins: Vec<&str> = group
                .iter()
                .map(|p| p.twin.as_deref().unwrap_or_default())
                .collect();
            count_batch(items.len());
            let res = members::lookup_many(db, &group[0].set, &items, &twins);
            answer(group, res);
        });
    }
    adds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_set_in_arrival_order() {
        let g = by_set(
            vec![("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5)],
            |p| p.0,
        );
        assert_eq!(
            g,
            vec![
                vec![("a", 1), ("a", 3)],
                vec![("b", 2), ("b", 5)],
                vec![("c", 4)]
            ]
        );
    }
}
