//! The COPY stream filters are built from: a whole set (standalone), the slots a cluster node
//! owns (a rebuild), or a few slots that just arrived (a slot fill). One repeatable-read
//! snapshot each, rows hashed through the same canonicalization as the write path.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use postgres::{Client, Transaction};

use super::sql::{log_triggers_ddl, table, ACTIVE, XMIN};
use super::{source, DbErr};
use crate::config::pg_link::Link;
use crate::filter::fuse::Budget;
use crate::filter::rows::Rows;
use crate::filter::Bloom;
use crate::model::canon::{self, Normalize};
use crate::model::set_def::{SetDef, SourceSync};
use crate::model::slot::SLOTS;
use crate::model::slotset::SlotSet;

/// A filter built from a table (or the given slots of it).
pub struct Built {
    pub bloom: Bloom,
    pub rows: u64,
    /// Sync watermark of the build: the xmin of the COPY's snapshot (docs/sync.md), or of
    /// the catch-up on the primary after a COPY from a standby.
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

fn tx_error(e: postgres::Error) -> DbErr {
    super::classify(&e)
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
    let (rows, watermark) = match standby {
        None => read_hashes(c, def, slots, progress, Some(estimate))?,
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
            let (late, horizon) = super::standby::catch_up(c, def, slots, xmin)?;
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
    let bloom = Bloom::build_rows(members, def.error_rate, max_bytes, &rows, budget)
        .map_err(|e| DbErr::Invalid(e.to_string()))?;
    let held = crate::server::transient::hold_for(&def.name, bloom.bytes() as u64);
    Ok(Built {
        held,
        bloom,
        rows: rows.len(),
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

/// Where a build's rows spill past their share of `member.build-memory`: the server's
/// working directory (its `dir`, where the RDB goes), as an unnamed file.
fn spill_dir() -> &'static std::path::Path {
    std::path::Path::new(".")
}

fn spill_error(e: std::io::Error) -> DbErr {
    DbErr::Failed(format!(
        "cannot write the build's rows past its share of member.build-memory to a file in \
         the server's working directory: {e}; the previous filter keeps serving"
    ))
}

/// An empty `Rows` for one build: a quarter of its memory share (`build_share`).
fn new_rows() -> Rows {
    Rows::new(build_share() / 4)
}

/// What one build may hold besides the filter it makes: `member.build-memory`, or half of
/// what `maxmemory` leaves when that is less, so that under a tight limit a build takes
/// smaller steps (it spills sooner and builds smaller parts) instead of pushing the server
/// into evicting keys. Never below 1 MiB: the steps do not shrink to nothing.
pub fn build_share() -> u64 {
    crate::config::build_memory()
        .min(crate::server::transient::memory_budget() / 2)
        .max(1 << 20)
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
        None => c
            .batch_execute(&log_triggers_ddl(&def.name))
            .map_err(tx_error),
    }
}

/// The canonical hashes of the set's active rows of `slots` (all rows for `None`), read in one
/// snapshot of the primary (held in bounded memory: `Rows`), and that snapshot's xmin.
pub fn read_hashes(
    c: &mut Client,
    def: &SetDef,
    slots: Option<&SlotSet>,
    progress: &AtomicU64,
    estimate: Option<&AtomicU64>,
) -> Result<(Rows, i64), DbErr> {
    install_triggers(c, def)?;
    let (mut tx, watermark) = snapshot(c, def)?;
    // `c` was opened with the primary's link; were `member.pg-url` changed since, the
    // snapshot would not be found on the new one and the build fails (and is retried).
    let link = crate::config::pg_link().0;
    let rows = copy_rows(&mut tx, &link, def, slots, progress, estimate)?;
    tx.commit().map_err(tx_error)?;
    Ok((rows, watermark))
}

/// Opens the read-only repeatable-read transaction a build reads, and its watermark: the
/// snapshot's xmin, or for an UPDATED-COLUMN set the time of this transaction (its polls
/// reread from there, less the lookback: docs/attach.md).
pub(super) fn snapshot<'a>(
    c: &'a mut Client,
    def: &SetDef,
) -> Result<(Transaction<'a>, i64), DbErr> {
    let mut tx = c
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(tx_error)?;
    // The first statement takes the snapshot the COPY reads; its xmin is the watermark: every
    // transaction below it had ended (its rows are in the COPY), every later commit is at or
    // above it (and reaches the filter through the change log).
    let mark = match def.source.as_ref().map(|s| &s.sync) {
        Some(SourceSync::Updated(_)) => source::NOW_WATERMARK,
        _ => XMIN,
    };
    let watermark: i64 = tx.query_one(mark, &[]).map_err(tx_error)?.get(0);
    Ok((tx, watermark))
}

/// Streams the set's active rows of `slots` in the open snapshot `tx`, hashed: from the
/// module's own table, or from an attached set's source.
pub(super) fn copy_rows(
    tx: &mut Transaction,
    link: &Link,
    def: &SetDef,
    slots: Option<&SlotSet>,
    progress: &AtomicU64,
    estimate: Option<&AtomicU64>,
) -> Result<Rows, DbErr> {
    let t = match &def.source {
        Some(src) => source::qualified(src),
        None => table(&def.name),
    };
    if let Some(estimate) = estimate {
        let est: f32 = tx
            .query_one(
                "SELECT coalesce((SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)), 0)",
                &[&t],
            )
            .map_err(tx_error)?
            .get(0);
        let share = slots.map_or(1.0, |s| s.len() as f32 / SLOTS as f32);
        let est = (est.max(0.0) * share) as u64;
        estimate.store(est, Ordering::Relaxed);
    }
    // A set table has its slot column; an application's table does not, so an attached set's
    // rows are all read and those of other slots dropped here (docs/attach.md, "In a
    // cluster").
    let (sql, keep) = match &def.source {
        Some(src) => (source::copy_sql(src, def.normalize), slots),
        None => {
            let filter = slots.map(slot_condition).unwrap_or_default();
            let sql =
                format!("COPY (SELECT entity_id, scope FROM {t} WHERE {ACTIVE}{filter}) TO STDOUT");
            (sql, None)
        }
    };
    let rows = stream(tx, link, &sql, def, keep, progress)?;
    progress.store(rows.len(), Ordering::Relaxed);
    Ok(rows)
}

/// ` AND (slot BETWEEN a AND b OR …)` for the runs of consecutive slots in `slots` (COPY takes
/// no parameters; the numbers are ours). No slot at all matches nothing.
fn slot_condition(slots: &SlotSet) -> String {
    let mut runs: Vec<(u16, u16)> = Vec::new();
    for s in slots.iter() {
        match runs.last_mut() {
            Some((_, b)) if *b + 1 == s => *b = s,
            _ => runs.push((s, s)),
        }
    }
    if runs.is_empty() {
        return " AND false".into();
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|(a, b)| {
            if a == b {
                format!("slot = {a}")
            } else {
                format!("slot BETWEEN {a} AND {b}")
            }
        })
        .collect();
    format!(" AND ({})", parts.join(" OR "))
}

/// The COPY's rows, hashed; with `keep`, only those whose canonical slot is in it.
fn stream(
    tx: &mut Transaction,
    link: &Link,
    sql: &str,
    def: &SetDef,
    keep: Option<&SlotSet>,
    progress: &AtomicU64,
) -> Result<Rows, DbErr> {
    let norm = def.normalize;
    let mut rows = new_rows();
    // The rows held in memory are the set's transient memory while the COPY runs.
    let mut held = crate::server::transient::hold_for(&def.name, 0);
    let mut failed = None;
    let mut n = 0u64;
    super::copy_stream::each_row(tx, link, super::build_lock_timeout_ms(), sql, |line| {
        let Some(h) = hash_copy_row(norm, line, keep) else {
            return;
        };
        if failed.is_none() {
            failed = rows.push(h, spill_dir()).err();
        }
        n += 1;
        if n.is_multiple_of(4096) {
            progress.store(n, Ordering::Relaxed);
            held.resize(rows.held_bytes());
        }
    })?;
    match failed {
        Some(e) => Err(spill_error(e)),
        None => Ok(rows),
    }
}

/// Canonical hash of one COPY text-format row `entity \t scope`; None for rows the write
/// path would have refused (they can only come from outside writes), and with `keep`, for
/// rows whose canonical slot is not in it.
fn hash_copy_row(norm: Normalize, line: &[u8], keep: Option<&SlotSet>) -> Option<u128> {
    let tab = line.iter().position(|&b| b == b'\t')?;
    let entity = unescape(&line[..tab]);
    let scope = unescape(&line[tab + 1..]);
    let c = canon::canonicalize(norm, &entity, &scope).ok()?;
    if let Some(slots) = keep {
        if !slots.contains(crate::model::slot::keyslot(c.entity.as_bytes())) {
            return None;
        }
    }
    Some(c.hash)
}

/// Undoes COPY text-format escaping (`\\`, `\t`, `\n`, octal and hex escapes...).
fn unescape(field: &[u8]) -> Cow<'_, [u8]> {
    if !field.contains(&b'\\') {
        return Cow::Borrowed(field);
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b != b'\\' || i + 1 == field.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let e = field[i + 1];
        i += 2;
        match e {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut n = 1;
                while n < 3 && i < field.len() && (b'0'..=b'7').contains(&field[i]) {
                    v = v * 8 + (field[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && i < field.len() && field[i].is_ascii_hexdigit() {
                    v = v * 16 + (field[i] as char).to_digit(16).unwrap();
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_conditions_are_runs() {
        let s: SlotSet = [1u16, 2, 3, 7, 9, 10].into_iter().collect();
        assert_eq!(
            slot_condition(&s),
            " AND (slot BETWEEN 1 AND 3 OR slot = 7 OR slot BETWEEN 9 AND 10)"
        );
        assert_eq!(slot_condition(&SlotSet::default()), " AND false");
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
    fn unescape_copy_text() {
        assert_eq!(&*unescape(b"plain"), b"plain");
        assert_eq!(&*unescape(b"a\\tb\\nc\\\\d"), b"a\tb\nc\\d");
        assert_eq!(&*unescape(b"\\101\\x42"), b"AB");
    }

    #[test]
    fn copy_rows_hash_like_the_write_path() {
        let row = b"alice\t";
        let want = canon::canonicalize(Normalize::Username, b"alice", b"")
            .unwrap()
            .hash;
        assert_eq!(hash_copy_row(Normalize::Username, row, None), Some(want));
        // Rows written from outside are normalized the same way.
        assert_eq!(
            hash_copy_row(Normalize::Username, b"  ALICE\t", None),
            Some(want)
        );
        let scoped = canon::canonicalize(Normalize::None, b"a\tb", b"m1")
            .unwrap()
            .hash;
        assert_eq!(
            hash_copy_row(Normalize::None, b"a\\tb\tm1", None),
            Some(scoped)
        );
        assert_eq!(hash_copy_row(Normalize::None, b"no-tab", None), None);
    }

    #[test]
    fn an_attached_sets_rows_of_other_slots_are_dropped() {
        // Lower-case first: the slot is the canonical form's, not the row's spelling.
        let slot = crate::model::slot::keyslot(b"alice");
        let mut mine = SlotSet::default();
        mine.insert(slot);
        let want = canon::canonicalize(Normalize::Lower, b"alice", b"")
            .unwrap()
            .hash;
        assert_eq!(
            hash_copy_row(Normalize::Lower, b"ALICE\t", Some(&mine)),
            Some(want)
        );
        let mut other = SlotSet::default();
        other.insert(slot ^ 1);
        assert_eq!(
            hash_copy_row(Normalize::Lower, b"ALICE\t", Some(&other)),
            None
        );
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
