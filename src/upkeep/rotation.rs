//! Carries every online key rotation forward from a primary (docs/security.md, "Rotating a
//! tokenized set's key online"): one step at a time on a worker, for each rotating set, paced
//! so that a step is followed by a rest a third as long as it took (the database spends at
//! most three quarters of its time on it; `make bench ARGS="--only rotation"` measures what
//! lookups keep meanwhile). The steps are the catalog's: any primary may run the next one
//! (the set's rotation lock keeps two from running one), so a rotation goes on after a
//! crash, a restart or a failover of the node that started it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis_module::{Context, ContextFlags};

use crate::db::sql::rotation::Phase;
use crate::db::sql::rotation_copy as copy;
use crate::db::sql::rotation_rewrite::{self as rewrite, PAGES};
use crate::db::sql::rotation_steps::{self as rotation, Step};
use crate::db::sql::{nodes_lacking, Needed};
use crate::db::{pool, DbErr};
use crate::server::{mainq, reply};
use crate::sets::state;
use crate::upkeep::node_report;

/// Rows a step of a copy (a rotation an earlier build started) or of its drain handles.
pub const BATCH: i64 = 10_000;

/// How this node drives one set's rotation: what MEMBER.INFO shows of it.
#[derive(Clone, Debug, Default)]
pub struct Pace {
    /// A step is running.
    running: bool,
    /// When the next step may start.
    next: Option<Instant>,
    /// Rows this node's steps copied or deleted, and since when.
    pub rows: u64,
    pub since: Option<Instant>,
    /// Why the last step failed (`None` after one that did not).
    pub last_error: Option<String>,
    /// The nodes the last step found not computing the new form yet, by run id.
    pub waiting_for: Vec<String>,
    /// About how many rows are left to copy or delete, as the last step left the catalog.
    pub left: Option<i64>,
    /// Since when steps have failed (the log says so once, and again when one succeeds).
    paused_since: Option<Instant>,
}

/// Per rotating set this node drives.
static PACE: Mutex<BTreeMap<String, Pace>> = Mutex::new(BTreeMap::new());

/// Rotations this node started and has not yet driven a step of: the others it drives it
/// took over (after a restart, a failover), which the log says.
static STARTED_HERE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// This node has just started `set`'s rotation.
pub fn started_here(set: &str) {
    STARTED_HERE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(set.to_string());
}

/// How this node drives `set`'s rotation, if it does.
pub fn status(set: &str) -> Option<Pace> {
    PACE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(set)
        .cloned()
}

/// Ends a step in flight when dropped without `finished` (the queue dropped the job): the
/// next sweep tries again.
struct Flight(Option<String>);

impl Flight {
    /// The step ran: `finished` takes over.
    fn land(mut self) {
        self.0 = None;
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        if let Some(set) = self.0.take() {
            let mut pace = PACE.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = pace.get_mut(&set) {
                p.running = false;
            }
        }
    }
}

/// What the step of one set is to do, read on the main thread.
struct Due {
    set: String,
    phase: Phase,
    /// The old chain's length.
    n: usize,
    to: String,
    /// Rows copied so far, as this node last read the catalog.
    copied: i64,
    /// The catalog says every node's filter covers the end (switching).
    covered: bool,
    /// The rotation rewrites rows in place (else it copies them: an earlier build began it).
    in_place: bool,
}

/// From the housekeeping sweep: starts the next step of every rotating set whose rest is
/// over. Primaries only; in a cluster, the primary holding the slot of the set's name (the
/// one its CREATE and ALTER go to), so that one node drives it and says so in its log.
pub fn tick(ctx: &Context, now: Instant) {
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        return;
    }
    let cluster = crate::server::cluster_mode::enabled();
    let due: Vec<Due> = state::with(|r| {
        r.sets
            .values()
            .filter_map(|s| {
                let rot = s.rotation.as_ref()?;
                let name = s.def.name.as_bytes();
                if cluster && !crate::cluster::owner::owns(crate::model::slot::keyslot(name)) {
                    return None;
                }
                let len = rot.chain.chain().len();
                let n = if rot.row.phase.before_end() {
                    len
                } else {
                    len - 1
                };
                Some(Due {
                    set: s.def.name.clone(),
                    phase: rot.row.phase,
                    n,
                    to: rot.row.to.clone(),
                    copied: rot.row.copied,
                    covered: rot.row.covered,
                    in_place: rot.row.in_place,
                })
            })
            .collect()
    });
    let mut pace = PACE.lock().unwrap_or_else(|e| e.into_inner());
    pace.retain(|set, _| due.iter().any(|d| &d.set == set));
    for d in due {
        let mine = STARTED_HERE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&d.set);
        if !pace.contains_key(&d.set) && !mine {
            // A rotation another node (or this one before a restart) started.
            reply::log(
                ctx,
                reply::Level::Notice,
                &format!(
                    "libmember: rotation of set '{}' taken over by this node in its {} \
                     phase ({} rows copied so far)",
                    d.set,
                    d.phase.name(),
                    d.copied
                ),
            );
        }
        let p = pace.entry(d.set.clone()).or_default();
        if p.running || p.next.is_some_and(|at| now < at) {
            continue;
        }
        p.running = true;
        p.since.get_or_insert(now);
        let flight = Flight(Some(d.set.clone()));
        pool::run(move |db| {
            let started = Instant::now();
            let res = run_step(db, &d);
            let took = started.elapsed();
            flight.land();
            mainq::post(Box::new(move |ctx| finished(ctx, d, res, took)));
        });
    }
}

/// What a step did, for the log.
enum Done {
    Copied(Step),
    Ended(Step),
    Swept(Step),
    /// Nodes that do not compute the new form yet, and the rows left as the sweep before
    /// found them.
    Waiting(Vec<String>, Option<i64>),
    /// Every node's filter covers the end: recorded (nodes of a cluster switch on it); the
    /// rows left as the sweep found them.
    Covered(Option<i64>),
    DrainStarted,
    /// Rows deleted, whether the rotation is over, rows left.
    Drained(u64, bool, Option<i64>),
}

fn run_step(db: &mut crate::db::Db, d: &Due) -> Result<Result<Done, String>, DbErr> {
    let to = d.to.clone();
    let wrap = move |o: &str| crate::config::token_key::wrap(&to, o);
    Ok(match d.phase {
        Phase::Rewriting => {
            // Not before every node follows the rotation: a command planned before a node
            // learned it asks (or deletes) the old form alone, and would miss a row rewritten.
            // A node reports that it follows once no such command is in flight
            // (`db::in_flight`).
            let behind = nodes_lacking(db, Needed::Form(&d.set, d.n), node_report::FRESH)?;
            if !behind.is_empty() {
                return Ok(Ok(Done::Waiting(behind, None)));
            }
            match rewrite::rewrite_step(db, &d.set, d.n, PAGES, &wrap)? {
                Ok(s) if s.copy_done && !s.busy && !s.stale => {
                    match rewrite::end(db, &d.set, d.n, &wrap)? {
                        Ok(e) if e.stale || e.busy => Ok(Done::Copied(e)),
                        Ok(e) => Ok(Done::Ended(e)),
                        Err(e) => Err(e),
                    }
                }
                Ok(s) => Ok(Done::Copied(s)),
                Err(e) => Err(e),
            }
        }
        Phase::Copying => match copy::copy_step(db, &d.set, d.n, BATCH, &wrap)? {
            Ok(s) if s.copy_done && !s.busy && !s.stale => {
                // Not before every node follows the rotation: one that has not learned it
                // writes no twin, and its row, committed after the end, would reach the
                // twin's owner only through the change log (in a cluster, another node).
                let following = Needed::Form(&d.set, d.n);
                let behind = nodes_lacking(db, following, node_report::FRESH)?;
                if !behind.is_empty() {
                    return Ok(Ok(Done::Waiting(behind, s.left)));
                }
                match copy::end(db, &d.set, d.n, &wrap)? {
                    Ok(e) if e.stale || e.busy => Ok(Done::Copied(e)),
                    Ok(e) => Ok(Done::Ended(e)),
                    Err(e) => Err(e),
                }
            }
            Ok(s) => Ok(Done::Copied(s)),
            Err(e) => Err(e),
        },
        Phase::Switching => {
            let swept = match d.in_place {
                true => rewrite::rewrite_step(db, &d.set, d.n, 0, &wrap)?,
                false => copy::sweep_step(db, &d.set, d.n, &wrap)?,
            };
            let swept = match swept {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            let serving = Needed::Form(&d.set, d.n + 1);
            let behind = nodes_lacking(db, serving, node_report::FRESH)?;
            if swept.busy {
                Ok(Done::Waiting(behind, swept.left))
            } else if !behind.is_empty() {
                // Before nodes switch in a cluster: every node's filter must cover the end.
                let covered = Needed::Covered(&d.set, d.n + 1);
                if d.covered || !nodes_lacking(db, covered, node_report::FRESH)?.is_empty() {
                    return Ok(Ok(Done::Waiting(behind, swept.left)));
                }
                let s = rotation::mark_covered(db, &d.set)?;
                Ok(if s.busy || s.stale {
                    Done::Waiting(behind, swept.left)
                } else {
                    Done::Covered(swept.left)
                })
            } else {
                let s = rotation::drain_start(db, &d.set)?;
                Ok(if s.busy || s.stale {
                    Done::Swept(s)
                } else {
                    Done::DrainStarted
                })
            }
        }
        Phase::Draining => {
            // The end drops the twin column and refuses old forms: not before every node
            // follows the drain (a node still in the switching phase writes both forms).
            let lagging = Needed::Draining(&d.set, d.n + 1);
            let may_end = nodes_lacking(db, lagging, node_report::FRESH)?.is_empty();
            if d.in_place {
                return Ok(rewrite::drain_step(db, &d.set, d.n, may_end, &wrap)?
                    .map(|(done, over)| Done::Drained(done, over, Some(0))));
            }
            let (gone, over, left) = copy::drain_step(db, &d.set, d.n, BATCH, may_end)?;
            Ok(Done::Drained(gone, over, left))
        }
    })
}

/// Back on the main thread: the rest before the next step, the log, and a catalog re-read
/// when the phase changed (this node follows at once; the others at their next check).
fn finished(ctx: &Context, d: Due, res: Result<Result<Done, String>, DbErr>, took: Duration) {
    let failed = !matches!(res, Ok(Ok(_)));
    // A step that moved the rotation on is followed by the next one soon. One that did not
    // (another node holds the rotation's lock, the catalog's phase had moved on, nodes have
    // yet to switch) is tried again a tenth of a second later, and one that failed a second
    // later: asking the database 50 times a second would change nothing sooner.
    let worked = match &res {
        Ok(Ok(Done::Copied(s) | Done::Ended(s) | Done::Swept(s))) => !s.busy && !s.stale,
        Ok(Ok(Done::Drained(gone, over, _))) => *gone > 0 || *over,
        Ok(Ok(Done::DrainStarted | Done::Covered(_))) => true,
        _ => false,
    };
    let least = match (failed, worked) {
        (true, _) => Duration::from_secs(1),
        (false, true) => Duration::from_millis(20),
        (false, false) => Duration::from_millis(100),
    };
    // A third: with a quarter, lookups kept 0.71–0.78× their speed in the bench, too near
    // the 0.7× they must keep.
    let rest = (took / 3).max(least);
    // A pause is logged when it starts and when it ends, not at every step that fails in it.
    let paused_since = {
        let mut pace = PACE.lock().unwrap_or_else(|e| e.into_inner());
        let p = pace.entry(d.set.clone()).or_default();
        let since = p.paused_since;
        p.paused_since = if failed {
            since.or(Some(Instant::now()))
        } else {
            None
        };
        since
    };
    if let (false, Some(since)) = (failed, paused_since) {
        reply::log(
            ctx,
            reply::Level::Notice,
            &format!(
                "libmember: rotation of set '{}' resumed after {:.1} s paused",
                d.set,
                since.elapsed().as_secs_f64()
            ),
        );
    }
    let mut reread = false;
    let line = match &res {
        Err(_) | Ok(Err(_)) if paused_since.is_some() => None,
        Err(e) => Some(format!(
            "libmember: rotation of set '{}' paused: {}",
            d.set,
            e.reply_text()
        )),
        Ok(Err(e)) => Some(format!(
            "libmember: rotation of set '{}' paused: {e}",
            d.set
        )),
        Ok(Ok(Done::Ended(s))) => {
            reread = true;
            let done = match d.in_place {
                true => "every row is in the new form",
                false => "every row has its twin",
            };
            Some(format!(
                "libmember: rotation of set '{}': {done} ({} in the last step); the chain now \
                 names the new key, nodes switch as their filters pass the end",
                d.set, s.copied
            ))
        }
        Ok(Ok(Done::Covered(_))) => {
            reread = true;
            Some(format!(
                "libmember: rotation of set '{}': every node's filter covers the end (in a \
                 cluster, nodes switch now)",
                d.set
            ))
        }
        Ok(Ok(Done::DrainStarted)) => {
            reread = true;
            let what = match d.in_place {
                true => "draining the old forms a late writer adds",
                false => "deleting the old forms",
            };
            Some(format!(
                "libmember: rotation of set '{}': every node computes the new form; {what}",
                d.set
            ))
        }
        Ok(Ok(Done::Drained(gone, true, _))) => {
            reread = true;
            let how = if d.in_place { "rewritten" } else { "deleted" };
            Some(format!(
                "libmember: rotation of set '{}' ended: no row of the old form is left ({gone} \
                 {how} in the last step)",
                d.set
            ))
        }

        Ok(Ok(_)) => None,
    };
    if let Some(line) = line {
        let level = if matches!(res, Ok(Ok(_))) {
            reply::Level::Notice
        } else {
            reply::Level::Warning
        };
        reply::log(ctx, level, &line);
    }
    if reread {
        crate::sets::catalog::reread();
    }
    let mut pace = PACE.lock().unwrap_or_else(|e| e.into_inner());
    let p = pace.entry(d.set).or_default();
    p.running = false;
    p.next = Some(Instant::now() + rest);
    // The next step starts when the rest is over, not at the sweep after it.
    crate::server::timer::after(ctx, rest, |ctx, ()| tick(ctx, Instant::now()), ());
    p.rows += match &res {
        Ok(Ok(Done::Copied(s) | Done::Ended(s) | Done::Swept(s))) => s.copied as u64,
        Ok(Ok(Done::Drained(gone, _, _))) => *gone,
        _ => 0,
    };
    match &res {
        Ok(Ok(Done::Copied(s) | Done::Ended(s) | Done::Swept(s))) if s.left.is_some() => {
            p.left = s.left
        }
        Ok(Ok(
            Done::Drained(_, _, Some(left))
            | Done::Waiting(_, Some(left))
            | Done::Covered(Some(left)),
        )) => p.left = Some(*left),
        _ => {}
    }
    p.waiting_for = match &res {
        Ok(Ok(Done::Waiting(nodes, _))) => nodes.clone(),
        _ => Vec::new(),
    };
    p.last_error = match res {
        Err(e) => Some(e.reply_text()),
        Ok(Err(e)) => Some(e),
        Ok(Ok(_)) => None,
    };
}
