//! The sync loop (docs/sync.md): one pass per node for every set reads the change log by
//! transaction id, so outside writes reach the filters within about `member.sync-interval-ms`,
//! late commits included, and a filter loaded from a snapshot catches up before it says "absent".
//! Here: when passes start and what they read; what a finished one does is `sync/apply.rs`.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use redis_module::{Context, RedisString};

use crate::db::sql::{self, Changes};
use crate::db::{pool, source, DbErr};
use crate::model::canon::Normalize;
use crate::model::slotset::SlotSet;
use crate::sets::state::{Source, SourceSync};

use crate::sets::state;
use crate::{config, filter::store, server::mainq};

pub use crate::model::set_upkeep::SyncState;

mod apply;
mod page;

/// The node's loop: at most one pass in flight, and what the last one cost.
#[derive(Debug, Default)]
pub struct Loop {
    in_flight: bool,
    /// A promotion asked for a pass while one (from the old epoch) was in flight.
    again: bool,
    next: Option<Instant>,
    /// Sets registered, and sets with a watermark, when the last pass started.
    registered: usize,
    covered: BTreeSet<String>,
    last_prune: Option<Instant>,
    /// Sets whose tables do not feed the change log, as of the last pass.
    pub blind: BTreeSet<String>,
    /// Whether the first pass's verdict has been logged.
    announced: bool,
    /// A filter was installed since the last look (a CREATE's build, a replicated load): it
    /// gets its first pass at once, not an interval later.
    fresh: bool,
    /// A change notification arrived (`notify.rs`): a pass starts as soon as none is in
    /// flight and `NOTIFY_MIN_GAP` has passed since the last one started.
    woken: bool,
    last_start: Option<Instant>,
    /// Passes started by a notification (not by the interval).
    pub woken_passes: u64,
    pub passes: u64,
    pub statements: u64,
    pub rows: u64,
    /// Rows the passes read from the change log (`rows` is what they applied).
    pub rows_read: u64,
    pub last_statements: u64,
    pub last_rows: u64,
}

thread_local! {
    static LOOP: RefCell<Loop> = RefCell::new(Loop::default());
}

/// The loop's state, for INFO. Main thread only.
pub fn with_loop<R>(f: impl FnOnce(&Loop) -> R) -> R {
    LOOP.with(|l| f(&l.borrow()))
}

/// How often one node prunes the change log (any node may; they serialize in the database).
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Woken passes start at least this far apart: a storm of outside writes costs a node at most
/// 100 passes a second.
pub const NOTIFY_MIN_GAP: Duration = Duration::from_millis(10);

/// The main thread's tick: takes a notification's wake-up and starts a pass if one may start
/// now (none in flight, the gap kept); otherwise the wake-up waits, queued, for a later tick.
pub fn poke(ctx: &Context) {
    let ready = LOOP.with(|l| {
        let mut l = l.borrow_mut();
        if crate::upkeep::notify::take_wake() {
            l.woken = true;
        }
        l.woken && !l.in_flight && gap_kept(&l, Instant::now())
    });
    if ready {
        run(ctx, false);
    }
}

fn gap_kept(l: &Loop, now: Instant) -> bool {
    l.last_start
        .is_none_or(|t| now.duration_since(t) >= NOTIFY_MIN_GAP)
}

/// A set taking part in a pass: its filter's watermark when the pass started.
struct Member {
    name: String,
    /// The set's incarnation when the pass started: a set dropped (and maybe created
    /// again) since gets nothing from this pass.
    incarnation: u64,
    from: i64,
    /// An attached set synced by UPDATED-COLUMN: its rows come from its own poll, and its
    /// watermark is a time (docs/attach.md).
    time: bool,
}

/// Starts a pass over every set whose filter has a watermark, if one is due (or at once, if
/// `now_all`: a promotion). Sends two statements in one snapshot (three when it also
/// prunes), whatever the number of sets; none when no filter has a watermark.
pub fn run(ctx: &Context, now_all: bool) {
    let now = Instant::now();
    let registered = state::with(|r| r.sets.len());
    let on_time = LOOP.with(|l| {
        let l = l.borrow();
        if l.in_flight {
            return None;
        }
        let due = now_all || l.next.is_none_or(|t| now >= t);
        let woke = l.woken && gap_kept(&l, now);
        let on_time = due || woke;
        // A set learned, or a filter installed, since the last pass gets its first pass at
        // once, not an interval later.
        (on_time || registered != l.registered || l.fresh).then_some((on_time, woke && !due))
    });
    let Some((on_time, by_wake)) = on_time else {
        if now_all {
            LOOP.with(|l| l.borrow_mut().again = true);
        }
        return;
    };
    LOOP.with(|l| {
        let mut l = l.borrow_mut();
        l.fresh = false;
        // Whatever happens next (a pass, or nothing to catch up), this wake-up is served.
        if on_time {
            l.woken = false;
        }
    });
    type Polled = Option<(Source, Normalize)>;
    type Extra = Option<SlotSet>;
    let sets: Vec<(String, u64, RedisString, Normalize, Polled, Extra)> = state::with(|r| {
        r.sets
            .values()
            .map(|s| {
                let polled = s
                    .def
                    .source
                    .as_ref()
                    .filter(|src| matches!(src.sync, SourceSync::Updated(_)))
                    .map(|src| (src.clone(), s.def.normalize));
                (
                    s.def.name.clone(),
                    s.incarnation,
                    s.filter_key.clone(),
                    s.def.normalize,
                    polled,
                    s.cover_extra.clone(),
                )
            })
            .collect()
    });
    let mut members = Vec::new();
    let mut norms = HashMap::new();
    let mut polls = Vec::new();
    // Cluster mode: the slots whose logged rows this pass reads (`apply::read_covers`).
    let mut read = crate::server::cluster_mode::enabled().then(ReadSlots::default);
    for (name, incarnation, key, norm, polled, extra) in sets {
        // Only a filter with a watermark can be caught up; others wait for their rebuild.
        let Some(Some(from)) = store::with(ctx, &key, |f| f.cov.watermark) else {
            continue;
        };
        let time = polled.is_some();
        if source::is_time(from) != time {
            // A watermark of the other kind (a filter restored across a DROP and a CREATE
            // that changed the sync mode) proves nothing: rebuilt, never caught up.
            store::with_mut(ctx, &key, |f| f.cov.complete = false);
            continue;
        }
        match polled {
            Some(p) => polls.push((name.clone(), p, from)),
            None => {
                norms.insert(name.clone(), norm);
                if let Some(read) = read.as_mut() {
                    store::with(ctx, &key, |f| read.add(f.slots.as_ref()));
                    read.add_extra(extra.as_ref());
                }
            }
        }
        members.push(Member {
            name,
            incarnation,
            from,
            time,
        });
    }
    let news = LOOP.with(|l| {
        let l = l.borrow();
        members.iter().any(|m| !l.covered.contains(&m.name))
    });
    if members.is_empty() || !(on_time || news) {
        // Nothing to catch up (yet): look again at the next sweep or interval.
        if !members.is_empty() {
            LOOP.with(|l| l.borrow_mut().registered = registered);
        }
        return;
    }
    LOOP.with(|l| {
        let mut l = l.borrow_mut();
        l.next = Some(now + config::sync_interval());
        l.last_start = Some(now);
        if by_wake {
            l.woken_passes += 1;
        }
        l.registered = registered;
        l.covered = members.iter().map(|m| m.name.clone()).collect();
    });
    // The change log is read from the oldest transaction-id watermark (none: no log read).
    let from = members.iter().filter(|m| !m.time).map(|m| m.from).min();
    let prune = LOOP.with(|l| {
        let mut l = l.borrow_mut();
        l.in_flight = true;
        let due = l
            .last_prune
            .is_none_or(|t| now.duration_since(t) >= PRUNE_EVERY);
        if due {
            l.last_prune = Some(now);
        }
        due.then(config::change_retention_s)
    });
    page::begin(&members);
    let read = read.and_then(ReadSlots::into_slots);
    let slots = read.clone();
    let pass = Pass {
        read,
        started: now,
        epoch: state::with(|r| r.epoch),
        generation: crate::db::identity::generation(),
        members,
        result: Some(Err(DbErr::Unavailable("sync job dropped".into()))),
    };
    let lookback = config::source_lookback_ms();
    pool::run(move |db| {
        let mut pass = pass;
        // Which history this pass reads (docs/failover.md): learned again on its connection,
        // and checked once more inside its snapshot below.
        pass.generation = crate::db::identity::learn_for_pass(db);
        let timeline = crate::db::identity::history().map(|h| h.timeline);
        // Each page goes to the main thread as soon as it is read (docs/sync.md, "Paging");
        // the pass's result follows the last one through the same queue.
        let mut pager = page::Pager::new(|page, ack| {
            mainq::post(Box::new(move |ctx| {
                let _ack = ack;
                page::apply(ctx, page);
            }))
        });
        let mut sink = |p| pager.send(p);
        let mut res = match from {
            Some(from) => {
                let read = (timeline.is_some(), slots.as_ref());
                sql::changes_since(db, from, read, &norms, prune, &mut sink)
            }
            None => Ok(Changes::default()),
        };
        if let Ok(ch) = &res {
            // How far this history has gone: its next transaction id never falls below this
            // again unless the server went back in time (db/identity.rs).
            crate::db::identity::passed(pass.generation, ch.horizon);
            if ch.timeline.is_some() && ch.timeline != timeline {
                res = Err(DbErr::Unavailable(format!(
                    "the database's timeline moved during the sync pass ({} to {}): the pass \
                     is made again on the new history",
                    timeline.unwrap_or_default(),
                    ch.timeline.unwrap_or_default()
                )));
            }
        }
        if let Ok(ch) = res.as_mut() {
            // One statement per UPDATED-COLUMN set; a failing one (its table dropped, a
            // privilege revoked) holds back only its own set.
            for (name, src, from) in polls {
                match source::poll(db, &name, &src, from, lookback, &mut sink) {
                    Ok(horizon) => {
                        ch.time_horizons.insert(name, horizon);
                    }
                    Err(e) => {
                        ch.poll_errors.insert(name, e.reply_text());
                    }
                }
                ch.statements += 1;
            }
        }
        pass.result = Some(res);
    });
}

/// One pass in flight. However it ends (done, or dropped unrun), its result goes back to the
/// main thread exactly once.
struct Pass {
    started: Instant,
    /// Promotion epoch when the pass started.
    epoch: u64,
    /// The database identity's generation the pass read in (`db::identity::generation`).
    generation: u64,
    members: Vec<Member>,
    /// Cluster mode: the slots whose logged rows the pass read (`None`: every row).
    read: Option<SlotSet>,
    result: Option<Result<Changes, DbErr>>,
}

impl Drop for Pass {
    fn drop(&mut self) {
        let (started, epoch, generation) = (self.started, self.epoch, self.generation);
        let members = std::mem::take(&mut self.members);
        let read = self.read.take();
        let res = self
            .result
            .take()
            .unwrap_or(Err(DbErr::Unavailable("sync lost".into())));
        mainq::post(Box::new(move |ctx| {
            apply::apply(
                ctx,
                (started, epoch, generation),
                members,
                read.as_ref(),
                res,
            )
        }));
    }
}

/// Cluster mode: the union of the slots the pass's filters cover and will cover (a fill or
/// a rebuild in flight), built while the pass starts. A filter that covers every slot makes
/// the pass read every row.
#[derive(Default)]
struct ReadSlots {
    slots: SlotSet,
    all: bool,
}

impl ReadSlots {
    fn add(&mut self, covers: Option<&SlotSet>) {
        match covers {
            Some(s) => self.slots.union_with(s),
            None => self.all = true,
        }
    }

    fn add_extra(&mut self, extra: Option<&SlotSet>) {
        if let Some(e) = extra {
            self.slots.union_with(e);
        }
    }

    /// The slots to read, `None` for all of them.
    fn into_slots(self) -> Option<SlotSet> {
        (!self.all).then_some(self.slots)
    }
}

/// A filter value was just installed at some set's key: the next sweep looks at once.
pub fn filter_installed() {
    LOOP.with(|l| l.borrow_mut().fresh = true);
}

/// Time since the last successful pass, for MEMBER.INFO.
pub fn age(s: &SyncState) -> Option<Duration> {
    s.last_ok.map(|t| t.elapsed())
}

/// `visible` when `set` (or, for `None`, every set) feeds the change log, else `blind`.
pub fn horizon(set: Option<&str>) -> &'static str {
    let blind = with_loop(|l| match set {
        Some(s) => l.blind.contains(s),
        None => !l.blind.is_empty(),
    });
    if blind {
        "blind"
    } else {
        "visible"
    }
}
