//! The worker pool: `member.workers` threads, each with its own connection, draining one
//! bounded queue. A job that panics is contained; its blocked client still gets a reply.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::Db;
use crate::config;

/// A unit of database work. It owns its blocked client (if any), so dropping it unrun still
/// answers the client.
pub type Job = Box<dyn FnOnce(&mut Db) + Send>;

/// Jobs waiting beyond this many are refused with UNAVAILABLE rather than queued.
pub const QUEUE_LIMIT: usize = 100_000;

struct Pool {
    tx: Sender<Job>,
    rx: Receiver<Job>,
    alive: Mutex<Vec<bool>>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let (tx, rx) = bounded(QUEUE_LIMIT);
        Pool {
            tx,
            rx,
            alive: Mutex::new(Vec::new()),
        }
    })
}

/// Queues a job. When the queue is full the job is dropped, which answers its client with
/// the job's fallback error.
pub fn submit(job: Job) {
    if let Err(e) = pool().tx.try_send(job) {
        drop(e.into_inner());
    }
}

/// Jobs waiting for a worker.
pub fn queued() -> usize {
    pool().rx.len()
}

/// Starts or stops workers to match `member.workers`.
pub fn resize() {
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
            Ok(job) => {
                if catch_unwind(AssertUnwindSafe(|| job(&mut db))).is_err() {
                    db.reset();
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
