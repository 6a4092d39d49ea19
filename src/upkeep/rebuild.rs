//! Filter (re)builds off the main thread: a dedicated thread streams the table with COPY and
//! builds a new filter; the main thread folds in the adds journaled meanwhile and swaps it in
//! atomically (one key write), then answers any MEMBER.REBUILD SYNC callers
//! (`rebuild_wait.rs`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::{raw, Context, RedisString};

use crate::db::build::Built;
use crate::db::{self, DbErr};
use crate::filter::origin::Origin;
use crate::filter::store;
use crate::filter::value::FilterValue;
use crate::model::slotset::SlotSet;
use crate::sets::state::{self, Rebuild, SetDef};
use crate::{config, server::mainq, server::metrics, server::replication};

use super::rebuild_wait::{tell, wait_as};
pub use crate::model::set_upkeep::{Reason, Reply};

/// Starts a rebuild of `name` for `reason`. Returns false if one is already running (or no
/// such set).
pub fn start(name: &str, reason: Reason) -> bool {
    let started = state::with(|r| {
        let epoch = r.epoch;
        let s = r.sets.get_mut(name)?;
        if matches!(s.rebuild, Rebuild::Running { .. }) {
            return None;
        }
        let rows = Arc::new(AtomicU64::new(0));
        let estimate = Arc::new(AtomicU64::new(0));
        // In a cluster the filter covers the slots this node owns now; their sync rows are
        // applied (and journaled) from now on, whatever the current filter covers.
        let slots = crate::server::cluster_mode::enabled().then(crate::cluster::owner::owned_set);
        if let Some(slots) = &slots {
            s.cover_extra
                .get_or_insert_with(Default::default)
                .union_with(slots);
        }
        s.rebuild = Rebuild::Running {
            reason,
            built_for: s.def.clone(),
            epoch,
            started: Instant::now(),
            rows: rows.clone(),
            estimate: estimate.clone(),
            journal: Vec::new(),
            waiters: Vec::new(),
            overflowed: false,
        };
        Some((
            s.def.clone(),
            (s.incarnation, s.catalog_id),
            rows,
            estimate,
            slots,
        ))
    });
    let Some((def, (incarnation, set_id), rows, estimate, slots)) = started else {
        return false;
    };
    let name = name.to_string();
    let thread_name = name.clone();
    let spawned = std::thread::Builder::new()
        .name("member-rebuild".into())
        .spawn(move || {
            mainq::yield_to_the_server();
            // A panic becomes a failed rebuild, never a stuck one.
            let res = catch_unwind(AssertUnwindSafe(|| {
                let grow = reason == Reason::AutoGrow;
                build(&def, slots.as_ref(), grow, (&*rows, &*estimate))
                    .and_then(|(b, db)| Ready::new(b, &def.name, db, set_id, slots))
            }))
            .unwrap_or_else(|_| Err(DbErr::Failed("rebuild panicked".into())));
            mainq::post(Box::new(move |ctx| {
                finish(ctx, &thread_name, incarnation, res)
            }));
        });
    if let Err(e) = spawned {
        mainq::post(Box::new(move |ctx| {
            finish(
                ctx,
                &name,
                incarnation,
                Err(DbErr::Failed(format!("cannot start thread: {e}"))),
            )
        }));
    }
    true
}

/// On the rebuild's thread: builds the filter of `def` (of `slots`), reading the COPY from
/// `member.pg-rebuild-url` when it is set (a standby), else from `member.pg-url`.
///
/// A rebuild has no statement timeout (it streams the whole table), but it does not queue
/// forever behind a lock (ALTER TABLE, VACUUM FULL): it fails, says why in MEMBER.INFO, and is
/// retried. Also returns the identity of the primary's database, whose transaction ids the
/// watermark counts (`None` when it cannot be read).
fn build(
    def: &SetDef,
    slots: Option<&SlotSet>,
    grow: bool,
    progress: (&AtomicU64, &AtomicU64),
) -> Result<(Built, Option<u128>), DbErr> {
    let lock_timeout = db::build_lock_timeout_ms();
    // The standby first: a rebuild that cannot use it fails before it touches the primary.
    let mut standby = match config::pg_rebuild_link() {
        // An attached set always builds from the primary (`source_of`): no standby is opened.
        Some(_) if def.source.is_some() => None,
        Some(link) => Some((db::standby::connect(&link, lock_timeout)?, link)),
        None => {
            db::link::set_rebuild_error(None);
            None
        }
    };
    let mut c = db::connect_build()?;
    // In a transaction of its own: the connection may be a pooler's.
    let here = db::pinned(&mut c, (0, lock_timeout), |c| Ok(db::identity::stamp(c)))
        .map_err(|e| db::classify(&e))?;
    // Where every node meets every set table: older tables get their slot column here,
    // waiting at most a database timeout for the lock.
    db::keyslot::ensure_slot_column(&mut c, &def.name, config::db_timeout_ms())
        .map_err(|e| db::classify(&e))?;
    db::build::build_filter(
        &mut c,
        standby.as_mut().map(|(s, l)| (s, &*l)),
        def,
        slots,
        grow,
        progress,
    )
    .map(|b| (b, here))
}

/// Where rebuilds read their COPY now: `standby` when `member.pg-rebuild-url` is set, else
/// `primary` (INFO's `rebuild_source`).
pub fn source() -> &'static str {
    match crate::config::PG_REBUILD_URL.shown().trim().is_empty() {
        true => "primary",
        false => "standby",
    }
}

/// Where the rebuilds of the set `def` read their COPY (MEMBER.INFO's `rebuild_source`): an
/// attached set's table is not one the standby path can check (its own triggers, no slot
/// column), so it always builds from the primary.
pub fn source_of(def: &crate::sets::state::SetDef) -> &'static str {
    if def.source.is_some() {
        "primary"
    } else {
        source()
    }
}

/// A finished build, made ready off the main thread: the filter and its serialized form
/// (what replicas and the AOF receive), so the swap itself only folds in the journal and
/// stores a pointer, whatever the filter's size.
struct Ready {
    filter: FilterValue,
    payload: Payload,
    rows: u64,
    /// The COPY, the construction, the serialization (seconds), for the log.
    times: [f64; 3],
    /// Where the COPY was read: `primary` or `standby`.
    source: &'static str,
    /// Bytes of rows spilled to a file during the build.
    spilled: u64,
    /// The new filter's bytes, counted as transient until the swap.
    filter_held: crate::server::transient::Held,
}

/// A filter payload as a server string, created off the main thread so that replicating it
/// copies nothing there.
/// Its bytes are counted as the set's transient memory until it is freed.
struct Payload(
    RedisString,
    #[allow(dead_code)] crate::server::transient::Held,
);

// SAFETY: a string created without a context is a standalone heap object that nothing else
// references; the rebuild thread creates it and hands it over whole to the main thread,
// which replicates it. The server holds a reference of its own only while it propagates
// (until the current execution unit ends); `free_later` releases ours after that, when the
// string is again referenced by nothing else. The allocator is thread-safe.
unsafe impl Send for Payload {}

impl Payload {
    /// The filter's serialized form, written straight into a server string made for it:
    /// the payload exists once, so a rebuild holds the old filter, the new one and one
    /// payload at most (not a second copy of the payload on its way into the string).
    fn of(filter: &FilterValue, held: crate::server::transient::Held) -> Payload {
        let len = filter.payload_len();
        // SAFETY: a string created without a context from a null pointer is a new,
        // zero-filled string of `len` bytes (`createStringObject(NULL, len)`), referenced by
        // nothing else yet; its bytes are written once, here, before anything reads it, and
        // the slice ends before the string is handed on.
        let s = unsafe {
            let inner =
                raw::RedisModule_CreateString.unwrap()(std::ptr::null_mut(), std::ptr::null(), len);
            let mut got = 0usize;
            let ptr = raw::RedisModule_StringPtrLen.unwrap()(inner, &mut got);
            assert_eq!(
                got, len,
                "the server made a payload string of another length"
            );
            filter.write_into(std::slice::from_raw_parts_mut(ptr as *mut u8, len));
            RedisString::from_redis_module_string(std::ptr::null_mut(), inner)
        };
        Payload(s, held)
    }

    /// Freeing a large string on the main thread costs about 0.1 ms a megabyte (1 ms for the
    /// 11.5 MB payload of 10 000 000 members): a large one is released on a thread of its own,
    /// from a timer, so that the server's propagation of it (which holds a reference until the
    /// execution unit ends) is over by then.
    fn free_later(self, ctx: &Context) {
        if self.0.as_slice().len() < crate::filter::data_type::FREE_LATER_BYTES {
            return;
        }
        ctx.create_timer(
            Duration::from_millis(1),
            |_, p: Payload| {
                let _ = std::thread::Builder::new()
                    .name("member-free".into())
                    .spawn(move || drop(p));
            },
            self,
        );
    }
}

impl Ready {
    /// On the rebuild thread. The filter is stamped with the database it was built from
    /// (`db`, the primary's, whose transaction ids its watermark counts) and the set's catalog
    /// row `set_id` (`filter_origin`), which a node loading it later checks before it trusts
    /// it; a build that could not read its database's identity stamps none.
    fn new(
        built: Built,
        set: &str,
        db: Option<u128>,
        set_id: Option<i64>,
        slots: Option<crate::model::slotset::SlotSet>,
    ) -> Result<Ready, DbErr> {
        let serialize = Instant::now();
        let mut filter = FilterValue::built(built.bloom, built.watermark, set);
        filter.slots = slots;
        filter.origin = db.map(|db| Origin { db, set_id });
        // The payload, written straight into its server string: refused (the rebuild fails,
        // the old filter keeps serving) when it does not fit under maxmemory.
        let held = crate::server::transient::admit_for(set, filter.payload_len() as u64)
            .map_err(DbErr::Invalid)?;
        let payload = Payload::of(&filter, held);
        Ok(Ready {
            times: [
                built.copy_time.as_secs_f64(),
                built.construct_time.as_secs_f64(),
                serialize.elapsed().as_secs_f64(),
            ],
            payload,
            filter,
            rows: built.rows,
            spilled: built.spilled,
            filter_held: built.held,
            source: if built.from_standby {
                "standby"
            } else {
                "primary"
            },
        })
    }
}

/// Main thread: swaps a finished build in, or records why it failed (the old filter keeps
/// serving; an incomplete one keeps falling through to the database). A build of a set that
/// was dropped meanwhile (and maybe created again) is discarded.
fn finish(ctx: &Context, name: &str, incarnation: u64, res: Result<Ready, DbErr>) {
    let done = state::with(|r| {
        let s = r.sets.get_mut(name)?;
        if s.incarnation != incarnation {
            return None;
        }
        let Rebuild::Running {
            reason,
            built_for,
            epoch,
            started,
            journal,
            waiters,
            overflowed,
            ..
        } = std::mem::replace(&mut s.rebuild, Rebuild::Idle)
        else {
            return None;
        };
        // ERROR or CAPACITY changed while it ran: this build is installed (it is complete),
        // and one with the new settings follows at once.
        let again = built_for.filter_differs(&s.def);
        Some((
            (s.def.clone(), s.catalog_id, overflowed),
            s.filter_key.clone(),
            (epoch, started, reason, again),
            journal,
            waiters,
        ))
    });
    let Some((
        (def, catalog_id, overflowed),
        key,
        (epoch, started, reason, again),
        journal,
        waiters,
    )) = done
    else {
        return;
    };
    // A journal that could not hold every add would leave the new filter short of some: the
    // build is abandoned, and the old filter (which received them all) keeps serving.
    let res = match res {
        Ok(_) if overflowed => Err(DbErr::Invalid(format!(
            "more adds arrived during the rebuild than member.max-journal ({}) allows; the \
             previous filter keeps serving",
            crate::sets::limits::max_journal()
        ))),
        res => res,
    };
    // The definition travels with every build, ahead of the filter: a replica (or the AOF)
    // that missed it — a set whose CREATE is still building, a full resync — learns it here.
    replication::replicate_set(ctx, &def, catalog_id);
    let outcome = match res {
        Ok(Ready {
            mut filter,
            payload,
            rows,
            source,
            times,
            spilled,
            filter_held: _counted_until_the_swap,
        }) => {
            let swap = Instant::now();
            let bits = filter.bloom.bits();
            // Built from a database or history the node no longer follows (a failover while
            // it ran; docs/failover.md): installed incomplete, so it never answers "absent",
            // and built again by the next sweep.
            let stale = stale_origin(filter.origin.as_ref());
            if stale {
                filter.cov.complete = false;
            }
            filter.bloom.add_many(&journal);
            replication::replicate_built_filter(ctx, &key, &payload.0, &journal);
            payload.free_later(ctx);
            let id = store::install(ctx, &key, filter);
            metrics::global(|m| m.rebuilds_done += 1);
            state::with(|r| {
                state::installed(r, name, id, !stale);
                state::built_since(r, name, started);
                state::synced(r, name, epoch, started)
            });
            crate::server::reply::log(
                ctx,
                crate::server::reply::Level::Notice,
                &format!(
                    "libmember: rebuilt set '{name}' ({}, from the {}): {rows} members in {:.3} \
                     s (COPY {:.3} s, construction {:.3} s, serialization {:.3} s), filter of \
                     {} bits, {spilled} bytes of rows spilled to a file; the swap ({} journaled \
                     adds) held the main thread {:.3} ms",
                    reason.name(),
                    source,
                    started.elapsed().as_secs_f64(),
                    times[0],
                    times[1],
                    times[2],
                    bits,
                    journal.len(),
                    swap.elapsed().as_secs_f64() * 1e3
                ),
            );
            Ok((rows, started.elapsed()))
        }
        Err(e) => {
            metrics::global(|m| m.rebuilds_failed += 1);
            crate::server::reply::log(
                ctx,
                crate::server::reply::Level::Warning,
                &format!(
                    "libmember: rebuild of set '{name}' ({}) failed: {}",
                    reason.name(),
                    e.reply_text()
                ),
            );
            Err(e.reply_text())
        }
    };
    if again {
        start(name, Reason::Alter);
    }
    for (w, kind) in waiters {
        if again && kind == Reply::Altered {
            // MEMBER.ALTER SYNC waits for a filter with the settings it set.
            wait_as(ctx, name, w, kind);
            continue;
        }
        if outcome.is_err() && kind == Reply::OkOrRetry {
            // This build may have read the database before the CREATE made the set's table:
            // its failure says nothing about the set the caller created.
            start(name, Reason::Create);
            wait_as(ctx, name, w, Reply::Ok);
            continue;
        }
        let rows = outcome
            .as_ref()
            .map(|(rows, _)| *rows)
            .map_err(|e| e.clone());
        tell(ctx, w, rows, kind);
    }
    let ok = outcome.is_ok();
    state::with(|r| {
        if let Some(s) = r.sets.get_mut(name) {
            s.rebuild_failures = if ok { 0 } else { s.rebuild_failures + 1 };
            s.next_rebuild_try =
                (!ok).then(|| Instant::now() + state::retry_after_failures(s.rebuild_failures));
            s.last_rebuild = Some((Instant::now(), outcome));
            s.last_rebuild_reason = Some(reason);
            if reason == Reason::AutoGrow {
                s.grow.finished(ok, Instant::now());
            }
        }
    });
}

/// Whether a build stamped `origin` was made from another database or history than the one
/// this node follows now. A build without a stamp is judged by the sync pass (never trusted).
fn stale_origin(origin: Option<&Origin>) -> bool {
    use crate::filter::origin::NodeDb;
    match (origin, db::identity::node()) {
        (Some(o), NodeDb::Known(id) | NodeDb::Unreadable(id)) => o.db != id,
        _ => false,
    }
}
