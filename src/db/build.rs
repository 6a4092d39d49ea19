//! Filters built from a set's rows: a whole set (standalone), the slots a cluster node owns (a
//! rebuild), or a few slots that just arrived (a slot fill). The rows come from one snapshot
//! (`snapshot_rows.rs`) of the primary, or of a standby caught up on the primary
//! (`standby.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use postgres::Client;

use super::snapshot_rows::{build_share, copy_rows, snapshot, spill_dir, spill_error, tx_error};
use super::sql::log_triggers_ddl;
use super::{source, DbErr};
use crate::config::pg_link::Link;
use crate::filter::fuse::Budget;
use crate::filter::rows::Rows;
use crate::filter::Bloom;
use crate::model::set_def::{SetDef, SourceSync};
use crate::model::slot::SLOTS;
use crate::model::slotset::SlotSet;

/// A filter built from a table (or the given slots of it).
pub struct Built {
    pub bloom: Bloom,
    pub rows: u64,
    /// Sync watermark of the build: the xmin of the catch-up on the primary that follows the
    /// construction (or the standby's COPY), or the COPY's snapshot's when none could be made
    /// (docs/sync.md).
    pub watermark: i64,
    /// The COPY was read from the standby `member.pg-rebuild-url`.
    pub from_standby: bool,
    /// How long the COPY (read and hashed) and the filter's construction after it took.
    pub copy_time: std::time::Duration,
    pub construct_time: std::time::Duration,
    /// Bytes of rows the build wrote to its spill file (0: they fitted in memory).
    pub spilled: u64,
    /// The new filter, counted as the set's transient memory until it is swapped in (so that
    /// what is admitted after it, its payload, sees the headroom it left).
    pub held: crate::server::transient::Held,
}

/// Members a filter of `slots` of a set is sized for: its share of CAPACITY, or the rows
/// found, whichever is larger (never zero). A grown filter (`grow`, see `grow.rs`) is sized
/// for twice the rows found: the set outgrew its CAPACITY and keeps growing. In a cluster the
/// rows are this node's own (those of its slots), so each node grows on its own share.
pub fn sized_for(capacity: u64, slots: Option<&SlotSet>, rows: u64, grow: bool) -> u64 {
    let share = match slots {
        None => capacity,
        Some(s) => (capacity as u128 * s.len() as u128).div_ceil(SLOTS as u128) as u64,
    };
    let rows = if grow { rows.saturating_mul(2) } else { rows };
    share.max(rows).max(1)
}

/// Streams the set's active rows (of `slots` only, when given) with `COPY … TO STDOUT` inside
/// one repeatable-read snapshot and builds a complete filter from them, sized by
/// [`sized_for`]. `progress` receives the rows read and the planner's row estimate, for
/// progress reports. Peak extra memory: `member.build-memory` (the rows read, spilled to a
/// file past a quarter of it, and the fuse constructions running at once) plus the new
/// filter, whatever the number of rows.
///
/// `c` is the primary. With a `standby` (`member.pg-rebuild-url`), the COPY reads the standby
/// and the primary only gets the change-log triggers (if missing) and a read of the change
/// log from the standby snapshot's xmin (`standby::catch_up`: docs/sync.md, "Rebuilding from
/// a standby").
pub fn build_filter(
    c: &mut Client,
    standby: Option<(&mut Client, &Link)>,
    def: &SetDef,
    slots: Option<&SlotSet>,
    grow: bool,
    (progress, estimate): (&AtomicU64, &AtomicU64),
) -> Result<Built, DbErr> {
    // A set whose share of CAPACITY alone exceeds the ceiling fails before any row is read.
    let max_bytes = crate::config::max_filter_bytes();
    crate::filter::check_size(
        sized_for(def.capacity, slots, 0, false),
        def.error_rate,
        max_bytes,
    )
    .map_err(|e| DbErr::Invalid(e.to_string()))?;
    // Nor is a build started whose filter, sized for CAPACITY alone, does not fit in what
    // maxmemory leaves: the rows could only make it larger.
    crate::server::transient::check_memory(
        crate::filter::bytes_for(sized_for(def.capacity, slots, 0, false), def.error_rate),
        crate::server::transient::memory_budget(),
    )
    .map_err(DbErr::Invalid)?;
    // An attached set's table is not one the standby path checks (its own triggers, its
    // slot column): those build from the primary.
    let standby = standby.filter(|_| def.source.is_none());
    let from_standby = standby.is_some();
    let copy_started = std::time::Instant::now();
    // The snapshot a COPY from the primary read (`pg_current_snapshot()`), for its catch-up.
    let mut copied = None;
    let (rows, watermark) = match standby {
        None => {
            let (rows, xmin, seen) = read_hashes(c, def, slots, progress, Some(estimate))?;
            copied = seen;
            (rows, xmin)
        }
        Some((s, link)) => {
            install_triggers(c, def)?;
            let (mut rows, xmin) = super::standby::read_hashes(
                s,
                link,
                def,
                slots,
                (progress, Some(estimate)),
                |xmin| super::standby::check_floor(c, xmin),
            )?;
            let (late, horizon) = super::standby::catch_up(c, def, slots, xmin, None)?;
            add_late(&mut rows, late).map_err(spill_error)?;
            progress.store(rows.len(), Ordering::Relaxed);
            (rows, xmin.max(horizon))
        }
    };
    let copy_time = copy_started.elapsed();
    let members = sized_for(def.capacity, slots, rows.len(), grow);
    crate::server::transient::check_memory(
        crate::filter::bytes_for(members, def.error_rate),
        crate::server::transient::memory_budget(),
    )
    .map_err(DbErr::Invalid)?;
    // The rows read go into the filter's static part, later adds into its delta.
    let construct_started = std::time::Instant::now();
    let budget = Budget::of(build_share() / 2);
    // The set's transient memory while it builds: the rows held and the constructions.
    let _held = crate::server::transient::hold_for(
        &def.name,
        rows.held_bytes() + budget.peak_scratch(rows.len()),
    );
    let mut bloom = Bloom::build_rows(members, def.error_rate, max_bytes, &rows, budget)
        .map_err(|e| DbErr::Invalid(e.to_string()))?;
    let (late, watermark) = match copied {
        Some(seen) => catch_up_own(c, def, slots, &mut bloom, (watermark, &seen)),
        None => (0, watermark),
    };
    #[cfg(debug_assertions)]
    held_before_the_swap(c, &def.name)?;
    let held = crate::server::transient::hold_for(&def.name, bloom.bytes() as u64);
    Ok(Built {
        held,
        bloom,
        rows: rows.len() + late,
        spilled: rows.spilled_bytes(),
        watermark,
        from_standby,
        copy_time,
        construct_time: construct_started.elapsed(),
    })
}

/// Adds the rows the primary's change log holds beyond a standby's snapshot to the rows that
/// snapshot gave, each once: a row the standby had already replayed is not counted again, so
/// REBUILD SYNC's count is the number of members whichever server the rows came from. The
/// late rows are few (what the standby lagged by), so only they are held in a set.
fn add_late(rows: &mut Rows, late: Vec<u128>) -> std::io::Result<()> {
    if late.is_empty() {
        return Ok(());
    }
    let mut late: std::collections::HashSet<u128> = late.into_iter().collect();
    rows.each_all(|h| {
        late.remove(&h);
    })?;
    for h in late {
        rows.push(h, spill_dir())?;
    }
    Ok(())
}

/// After a filter was built from the primary's snapshot `seen` (`pg_current_snapshot()`),
/// whose xmin was `xmin`: adds the keys the change log holds for the set from transactions
/// that snapshot did not see (those that committed while the COPY and the construction ran),
/// and returns how many were new to the filter and the watermark it then has, the catch-up's
/// own xmin. What the snapshot saw is the COPY's business: an older incarnation's log rows (a
/// set dropped and created again under its name) are not read again.
///
/// Rows committed after the snapshot reach a new filter through the passes that ran during
/// the build, journaled (docs/sync.md, "A rebuild's window"); but those passes read from the
/// watermark of the value the build replaces, which covers nothing of the build's window when
/// there was none (a CREATE, a lost filter) or when it counts another history's ids (after a
/// failover or a restore). The catch-up covers the window itself, so a row that answered 1
/// while the set fell through to the database does not answer 0 once the new filter serves.
/// Only for a set of the module's own table (`read_hashes` gives no snapshot for an attached
/// set, which keeps the passes' rule). A catch-up that cannot be made (the log pruned past
/// `xmin`, the triggers gone, an error) leaves `xmin`, and the next pass judges the filter as
/// before.
fn catch_up_own(
    c: &mut Client,
    def: &SetDef,
    slots: Option<&SlotSet>,
    bloom: &mut Bloom,
    (xmin, seen): (i64, &str),
) -> (u64, i64) {
    match super::standby::catch_up(c, def, slots, xmin, Some(seen)) {
        Ok((late, horizon)) => {
            let new = late.into_iter().filter(|&h| bloom.add(h)).count() as u64;
            (new, xmin.max(horizon))
        }
        Err(_) => (0, xmin),
    }
}

/// Debug builds only: a build of a set whose name starts with `members::HELD_PREFIX` waits,
/// after its catch-up and before its filter goes to the main thread, while a session holds
/// the advisory lock `hashtextextended('libmember failpoint build ' || set, 0)`: so that a
/// test can commit a row in the window the catch-up did not read, and look it up before the
/// swap, whatever the machine's speed. Release builds have no such wait.
#[cfg(debug_assertions)]
fn held_before_the_swap(c: &mut Client, set: &str) -> Result<(), DbErr> {
    if !set.starts_with(super::members::HELD_PREFIX) {
        return Ok(());
    }
    let key = format!("libmember failpoint build {set}");
    for sql in [
        "SELECT pg_advisory_lock_shared(hashtextextended($1, 0))",
        "SELECT pg_advisory_unlock_shared(hashtextextended($1, 0))",
    ] {
        c.execute(sql, &[&key]).map_err(tx_error)?;
    }
    Ok(())
}

/// Rows written from now on must reach the change log, or a filter built now could never be
/// caught up: installs the triggers (if missing), before any snapshot a build reads is taken.
/// On the primary.
pub fn install_triggers(c: &mut Client, def: &SetDef) -> Result<(), DbErr> {
    match &def.source {
        // An attached table gets the triggers only when its set asked (SYNC log); none is
        // ever one of the module's own relations (an earlier version let a set attach one).
        // Under the catalog's lock: the primaries of a cluster build at the same moment, and
        // each would otherwise find a trigger missing and create it.
        Some(src) if src.sync == SourceSync::Log => {
            let mut tx = c.transaction().map_err(tx_error)?;
            crate::db::sql::lock_schema(&mut tx).map_err(tx_error)?;
            source::install_log_triggers(&mut tx, def)?;
            tx.commit().map_err(tx_error)
        }
        Some(src) => source::refuse_module_relation(c, src),
        // One message, so one transaction, whose lock timeout is set in it (a pooler may have
        // dropped the connection's own).
        None => c
            .batch_execute(&format!(
                "SET LOCAL lock_timeout = {}; {}",
                super::build_lock_timeout_ms(),
                log_triggers_ddl(&def.name)
            ))
            .map_err(tx_error),
    }
}

/// The canonical hashes of the set's active rows of `slots` (all rows for `None`), read in one
/// snapshot of the primary (held in bounded memory: `Rows`), that snapshot's xmin and, for a
/// set of the module's own table, the snapshot itself (`pg_current_snapshot()` as text: what
/// the catch-up after the COPY need not read again).
pub fn read_hashes(
    c: &mut Client,
    def: &SetDef,
    slots: Option<&SlotSet>,
    progress: &AtomicU64,
    estimate: Option<&AtomicU64>,
) -> Result<(Rows, i64, Option<String>), DbErr> {
    install_triggers(c, def)?;
    let (mut tx, watermark) = snapshot(c, def)?;
    let seen = match def.source {
        Some(_) => None,
        None => Some(
            tx.query_one("SELECT pg_current_snapshot()::text", &[])
                .map_err(tx_error)?
                .get(0),
        ),
    };
    // `c` was opened with the primary's link; were `member.pg-url` changed since, the
    // snapshot would not be found on the new one and the build fails (and is retried).
    let link = crate::config::pg_link().0;
    let rows = copy_rows(&mut tx, &link, def, slots, progress, estimate)?;
    tx.commit().map_err(tx_error)?;
    Ok((rows, watermark, seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_sized_for_their_share_of_capacity_or_their_rows() {
        let s: SlotSet = [1u16, 2, 3, 7, 9, 10].into_iter().collect();
        assert_eq!(sized_for(16384, Some(&s), 0, false), 6);
        assert_eq!(sized_for(16384, Some(&s), 100, false), 100);
        assert_eq!(sized_for(1000, None, 10, false), 1000);
        assert_eq!(sized_for(10, Some(&SlotSet::default()), 0, false), 1);
        // Grown: twice the rows, when that is more than the share of CAPACITY.
        assert_eq!(sized_for(1000, None, 3000, true), 6000);
        assert_eq!(sized_for(1000, None, 300, true), 1000);
        assert_eq!(sized_for(16384, Some(&s), 100, true), 200);
    }

    #[test]
    fn late_rows_the_standby_already_had_are_not_counted_twice() {
        let mut rows = Rows::in_memory(&[1u128, 2, 3]);
        add_late(&mut rows, vec![3, 4, 4, 5]).unwrap();
        let mut hashes = rows.to_vec().unwrap();
        hashes.sort_unstable();
        assert_eq!(hashes, vec![1, 2, 3, 4, 5]);
        let mut none = Rows::in_memory(&[7u128]);
        add_late(&mut none, Vec::new()).unwrap();
        assert_eq!(none.to_vec().unwrap(), vec![7]);
    }
}
