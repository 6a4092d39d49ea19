//! One repeatable-read snapshot of a set's rows, streamed with `COPY … TO STDOUT` and hashed
//! through the write path's canonicalization: what every filter build reads, whether from the
//! primary (`build.rs`) or from a standby (`standby.rs`), held in bounded memory (`Rows`).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use postgres::{Client, Transaction};

use super::sql::{table, ACTIVE, XMIN};
use super::{source, DbErr};
use crate::config::pg_link::Link;
use crate::filter::rows::Rows;
use crate::model::canon::{self, Normalize};
use crate::model::set_def::{SetDef, SourceSync};
use crate::model::slot::SLOTS;
use crate::model::slotset::SlotSet;

pub fn tx_error(e: postgres::Error) -> DbErr {
    super::classify(&e)
}

/// Opens the read-only repeatable-read transaction a build reads, and its watermark: the
/// snapshot's xmin, or for an UPDATED-COLUMN set the time of this transaction (its polls
/// reread from there, less the lookback: docs/attach.md).
pub fn snapshot<'a>(c: &'a mut Client, def: &SetDef) -> Result<(Transaction<'a>, i64), DbErr> {
    let mut tx = c
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(tx_error)?;
    // The timeouts the build's connection was opened with, again for this transaction: a
    // pooler may have dropped them (and this takes no snapshot yet).
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = {}",
        super::build_lock_timeout_ms()
    ))
    .map_err(tx_error)?;
    // The first statement takes the snapshot the COPY reads; its xmin is the watermark: every
    // transaction below it had ended (its rows are in the COPY), every later commit is at or
    // above it (and reaches the filter through the change log).
    let mark = match def.source.as_ref().map(|s| &s.sync) {
        Some(SourceSync::Updated(_)) => source::NOW_WATERMARK,
        _ => XMIN,
    };
    let watermark: i64 = tx.query_one(mark, &[]).map_err(tx_error)?.get(0);
    // Then none of the DBA's transaction-wide timeouts (a statement in the same snapshot).
    tx.batch_execute(super::UNBOUNDED_TRANSACTION)
        .map_err(tx_error)?;
    Ok((tx, watermark))
}

/// Streams the set's active rows of `slots` in the open snapshot `tx`, hashed: from the
/// module's own table, or from an attached set's source.
pub fn copy_rows(
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
            let rows = format!("SELECT entity_id, scope FROM {t} WHERE {ACTIVE}{filter}");
            // Only a tokenized set rotates: no other build takes the lock or asks.
            if def.tokenize.is_on() && has_twins(tx, &t)? {
                // A rotating set's row may hold its old form in `twin` (rewritten in place:
                // docs/rotation-in-place.md): a node that computes the old form finds it in
                // its filter only if the build reads it. Its slot is its own, so these are read
                // whatever their row's slot, and those of other slots dropped here.
                let twins = format!("SELECT twin, '' FROM {t} WHERE twin IS NOT NULL AND {ACTIVE}");
                (format!("COPY ({rows} UNION ALL {twins}) TO STDOUT"), slots)
            } else {
                (format!("COPY ({rows}) TO STDOUT"), None)
            }
        }
    };
    let rows = stream(tx, link, &sql, def, keep, progress)?;
    progress.store(rows.len(), Ordering::Relaxed);
    Ok(rows)
}

/// Whether the set's table `t` has its rotation's `twin` column now, its lock taken first (the
/// lock the COPY takes anyway): the drain's end, which drops the column, then waits for this
/// build's snapshot to end.
fn has_twins(tx: &mut Transaction, t: &str) -> Result<bool, DbErr> {
    tx.batch_execute(&format!("LOCK TABLE {t} IN ACCESS SHARE MODE"))
        .map_err(tx_error)?;
    Ok(tx
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1)
                              AND attname = 'twin' AND NOT attisdropped)",
            &[&t],
        )
        .map_err(tx_error)?
        .get(0))
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

/// What one build may hold besides the filter it makes: `member.build-memory`, or half of
/// what `maxmemory` leaves when that is less, so that under a tight limit a build takes
/// smaller steps (it spills sooner and builds smaller parts) instead of pushing the server
/// into evicting keys. Never below 1 MiB: the steps do not shrink to nothing.
pub fn build_share() -> u64 {
    crate::config::build_memory()
        .min(crate::server::transient::memory_budget() / 2)
        .max(1 << 20)
}

/// An empty `Rows` for one build: a quarter of its memory share (`build_share`).
fn new_rows() -> Rows {
    Rows::new(build_share() / 4)
}

/// Where a build's rows spill past their share of `member.build-memory`: the server's
/// working directory (its `dir`, where the RDB goes), as an unnamed file.
pub fn spill_dir() -> &'static std::path::Path {
    std::path::Path::new(".")
}

pub fn spill_error(e: std::io::Error) -> DbErr {
    DbErr::Failed(format!(
        "cannot write the build's rows past its share of member.build-memory to a file in \
         the server's working directory: {e}; the previous filter keeps serving"
    ))
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
}
