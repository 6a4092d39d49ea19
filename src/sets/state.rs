//! Main-thread state: the sets this node knows (from the catalog), their recent-writes marks,
//! invalidation generations, rebuild progress and counters. Thread-local: only the server's
//! main thread (commands, callbacks, timers) ever touches it, so no lock is taken.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis_module::RedisString;

use crate::model::slotset::SlotSet;
use crate::server::metrics::PathCounters;
use crate::sets::catalog_copy::Catalog;
use crate::sets::keys;
use crate::sets::lapsed::Lapsed;
use crate::sets::marks::Marks;

pub use crate::model::set_def::{SetChange, SetDef, Source, SourceSync};

/// FNV-1a for set names: a handful of short keys looked up on every call, where SipHash's
/// setup cost shows in profiles and flooding is not a concern (names are validated).
pub struct NameHasher(u64);
impl Default for NameHasher {
    fn default() -> Self {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}
impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A running or finished filter build.
// One per set, mostly Idle: the definition a running build carries is not worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Rebuild {
    Idle,
    Running {
        reason: crate::model::set_upkeep::Reason,
        /// The definition the build sizes its filter by (ERROR, CAPACITY).
        built_for: SetDef,
        /// Promotion epoch when the build started.
        epoch: u64,
        started: Instant,
        rows: Arc<AtomicU64>,
        estimate: Arc<AtomicU64>,
        /// Items added while the build ran; folded into the new filter at the swap.
        journal: Vec<u128>,
        /// MEMBER.REBUILD SYNC and MEMBER.CREATE callers waiting for the outcome.
        waiters: Vec<(RebuildWaiter, crate::model::set_upkeep::Reply)>,
        /// More adds arrived than `member.max-journal` allows: the build is abandoned at its
        /// end (the old filter received every add and keeps serving).
        overflowed: bool,
    },
}

/// Who waits for a running rebuild's outcome; each hears it exactly once.
pub enum RebuildWaiter {
    /// A blocked client: MEMBER.REBUILD SYNC, MEMBER.CREATE, MEMBER.ALTER SYNC.
    Client(crate::server::block::Blocked),
    /// A cluster-wide REBUILD SYNC another node asked for: given the rows loaded or why the
    /// rebuild failed (main thread).
    Then(RebuildThen),
}

/// What a [`RebuildWaiter::Then`] runs with the rebuild's outcome.
pub type RebuildThen = Box<dyn FnOnce(&redis_module::Context, Result<u64, String>)>;

/// Rows loaded and time taken, or why it failed.
pub type RebuildOutcome = Result<(u64, Duration), String>;

/// Source of `SetState::incarnation`.
static NEXT_INCARNATION: AtomicU64 = AtomicU64::new(1);

/// Everything the main thread knows about one set.
pub struct SetState {
    pub def: SetDef,
    /// Never reused in this process: work started for a set that was then dropped (and maybe
    /// created again) is recognised as stale when it ends.
    pub incarnation: u64,
    pub filter_key: RedisString,
    /// The filter value last found at `filter_key` (see `store::Remembered`).
    pub filter_ref: crate::filter::store::Remembered,
    /// `member:<set>`, the name ACL key patterns are matched against (see `acl.rs`), made once.
    pub acl_key: RedisString,
    pub cache_prefix: Vec<u8>,
    /// Identity of the catalog row this set was learned from, when known (see
    /// `sql::CatalogRow`): a different one means the set was dropped and created again.
    pub catalog_id: Option<i64>,
    /// The catalog version of the last MEMBER.ALTER applied here (0: none).
    pub altered_version: i64,
    marks: Marks,
    /// Bumped by every ADD/DEL effect; a lookup that started under an older generation does
    /// not fill the cache (it may have read a row that a concurrent DEL just removed).
    pub generation: u64,
    pub rebuild: Rebuild,
    /// When the last rebuild ended, and its rows and duration or its error.
    pub last_rebuild: Option<(Instant, RebuildOutcome)>,
    /// Why the last rebuild ran.
    pub last_rebuild_reason: Option<crate::model::set_upkeep::Reason>,
    /// Automatic growth of the filter (`grow.rs`).
    pub grow: crate::model::set_upkeep::Grow,
    pub next_rebuild_try: Option<Instant>,
    /// Rebuilds that failed in a row (0 after one that did not): the wait before the next
    /// automatic try doubles with each ([`retry_after_failures`]).
    pub rebuild_failures: u32,
    pub sync: crate::model::set_upkeep::SyncState,
    /// The promotion epoch in which this set's filter last caught up (see `Registry::epoch`).
    pub synced_epoch: u64,
    /// Identity (`FilterValue::id`) of the one filter value that may answer "absent" for this
    /// set: the value this process installed (CREATE, rebuild, live replication) or the sync
    /// loop caught up from its own watermark, and that has received every ADD since. Any
    /// other value found at the key (renamed or moved back, copied over, swapped in,
    /// restored) falls through to cache and database until a sync pass catches it up.
    pub trusted: Option<u64>,
    /// When the work that last brought the trusted filter current (a sync pass that caught it
    /// up, or the rebuild that built it) started. In a cluster, a slot's negatives count only
    /// when this is late enough after the slot was taken (`cluster/owner.rs`).
    pub covered_since: Option<Instant>,
    /// Cluster mode: slots whose sync rows are applied to the filter besides those it covers:
    /// the slots of a slot fill or a rebuild in flight, whose rows must not be missed meanwhile.
    pub cover_extra: Option<SlotSet>,
    /// Cluster mode: the slots a slot fill in flight reads (`slot_fill.rs`).
    pub filling: Option<SlotSet>,
    /// A filter the primary replicated, being verified off the main thread
    /// (`replica_load.rs`): the adds applied meanwhile, folded in at the swap.
    pub pending_load: Option<PendingLoad>,
    /// Members that lapsed since the filter was built (`lapsed.rs`): their lookups are not
    /// the filter's false positives.
    pub lapsed: Lapsed,
    pub stats: PathCounters,
    /// The online key rotation the set is in, as this node follows it (`rotation.rs`).
    pub rotation: Option<crate::sets::rotating::Rotating>,
}

/// A replicated filter in flight on a replica (see `replica_load.rs`).
#[derive(Debug)]
pub struct PendingLoad {
    /// Which `MEMBER._LOAD` this is: a later one supersedes it.
    pub seq: u64,
    /// Items added while it was parsed.
    pub journal: Vec<u128>,
}

impl SetState {
    pub fn new(def: SetDef) -> Self {
        let incarnation = NEXT_INCARNATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        SetState {
            incarnation,
            filter_key: keys::filter_key(&def.name),
            filter_ref: Default::default(),
            acl_key: RedisString::create(None, crate::model::set_def::acl_key(&def.name)),
            cache_prefix: keys::cache_prefix(&def.name),
            catalog_id: None,
            altered_version: 0,
            def,
            marks: Marks::default(),
            generation: 0,
            rebuild: Rebuild::Idle,
            last_rebuild: None,
            last_rebuild_reason: None,
            grow: Default::default(),
            next_rebuild_try: None,
            rebuild_failures: 0,
            sync: Default::default(),
            synced_epoch: 0,
            trusted: None,
            covered_since: None,
            cover_extra: None,
            filling: None,
            pending_load: None,
            lapsed: Lapsed::default(),
            stats: PathCounters::default(),
            rotation: None,
        }
    }

    /// Items were just added to the filter value `at` at this set's key (`None`: there was
    /// none of ours). If that is not the trusted value, the trusted value is elsewhere (moved
    /// or renamed away) and missed them: it is trusted no more, wherever it is.
    pub fn filter_added(&mut self, at: Option<u64>) {
        if at.is_none() || self.trusted != at {
            self.trusted = None;
        }
    }

    /// A sync pass applied `rows` rows to the value at the key, which it caught up
    /// (`caught`, see `FilterValue::apply_sync`) or not.
    /// `started`: when the pass started.
    pub fn filter_synced(&mut self, caught: Option<u64>, rows: bool, started: Instant) {
        if caught.is_some() {
            self.trusted = caught;
            self.covered_since = Some(started);
        } else if rows {
            self.trusted = None;
        }
    }

    /// An ADD of `hash` is starting: from now until its effects are applied (and RECENT-TTL
    /// after), a filter negative for it is not trusted.
    pub fn mark_begin(&mut self, hash: u128) {
        self.marks
            .begin(hash, Duration::from_secs(self.def.recent_ttl));
    }

    /// An ADD of `hash` finished (its filter bit, if any, is set).
    pub fn mark_end(&mut self, hash: u128) {
        self.marks
            .end(hash, Duration::from_secs(self.def.recent_ttl));
    }

    /// A write of `hash` another node runs is starting (a rotating set's twin, in a cluster):
    /// a filter negative for it is not trusted for `time`, however the write ends.
    pub fn hold_recent(&mut self, hash: u128, time: Duration) {
        self.marks.hold(hash, time);
    }

    /// A DEL of `hash` is starting (a rotating set's, in a cluster): for `time`, neither the
    /// exact-match key nor a cache fill answers for it (`funnel::gate`).
    pub fn hold_delete(&mut self, hash: u128, time: Duration) {
        self.marks.hold_delete(hash, time);
    }

    /// True while a DEL of `hash` is held (`hold_delete`).
    #[inline]
    pub fn is_deleting(&self, hash: u128) -> bool {
        self.marks.deleting(hash)
    }

    /// True when a write of `hash` is in flight or finished within RECENT-TTL.
    #[inline]
    pub fn is_recent(&self, hash: u128) -> bool {
        self.marks.holds(hash)
    }

    /// The database's history changed: marks of ended ADDs are dropped (`Marks::distrust`).
    pub fn distrust_marks(&mut self) {
        self.marks.distrust();
    }

    pub fn recent_marks(&self) -> usize {
        self.marks.len()
    }

    pub(crate) fn purge_marks(&mut self, now: Instant) {
        self.marks.purge(now);
    }

    /// Records an item whose effects were just applied, so a running rebuild (or a replicated
    /// filter still being verified) includes it.
    pub fn journal(&mut self, hash: u128) {
        let max = crate::sets::limits::max_journal();
        if let Rebuild::Running {
            journal,
            overflowed,
            ..
        } = &mut self.rebuild
        {
            if journal.len() < max {
                journal.push(hash);
            } else {
                *overflowed = true;
            }
        }
        if let Some(p) = &mut self.pending_load {
            if p.journal.len() < max {
                p.journal.push(hash);
            } else {
                // Abandoned: its result is dropped on arrival; the current filter serves on.
                self.pending_load = None;
            }
        }
    }
}

#[derive(Default)]
pub struct Registry {
    pub sets: HashMap<String, SetState, BuildHasherDefault<NameHasher>>,
    pub catalog: Catalog,
    pub(crate) last_sweep: Option<Instant>,
    /// Bumped each time this node is promoted to primary, becomes a replica or loses its link
    /// to its primary. A filter answers "absent" only if its set has been caught up (sync pass
    /// or rebuild) by work *started* in the current epoch, late enough (`standing`): the old
    /// primary may have acknowledged ADDs whose effects never arrived here.
    pub epoch: u64,
    /// Set by a promotion or a dataset load; the next sweep starts sync passes for every set
    /// at once.
    pub(crate) promoted: bool,
    /// The node's role and replication link, which decide when work counts towards trusting
    /// a filter in the current epoch (`sets/standing.rs`, docs/replicas.md).
    pub standing: crate::model::standing::Standing,
    /// Times at which a handover grace ends (a promotion, slots taken in a cluster): a sync
    /// pass starts then, whatever the interval, so the filter serves "absent" again promptly.
    pub(crate) catch_ups: Vec<Instant>,
    /// When a sweep last started sync passes early for a filter value no set trusts yet.
    pub(crate) strangers_seen: Option<Instant>,
}

impl Registry {
    /// The set named `name` if it may serve right now without asking the catalog: known,
    /// and not held back after a promotion, unless `confirmed` (the catalog was just asked
    /// about it, which lifts the hold for this name).
    #[inline]
    pub fn serving(&mut self, name: &str, confirmed: bool) -> Option<&mut SetState> {
        if self.catalog.hold && !confirmed {
            return None;
        }
        self.sets.get_mut(name)
    }

    /// The set named `name`, or the error a client should get.
    pub fn find(&mut self, name: &str) -> Result<&mut SetState, redis_module::RedisError> {
        // The error is decided first so that the hot path is a single map lookup.
        let missing = redis_module::RedisError::Str(if self.catalog.loaded {
            crate::model::error::UNKNOWN_SET
        } else {
            crate::model::error::CATALOG_NOT_LOADED
        });
        self.sets.get_mut(name).ok_or(missing)
    }
}

/// A `synced_epoch` no epoch equals: the set has not caught up in any.
pub const NOT_CURRENT: u64 = u64::MAX;

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

/// Access to the registry. Main thread only; never call back into it from inside `f`.
pub fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    REGISTRY.with(|r| f(&mut r.borrow_mut()))
}

/// Starts a sync pass for every set at `at` (the end of a handover grace), not an interval
/// later.
pub fn catch_up_at(at: Instant) {
    with(|r| {
        if !r.catch_ups.contains(&at) {
            r.catch_ups.push(at);
        }
    });
}

/// A dataset was just loaded (full synchronization, DEBUG RELOAD): its filters start not
/// caught up, so the next sweep starts a sync pass for every set at once instead of waiting
/// for each set's next interval.
pub fn after_load() {
    with(|r| r.promoted = true);
}

/// Records that `set`'s filter was caught up by work started at `started`, in `epoch`. Work
/// counts for the epoch only when the node's standing says so: after a promotion, work started
/// a handover grace later (the old primary may still acknowledge an ADD it took before, within
/// its `member.db-timeout-ms`, and only work started after that reads it); on a replica, work
/// started while its link is up, and after it came up (docs/replicas.md).
pub fn synced(r: &mut Registry, set: &str, epoch: u64, started: Instant) {
    if epoch == r.epoch && r.standing.counts(started) {
        if let Some(s) = r.sets.get_mut(set) {
            s.synced_epoch = epoch;
        }
    }
}

/// `id` is the filter value the module just installed at `set`'s key: trusted for "absent" if
/// `trust` (it is current: a build, or a live replica's copy of one), else nothing is.
/// What it covers is not known here: a build says so with [`built_since`].
pub fn installed(r: &mut Registry, set: &str, id: u64, trust: bool) {
    if let Some(s) = r.sets.get_mut(set) {
        s.trusted = trust.then_some(id);
        s.covered_since = None;
        // A fill in flight was for the value replaced (it checks the identity when it ends).
        s.cover_extra = None;
        s.filling = None;
    }
    if let Some(f) = ON_INSTALLED.get() {
        f();
    }
}

/// Told of every filter value installed (`installed`), set once at module load.
static ON_INSTALLED: OnceLock<fn()> = OnceLock::new();

/// Makes `f` hear of every filter value installed from now on (the sync loop, so that its next
/// sweep looks at once). Call once, from module load.
pub fn on_installed(f: fn()) {
    let _ = ON_INSTALLED.set(f);
}

/// The filter just installed for `set` was built by a rebuild that started at `started`.
pub fn built_since(r: &mut Registry, set: &str, started: Instant) {
    if let Some(s) = r.sets.get_mut(set) {
        s.covered_since = Some(started);
        // Built from the table: the members that had lapsed are not in it.
        s.lapsed.clear();
    }
}

/// The tokenized sets this node serves, once for each key of its chain, with that key's
/// fingerprint (`config::token_key` refuses a ring that drops one; MEMBER.KEYS LIST counts
/// them per key).
pub fn tokenized_keys() -> Vec<(String, String)> {
    with(|r| {
        r.sets
            .values()
            .flat_map(|s| {
                let chain = s.def.tokenize.chain();
                // A rotation's target key is in use from its start: twins are made under it.
                let target = s.rotation.as_ref().map(|r| r.row.to.as_str());
                let mut used: Vec<(String, String)> = chain
                    .into_iter()
                    .chain(target)
                    .map(|fp| (s.def.name.clone(), fp.to_string()))
                    .collect();
                used.dedup();
                used
            })
            .collect()
    })
}

/// Registers (or updates) a set definition. True when the set is new to this node.
pub fn register(def: SetDef) -> bool {
    with(|r| match r.sets.get_mut(&def.name) {
        Some(s) => {
            if s.def != def {
                s.def = def;
                // A catalog read sent before this change is not applied over it.
                r.catalog.touch(&s.def.name);
            }
            false
        }
        None => {
            // A set first seen now has no filter older than this epoch to distrust (one
            // loaded from disk is held back until a sync pass trusts it), unless the node's
            // standing holds every filter back (a replica without its link, a grace): then it
            // waits for work that counts, like the others.
            let mut s = SetState::new(def);
            s.synced_epoch = if r.standing.counts(Instant::now()) {
                r.epoch
            } else {
                NOT_CURRENT
            };
            r.catalog.touch(&s.def.name);
            r.sets.insert(s.def.name.clone(), s);
            true
        }
    })
}

/// Removes a set from the registry (it was dropped), returning what this node held for it.
pub fn remove(name: &str) -> Option<SetState> {
    with(|r| {
        let s = r.sets.remove(name)?;
        r.catalog.touch(name);
        r.catalog.removals += 1;
        Some(s)
    })
}

/// True when `name`'s current incarnation on this node is `incarnation`.
pub fn is_current(r: &Registry, name: &str, incarnation: u64) -> bool {
    r.sets
        .get(name)
        .is_some_and(|s| s.incarnation == incarnation)
}

const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The longest wait between automatic tries of a rebuild that keeps failing.
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Delay before retrying a failed catalog load or rebuild.
pub fn retry_at() -> Instant {
    Instant::now() + RETRY_AFTER
}

/// How long a set waits before its next automatic rebuild after `failures` failed in a row
/// (at least 1): 2 s, doubling, at most 5 minutes, so a set this node cannot serve (its table
/// gone, an attached set in cluster mode) is not retried and logged every 2 s for ever. Pure.
pub fn retry_after_failures(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (RETRY_AFTER * (1u32 << doublings)).min(RETRY_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_after_failed_rebuilds_doubles_up_to_five_minutes() {
        let secs: Vec<u64> = (1..=10)
            .map(|n| retry_after_failures(n).as_secs())
            .collect();
        assert_eq!(secs, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(retry_after_failures(u32::MAX).as_secs(), 300);
        assert_eq!(retry_after_failures(0), retry_after_failures(1));
    }
}
