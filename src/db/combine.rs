//! The write combiner: the ADDs of one set that arrive while that set's insert is running wait
//! for it and then go together in the next one (group commit), instead of each worker sending
//! whatever its own envelope held.

use std::collections::HashMap;
use std::sync::Mutex;

/// Multi-row inserts of one set running at the same time, at most. With one, every statement
/// carries everything that arrived while the previous one ran; the second keeps the database's
/// second core busy while the first commits (measured in `make bench`, section `writepath`,
/// docs/sync.md "Write path").
pub const IN_FLIGHT: usize = 2;

/// One set's lane: the jobs waiting for a statement, and the statements running.
struct Lane<J> {
    waiting: Vec<J>,
    running: usize,
}

/// Lanes by set name. Guarantee: a job offered is either handed back to run at once, or
/// waits in a lane that has a statement running, whose worker takes it when that statement
/// ends (`done`): no job is left behind with nobody to run it.
pub struct Combiner<J> {
    lanes: Mutex<HashMap<String, Lane<J>>>,
}

impl<J> Default for Combiner<J> {
    fn default() -> Self {
        Combiner {
            lanes: Mutex::new(HashMap::new()),
        }
    }
}

impl<J> Combiner<J> {
    /// Offers `jobs` of `set`. Returns the batch (at most `max` jobs) the caller must run now
    /// and then report with `done`, or nothing when `IN_FLIGHT` statements of the set run
    /// already (the jobs wait for one of them).
    pub fn offer(&self, set: &str, jobs: Vec<J>, max: usize) -> Vec<J> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let lane = lanes.entry(set.to_string()).or_insert(Lane {
            waiting: Vec::new(),
            running: 0,
        });
        lane.waiting.extend(jobs);
        if lane.running >= IN_FLIGHT || lane.waiting.is_empty() {
            if lane.running == 0 {
                lanes.remove(set);
            }
            return Vec::new();
        }
        lane.running += 1;
        take(&mut lane.waiting, max)
    }

    /// A batch of `set` handed out by `offer` or `done` has run. Returns the next batch the
    /// caller must run (and report again), or nothing when none waits.
    pub fn done(&self, set: &str, max: usize) -> Vec<J> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let Some(lane) = lanes.get_mut(set) else {
            return Vec::new();
        };
        if !lane.waiting.is_empty() {
            return take(&mut lane.waiting, max);
        }
        lane.running = lane.running.saturating_sub(1);
        if lane.running == 0 {
            lanes.remove(set);
        }
        Vec::new()
    }
}

/// The first `max` (at least one) of `waiting`, in arrival order.
fn take<J>(waiting: &mut Vec<J>, max: usize) -> Vec<J> {
    let n = waiting.len().min(max.max(1));
    let rest = waiting.split_off(n);
    std::mem::replace(waiting, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_offered_while_the_lane_is_full_go_in_the_next_batch_together() {
        let c = Combiner::default();
        let first = c.offer("s", vec![1], 100);
        let second = c.offer("s", vec![2], 100);
        assert_eq!((first, second), (vec![1], vec![2]));
        // Both statements of `s` run: these wait, and another set is not held up.
        assert!(c.offer("s", vec![3, 4], 100).is_empty());
        assert!(c.offer("s", vec![5], 100).is_empty());
        assert_eq!(c.offer("t", vec![9], 100), vec![9]);
        assert_eq!(c.done("s", 100), vec![3, 4, 5]);
        assert!(c.done("s", 100).is_empty());
        assert!(c.done("s", 100).is_empty());
        assert!(c.done("t", 100).is_empty());
        assert!(c.lanes.lock().unwrap().is_empty());
    }

    #[test]
    fn a_batch_holds_at_most_max_jobs_and_the_rest_follow() {
        let c = Combiner::default();
        assert_eq!(c.offer("s", vec![1, 2, 3, 4, 5], 2), vec![1, 2]);
        assert_eq!(c.offer("s", vec![6], 2), vec![3, 4]);
        assert!(c.offer("s", vec![7], 2).is_empty());
        assert_eq!(c.done("s", 2), vec![5, 6]);
        assert_eq!(c.done("s", 2), vec![7]);
        assert!(c.done("s", 2).is_empty());
        assert!(c.done("s", 2).is_empty());
        // The lane is gone and starts afresh.
        assert_eq!(c.offer("s", vec![8], 2), vec![8]);
    }

    #[test]
    fn no_job_is_left_waiting_without_a_running_statement() {
        // Random interleavings of offers and completions: whenever nothing runs, nothing waits.
        let mut rng = 0x5eed_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let c = Combiner::default();
        let mut running: Vec<Vec<u32>> = Vec::new();
        let mut ran = 0usize;
        let mut offered = 0usize;
        for i in 0..10_000u32 {
            if next() % 2 == 0 || running.is_empty() {
                let n = (next() % 4) as usize;
                offered += n;
                let b = c.offer("s", (0..n as u32).map(|k| i * 8 + k).collect(), 3);
                if !b.is_empty() {
                    running.push(b);
                }
            } else {
                let k = (next() as usize) % running.len();
                ran += running.swap_remove(k).len();
                let b = c.done("s", 3);
                if !b.is_empty() {
                    running.push(b);
                }
            }
            assert!(running.len() <= IN_FLIGHT);
            let lanes = c.lanes.lock().unwrap();
            let waiting = lanes.get("s").map_or(0, |l| l.waiting.len());
            assert!(waiting == 0 || !running.is_empty(), "stranded at step {i}");
        }
        while !running.is_empty() {
            ran += running.pop().unwrap().len();
            let b = c.done("s", 3);
            if !b.is_empty() {
                running.push(b);
            }
        }
        assert_eq!(ran, offered);
    }
}
