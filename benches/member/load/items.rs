//! Load generator 4: a fixed list of items, each looked up exactly once, by `clients` threads
//! with one connection each; a probe taken once every connection is open and again before any
//! closes, so what connecting costs stays outside the measured window.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Instant;

use crate::*;

/// Every `(item, is_member)` of `items` once, spread over `clients` threads, each with the
/// worker `make(thread)` returns; `op(worker, item)` answers membership. Returns the load and
/// `probe()` taken just before the first lookup and just after the last one.
pub(crate) fn items_load<W, M, O, P, T>(
    clients: usize,
    items: &[(String, bool)],
    make: M,
    op: O,
    probe: P,
) -> (Stats, T, T)
where
    M: Fn(usize) -> W + Sync,
    O: Fn(&mut W, &str) -> Result<bool, String> + Sync,
    P: Fn() -> T,
{
    // Connected → (probe) → go → done → (probe) → close.
    let gate = Barrier::new(clients + 1);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<ThreadResult>> = Mutex::new(Vec::new());
    let (before, after) = thread::scope(|s| {
        for t in 0..clients {
            let (gate, next, results, make, op) = (&gate, &next, &results, &make, &op);
            s.spawn(move || {
                let mut w = make(t);
                let mut lat = Vec::with_capacity(items.len() / clients + 1);
                let (mut ops, mut errors, mut wrong, mut first) = (0u64, 0u64, 0u64, None);
                gate.wait();
                gate.wait();
                let start = Instant::now();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((item, member)) = items.get(i) else {
                        break;
                    };
                    let t0 = Instant::now();
                    match op(&mut w, item) {
                        Ok(answer) if answer == *member => {}
                        Ok(_) => wrong += 1,
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
                gate.wait();
                gate.wait();
                drop(w);
            });
        }
        gate.wait();
        let before = probe();
        gate.wait();
        gate.wait();
        let after = probe();
        gate.wait();
        (before, after)
    });
    (merge(results.into_inner().unwrap()), before, after)
}
