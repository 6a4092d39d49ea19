//! The module's transient memory: what a sync page, a rebuild's build parts or a
//! filter payload hold while in flight, counted per node and per set, checked against the
//! `maxmemory` headroom before anything sizeable is allocated, and shown by INFO / MEMBER.INFO.
//!
//! Use: `let held = transient::admit_for(set, bytes)?;` before allocating `bytes` (refused with
//! [`NO_HEADROOM`] when they would take the server past `maxmemory`), or `transient::hold(bytes)`
//! for memory that must be taken anyway; keep the [`Held`] as long as the memory lives (move it
//! along with the buffer), `resize` it when the buffer grows or shrinks. Dropping it gives the
//! bytes back. Every operation is a few relaxed atomics: cheap on any thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The fixed start of every refusal for lack of headroom (followed by the sizes).
pub const NO_HEADROOM: &str = "not enough memory left under maxmemory";

/// A current count of transient bytes and the most it reached since the server started.
#[derive(Debug, Default)]
pub struct Gauge {
    current: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    /// Bytes held now.
    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }

    /// The most bytes held at once since the server started.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    fn add(&self, bytes: u64) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, bytes: u64) {
        self.current.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The node's gauge (every [`Held`], whatever its set).
static NODE: Gauge = Gauge {
    current: AtomicU64::new(0),
    peak: AtomicU64::new(0),
};

/// Bytes the server may still allocate before `maxmemory` (`u64::MAX` without a limit),
/// measured on the main thread at most once a second (`limits::refresh_memory_budget`), read
/// by rebuild threads before they allocate a filter.
static MEMORY_BUDGET: AtomicU64 = AtomicU64::new(u64::MAX);

/// The node's transient bytes when the headroom was last read (`MEMORY_BUDGET` was measured
/// with them already allocated): what was taken since counts against the headroom.
static AT_REFRESH: AtomicU64 = AtomicU64::new(0);

/// Steps that were refused, or waited, because they did not fit under `maxmemory`.
static MEMORY_WAITS: AtomicU64 = AtomicU64::new(0);

fn sets() -> &'static Mutex<HashMap<String, Arc<Gauge>>> {
    static SETS: OnceLock<Mutex<HashMap<String, Arc<Gauge>>>> = OnceLock::new();
    SETS.get_or_init(Default::default)
}

/// The gauge of `set` (made on first use; kept for the life of the process, a set created
/// again under the same name shares it).
pub fn set_gauge(set: &str) -> Arc<Gauge> {
    let mut m = sets().lock().unwrap_or_else(|e| e.into_inner());
    m.entry(set.to_string()).or_default().clone()
}

/// `set`'s current transient bytes and peak since start (0, 0 for a set that never held any).
pub fn of_set(set: &str) -> (u64, u64) {
    let m = sets().lock().unwrap_or_else(|e| e.into_inner());
    m.get(set).map_or((0, 0), |g| (g.current(), g.peak()))
}

/// The node's transient bytes now.
pub fn current() -> u64 {
    NODE.current()
}

/// The most transient bytes the node held at once since the server started.
pub fn peak() -> u64 {
    NODE.peak()
}

/// Steps refused or held back for lack of headroom under `maxmemory` (INFO `memory_waits`).
pub fn memory_waits() -> u64 {
    MEMORY_WAITS.load(Ordering::Relaxed)
}

/// Counts one step that waited (or was refused) for lack of headroom.
pub fn count_wait() {
    MEMORY_WAITS.fetch_add(1, Ordering::Relaxed);
}

/// Transient bytes, counted from creation until drop. Not `Clone`: each byte is given back once.
#[derive(Debug)]
#[must_use = "the bytes are given back when the Held is dropped"]
pub struct Held {
    bytes: u64,
    set: Option<Arc<Gauge>>,
}

impl Held {
    fn new(bytes: u64, set: Option<Arc<Gauge>>) -> Held {
        NODE.add(bytes);
        if let Some(g) = &set {
            g.add(bytes);
        }
        Held { bytes, set }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The buffer now takes `bytes` (grown or shrunk); the peaks follow a growth.
    pub fn resize(&mut self, bytes: u64) {
        let gauges = std::iter::once(&NODE).chain(self.set.as_deref());
        if bytes >= self.bytes {
            let more = bytes - self.bytes;
            gauges.for_each(|g| g.add(more));
        } else {
            let less = self.bytes - bytes;
            gauges.for_each(|g| g.sub(less));
        }
        self.bytes = bytes;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.resize(0);
    }
}

/// Counts `bytes` as held by the node, unchecked: for memory that must be taken anyway (or
/// is too small to matter).
pub fn hold(bytes: u64) -> Held {
    Held::new(bytes, None)
}

/// [`hold`], counted for `set` as well.
pub fn hold_for(set: &str, bytes: u64) -> Held {
    Held::new(bytes, Some(set_gauge(set)))
}

/// Counts `bytes` as held by the node if they fit in the `maxmemory` headroom (see
/// [`headroom`]); otherwise refuses with [`NO_HEADROOM`] and the sizes, holding nothing, and
/// counts the refusal in `memory_waits`.
pub fn admit(bytes: u64) -> Result<Held, String> {
    admit_to(bytes, None)
}

/// [`admit`], counted for `set` as well.
pub fn admit_for(set: &str, bytes: u64) -> Result<Held, String> {
    admit_to(bytes, Some(set))
}

fn admit_to(bytes: u64, set: Option<&str>) -> Result<Held, String> {
    if let Err(e) = fits(bytes, headroom()) {
        count_wait();
        return Err(e);
    }
    Ok(Held::new(bytes, set.map(set_gauge)))
}

/// Bytes the module may still take before `maxmemory` (`u64::MAX` without a limit): the
/// budget last measured on the main thread ([`memory_budget`], about once a second), less
/// what the module's transient memory grew by since.
pub fn headroom() -> u64 {
    headroom_from(
        memory_budget(),
        current(),
        AT_REFRESH.load(Ordering::Relaxed),
    )
}

fn headroom_from(budget: u64, current: u64, at_refresh: u64) -> u64 {
    if budget == u64::MAX {
        return budget;
    }
    budget.saturating_sub(current.saturating_sub(at_refresh))
}

/// The budget last measured: bytes the server may still allocate before `maxmemory`
/// (`u64::MAX` without a limit, or before the first measure).
pub fn memory_budget() -> u64 {
    MEMORY_BUDGET.load(Ordering::Relaxed)
}

/// The server's budget was just measured as `budget`: it already accounts for what is held
/// now. Main thread, from `limits::refresh_memory_budget`.
pub fn measured(budget: u64) {
    MEMORY_BUDGET.store(budget, Ordering::Relaxed);
    AT_REFRESH.store(current(), Ordering::Relaxed);
}

/// Refuses `bytes` that do not fit in `headroom`, with the fixed text and both sizes.
pub fn fits(bytes: u64, headroom: u64) -> Result<(), String> {
    if bytes > headroom {
        return Err(format!(
            "{NO_HEADROOM}: this step needs {bytes} bytes, {headroom} are left; the module \
             never makes the server evict keys for itself (raise maxmemory)"
        ));
    }
    Ok(())
}

/// Refuses a filter of `bytes` that would take the server past `maxmemory`.
pub fn check_memory(bytes: u64, budget: u64) -> Result<(), String> {
    if bytes > budget {
        return Err(format!(
            "the filter would need {bytes} bytes, more than the {budget} bytes left under \
             maxmemory; raise maxmemory, lower CAPACITY or raise ERROR"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_check_names_both_sizes() {
        assert!(check_memory(10, u64::MAX).is_ok());
        assert!(check_memory(10, 10).is_ok());
        let e = check_memory(11, 10).unwrap_err();
        assert!(
            e.contains("11 bytes") && e.contains("10 bytes left under maxmemory"),
            "{e}"
        );
    }

    // The node gauge is shared by the tests of this binary running in parallel: only the
    // per-set gauges (one name per test) are checked exactly.

    #[test]
    fn a_held_amount_is_given_back_on_drop_and_the_peak_stays() {
        let a = hold_for("transient_t1", 100);
        let mut b = hold_for("transient_t1", 50);
        assert_eq!(of_set("transient_t1"), (150, 150));
        assert!(peak() >= 150);
        b.resize(400);
        assert_eq!(of_set("transient_t1"), (500, 500));
        b.resize(10);
        assert_eq!(of_set("transient_t1"), (110, 500));
        assert_eq!(b.bytes(), 10);
        drop(a);
        drop(b);
        assert_eq!(of_set("transient_t1"), (0, 500));
        assert_eq!(of_set("never_held"), (0, 0));
    }

    #[test]
    fn headroom_counts_what_was_taken_since_it_was_measured() {
        assert_eq!(headroom_from(u64::MAX, 10, 0), u64::MAX, "no maxmemory");
        assert_eq!(headroom_from(1000, 300, 100), 800);
        // Memory given back since the measure does not make room twice.
        assert_eq!(headroom_from(1000, 50, 100), 1000);
        assert_eq!(headroom_from(100, 500, 0), 0);
    }

    #[test]
    fn a_step_that_does_not_fit_is_refused_with_the_fixed_text() {
        assert!(fits(10, 10).is_ok());
        let e = fits(11, 10).unwrap_err();
        assert!(e.starts_with(NO_HEADROOM), "{e}");
        assert!(e.contains("11 bytes") && e.contains("10 are left"), "{e}");
        assert!(e.contains("maxmemory"));
    }

    #[test]
    fn admit_holds_only_what_it_admits() {
        // No maxmemory measured in unit tests: the budget is unlimited.
        let waits = memory_waits();
        let h = admit_for("transient_t2", 1 << 40).unwrap();
        assert_eq!(memory_waits(), waits, "an admitted step is no wait");
        assert_eq!(of_set("transient_t2"), (1 << 40, 1 << 40));
        drop(h);
        assert_eq!(of_set("transient_t2").0, 0);
    }
}
