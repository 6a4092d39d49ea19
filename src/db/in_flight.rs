//! The database work this node has in flight, by the epoch it was planned in: a rotating
//! set's rows may be rewritten in place only once no command a node planned before it learned
//! the rotation (asking, or deleting, the old form alone) can still reach the database
//! (docs/rotation-in-place.md, "Rewriting"). Every job the pool takes is counted under the
//! epoch current when it was submitted, until it has run or was dropped; learning a rotation
//! begins a new epoch, and the node reports that it follows the rotation once every job of
//! the epochs before has ended.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The epoch jobs submitted now are counted under.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Jobs not ended, per epoch (an epoch with none has no entry).
static OPEN: Mutex<BTreeMap<u64, usize>> = Mutex::new(BTreeMap::new());

/// A job counted in flight until this is dropped (with the job: run, or dropped unrun).
pub struct Flight(u64);

impl Flight {
    /// Counts a job submitted now.
    pub fn begin() -> Flight {
        let epoch = EPOCH.load(Ordering::Acquire);
        *OPEN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(epoch)
            .or_default() += 1;
        Flight(epoch)
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.0);
            }
        }
    }
}

/// Begins a new epoch (main thread, as a change of what commands are planned with takes
/// effect) and returns it: the jobs submitted from now on are counted under it.
pub fn next_epoch() -> u64 {
    EPOCH.fetch_add(1, Ordering::AcqRel) + 1
}

/// Whether every job submitted before `epoch` began has ended.
pub fn settled(epoch: u64) -> bool {
    OPEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .range(..epoch)
        .next()
        .is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_settles_when_every_job_before_it_has_ended() {
        let before = Flight::begin();
        let epoch = next_epoch();
        assert!(!settled(epoch), "a job of the epoch before is in flight");
        let after = Flight::begin();
        assert!(!settled(epoch));
        drop(before);
        assert!(settled(epoch), "only a job of the new epoch is left");
        assert!(!settled(next_epoch()), "a later epoch waits for it");
        drop(after);
    }
}
