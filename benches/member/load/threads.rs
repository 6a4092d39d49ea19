//! Load generator 1: threads with one connection each, one operation per call (the redis and
//! postgres crates' clients, for everything compared with PostgreSQL or the application pattern).

use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::*;

/// `threads` threads, each with the worker `make(thread)` returns, calling `op` in a loop for
/// `dur`. `op` returns Ok(true) for a correct answer, Ok(false) for a wrong one.
pub(crate) fn thread_load<W, M, O>(threads: usize, dur: Duration, make: M, op: O) -> Stats
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
