//! This node's report to the database (`member_nodes`: run id, port, role, ring of keys),
//! written from the housekeeping sweep every `REPORT_EVERY` and at the first sweep after the ring
//! or a rotating set's state changes,
//! so that `MEMBER.KEYS NODES` on any node shows which nodes hold which key
//! (docs/security.md, "Key rings").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis_module::{Context, ContextFlags};

use crate::db::{pool, sql};
use crate::server::repl_info;
use crate::sets::state;

/// How often a node reports itself.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// A node not heard from for this long is not shown (it stopped, or cannot reach the
/// database, and so answers nothing from it either).
pub const FRESH: Duration = Duration::from_secs(30);

/// A report is being written.
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
/// When the last report was started.
static LAST: Mutex<Option<Instant>> = Mutex::new(None);
/// What the last report said of the ring and of the rotating sets: the chain lengths
/// computed and the filters that cover their rotation's end (a change is reported at once).
static SAID: Mutex<Said> = Mutex::new((Vec::new(), Vec::new(), Vec::new(), Vec::new()));

/// The ring's ids and fingerprints, then sets with a chain length: computed, covered,
/// draining.
type Said = (
    Vec<(String, String)>,
    Vec<(String, usize)>,
    Vec<(String, usize)>,
    Vec<(String, usize)>,
);

/// Each set whose key rotates, with the length of the chain this node computes for it, once
/// no database work this node planned before it learned the rotation is in flight (so a
/// rotation that rewrites rows in place may start: docs/rotation-in-place.md).
fn serving() -> Vec<(String, usize)> {
    state::with(|r| {
        r.sets
            .values()
            .filter(|s| {
                s.rotation
                    .as_ref()
                    .is_some_and(|rot| crate::db::in_flight::settled(rot.since))
            })
            .map(|s| (s.def.name.clone(), s.def.tokenize.chain().len()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    })
}

/// From the housekeeping sweep: starts a report when one is due, once the catalog (which
/// makes the table) has been read.
pub fn tick(ctx: &Context, now: Instant) {
    if IN_FLIGHT.load(Ordering::Acquire) || !state::with(|r| r.catalog.loaded) {
        return;
    }
    // A ring changed by CONFIG SET as much as by MEMBER.KEYS RELOAD: reported at once, so a
    // ROTATE-KEY right after it is not refused for this node's older report.
    let now_says = (
        crate::config::token_key::entries(),
        serving(),
        crate::sets::rotation::covered(ctx),
        crate::sets::rotation::draining(),
    );
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    let due = *said != now_says || last.is_none_or(|t| now >= t + REPORT_EVERY);
    if !due {
        return;
    }
    let Some(node) = repl_info::run_id(ctx) else {
        return;
    };
    *last = Some(now);
    said.clone_from(&now_says);
    let (ring, serving, covered, draining) = now_says;
    let report = sql::NodeReport {
        node,
        cluster_id: if crate::server::cluster_mode::enabled() {
            crate::cluster::peers::my_id()
        } else {
            String::new()
        },
        port: repl_info::tcp_port(ctx).unwrap_or(0),
        role: if ctx.get_flags().contains(ContextFlags::SLAVE) {
            "replica"
        } else {
            "primary"
        },
        ring,
        serving,
        covered,
        draining,
    };
    IN_FLIGHT.store(true, Ordering::Release);
    let flight = Flight;
    pool::run(move |db| {
        // A failed report is tried again at the next due sweep; until then the node's last
        // report stands, and after `FRESH` the node is no longer shown.
        let _ = sql::report(db, &report);
        drop(flight);
    });
}

/// Ends the report in flight when dropped: after the job ran, or with the job if a full
/// queue dropped it.
struct Flight;

impl Drop for Flight {
    fn drop(&mut self) {
        IN_FLIGHT.store(false, Ordering::Release);
    }
}
