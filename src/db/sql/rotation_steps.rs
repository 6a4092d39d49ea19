//! What every step of an online key rotation shares (docs/security.md, "Rotating a tokenized
//! set's key online"): each is one transaction that takes the set's rotation lock without
//! waiting (two primaries never run one step at once), checks the catalog's phase, and keeps
//! its progress in the catalog row (a step after a crash, a restart or a failover goes on
//! from the last one committed). Here too the steps both kinds of rotation take: the mark
//! that every node's filter covers the end, and the start of the drain. The rewrite in place
//! is `rotation_rewrite.rs`; the copy a rotation started by an earlier build goes on with,
//! `rotation_copy.rs`.

use postgres::Transaction;

use postgres::error::SqlState;

use super::rotation::{twin_index, LOCK_WAIT};
use super::{table, ADVISORY_KEY};
use crate::db::{Db, DbErr, Stmts};

/// Computes a row's new form from its old one (the module's keys), or says why it cannot.
pub type Wrap<'a> = &'a dyn Fn(&str) -> Result<String, String>;

/// The new form of each of `olds`, in order, or why one cannot be computed.
pub(super) fn wrap_all(olds: &[String], wrap: Wrap) -> Result<Vec<String>, String> {
    olds.iter().map(|o| wrap(o)).collect()
}

/// The set's rotation lock, taken without waiting: `false` when another node runs a step.
pub(super) fn try_lock(tx: &mut Transaction, set: &str) -> Result<bool, postgres::Error> {
    Ok(tx
        .query_one(
            "SELECT pg_try_advisory_xact_lock(hashtextextended('member rotation ' || $1, 0))",
            &[&set],
        )?
        .get(0))
}

/// Whether the catalog's phase of `set`'s rotation is one of `phases`: a step planned from a
/// node's view of the catalog that the rotation has since left (a step in the moment between
/// a phase's change and this node's re-read of the catalog) does nothing.
pub(super) fn phase_is(
    tx: &mut Transaction,
    set: &str,
    phases: &[&str],
) -> Result<bool, postgres::Error> {
    let phase: Option<String> = tx
        .query_opt(
            "SELECT rotate_phase FROM member_catalog WHERE name = $1",
            &[&set],
        )?
        .and_then(|r| r.get(0));
    Ok(phase.is_some_and(|p| phases.contains(&p.as_str())))
}

/// Takes the set's rotation lock and checks the catalog's phase: the step that does nothing
/// when another node holds the lock, or the rotation has left `phases`; `None` to go on.
pub(super) fn refused(
    tx: &mut Transaction,
    set: &str,
    phases: &[&str],
) -> Result<Option<Step>, postgres::Error> {
    if !try_lock(tx, set)? {
        return Ok(Some(Step::BUSY));
    }
    if !phase_is(tx, set, phases)? {
        return Ok(Some(Step::STALE));
    }
    Ok(None)
}

/// What one step of a rotation found and did.
#[derive(Debug, Default)]
pub struct Step {
    /// Another node holds the rotation's lock: nothing was done.
    pub busy: bool,
    /// The rotation had left the phase the step was for: nothing was done.
    pub stale: bool,
    /// Old-form rows rewritten in place (or given twins, by a copy).
    pub copied: usize,
    /// The rewrite (or the copy) reached the end of the table.
    pub copy_done: bool,
    /// About how many rows the rotation has still to rewrite, copy or delete
    /// (`RotationRow::left`).
    pub left: Option<i64>,
}

impl Step {
    pub(super) const BUSY: Step = Step {
        busy: true,
        stale: false,
        copied: 0,
        copy_done: false,
        left: None,
    };
    pub(super) const STALE: Step = Step {
        busy: false,
        stale: true,
        copied: 0,
        copy_done: false,
        left: None,
    };
}

/// Every node switched: the twin triggers of a copy go (deleting an old row must not delete
/// its twin now; a rewrite has none) and the phase becomes `draining`. Bumps the catalog
/// version.
pub fn drain_start(db: &mut Db, set: &str) -> Result<Step, DbErr> {
    let t = table(set);
    db.run_own(|c, st| {
        let mut tx = st.begin(c)?;
        if let Some(nothing) = refused(&mut tx, set, &["switching"])? {
            return Ok(nothing);
        }
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(LOCK_WAIT)?;
        tx.batch_execute(&format!(
            "DROP TRIGGER IF EXISTS member_twin_del ON {t};
             DROP TRIGGER IF EXISTS member_twin_upd ON {t};"
        ))?;
        tx.execute(
            "UPDATE member_catalog SET rotate_phase = 'draining', rotate_cursor = NULL
              WHERE name = $1",
            &[&set],
        )?;
        tx.execute(super::BUMP_VERSION, &[])?;
        tx.commit()?;
        Ok(Step::default())
    })
}

/// Every node's filter covers the end (its report says so): the catalog records it, and in a
/// cluster the nodes switch when they read it. Under the rotation's lock, in the switching
/// phase only.
pub fn mark_covered(db: &mut Db, set: &str) -> Result<Step, DbErr> {
    db.run_own(|c, st| {
        let mut tx = st.begin(c)?;
        if let Some(nothing) = refused(&mut tx, set, &["switching"])? {
            return Ok(nothing);
        }
        let marked = tx.execute(
            "UPDATE member_catalog SET rotate_covered = true
              WHERE name = $1 AND rotate_covered IS NOT TRUE",
            &[&set],
        )?;
        if marked == 0 {
            // Marked by an earlier step this node's view of the catalog has not caught up with.
            return Ok(Step::STALE);
        }
        tx.execute(super::BUMP_VERSION, &[])?;
        tx.commit()?;
        Ok(Step::default())
    })
}

/// Where the sweep of rows written behind the walk starts, read in `tx`: the watermark (a
/// transaction id: every change at or past it is read from the change log), the next one
/// (the step's snapshot's horizon), and whether the log was pruned past the watermark (a
/// rotation paused longer than the log's retention): then every old-form row must be read,
/// whatever its age.
pub(super) fn watermark(
    tx: &mut Transaction,
    set: &str,
) -> Result<(i64, i64, bool), postgres::Error> {
    let from: i64 = tx
        .query_one(
            "SELECT coalesce(rotate_swept, 0) FROM member_catalog WHERE name = $1",
            &[&set],
        )?
        .get(0);
    let r = tx.query_one(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8,
                (SELECT floor::text::int8 FROM member_changes_floor)",
        &[],
    )?;
    let (horizon, floor): (i64, Option<i64>) = (r.get(0), r.get(1));
    Ok((from, horizon, floor.is_some_and(|f| f > from)))
}

/// What the end of a walk or of a drain does with the old-form rows it finds under the
/// table's lock (rewrites them, gives them twins, deletes them): the rows it moved, or why it
/// could not (a key the module cannot compute with).
pub(super) type Last<'a> =
    &'a mut dyn FnMut(&mut Transaction) -> Result<Result<u64, String>, postgres::Error>;

/// The end of the walk from `phase`, either kind's: under the table's `SHARE ROW EXCLUSIVE`
/// lock (writers wait; readers do not), `last` moves the rows the sweep finds, the new key
/// joins the chain, the form check takes both lengths still, and the transaction's id is
/// recorded: a node switches to the new form once its filter covers it. `left` is the SQL of
/// the rows the drain is left (`$2`: the rows `last` moved). Bumps the catalog version.
pub(super) fn end_walk(
    db: &mut Db,
    set: &str,
    phase: &str,
    left: &str,
    last: Last,
) -> Result<Result<Step, String>, DbErr> {
    let t = table(set);
    db.run_own(|c, st| {
        let mut tx = st.begin(c)?;
        if let Some(nothing) = refused(&mut tx, set, &[phase])? {
            return Ok(Ok(nothing));
        }
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(LOCK_WAIT)?;
        tx.batch_execute(&format!("LOCK TABLE {t} IN SHARE ROW EXCLUSIVE MODE"))?;
        let moved = match last(&mut tx)? {
            Ok(moved) => moved,
            Err(e) => return Ok(Err(e)),
        };
        let left: Option<i64> = tx
            .query_opt(
                &format!(
                    "UPDATE member_catalog
                        SET token_key_fp = token_key_fp || '>' || rotate_to,
                            rotate_phase = 'switching',
                            rotate_end_xid = pg_current_xact_id()::text::int8,
                            rotate_copied = rotate_copied + $2, rotate_left = {left}
                      WHERE name = $1 AND rotate_phase = $3 RETURNING rotate_left"
                ),
                &[&set, &(moved as i64), &phase],
            )?
            .and_then(|r| r.get(0));
        tx.execute(super::BUMP_VERSION, &[])?;
        tx.commit()?;
        Ok(Ok(Step {
            copied: moved as usize,
            copy_done: true,
            left,
            ..Step::default()
        }))
    })
}

/// The end of a drain, either kind's, its own transaction: the table's locks are waited for
/// at most `LOCK_WAIT` (a reader queues behind a DDL statement that waits), and a step that
/// could not take them ends the drain at a later one. Under them, `last` deals with every
/// old-form row left (a late writer's), the `twin` column (and a copy's index on it) is
/// dropped, the rotation's columns cleared, the form check takes the new length alone (a late
/// writer's old-form row is refused from here on), and the catalog version is bumped. The
/// rows `last` moved, or `None` when the drain did not end here.
pub(super) fn end_drain(
    c: &mut postgres::Client,
    st: &mut Stmts,
    set: &str,
    last: Last,
) -> Result<Result<Option<u64>, String>, postgres::Error> {
    let t = table(set);
    let index = twin_index(set);
    let mut tx = st.begin(c)?;
    tx.batch_execute(LOCK_WAIT)?;
    let ended = (|| {
        if !try_lock(&mut tx, set)? || !phase_is(&mut tx, set, &["draining"])? {
            return Ok(Ok(None));
        }
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(&format!("LOCK TABLE {t} IN SHARE ROW EXCLUSIVE MODE"))?;
        let moved = match last(&mut tx)? {
            Ok(moved) => moved,
            Err(e) => return Ok(Err(e)),
        };
        tx.batch_execute(&format!(
            "DROP INDEX IF EXISTS {index}; ALTER TABLE {t} DROP COLUMN IF EXISTS twin;"
        ))?;
        tx.execute(
            "UPDATE member_catalog
                SET rotate_to = NULL, rotate_phase = NULL, rotate_cursor = NULL,
                    rotate_swept = NULL, rotate_end_xid = NULL, rotate_started = NULL,
                    rotate_left = NULL, rotate_covered = NULL, rotate_page = NULL,
                    rotate_pages = NULL
              WHERE name = $1",
            &[&set],
        )?;
        tx.execute("SELECT member_catalog_form($1)", &[&set])?;
        tx.execute(super::BUMP_VERSION, &[])?;
        Ok::<_, postgres::Error>(Ok(Some(moved)))
    })();
    match ended {
        Ok(Ok(Some(moved))) => {
            tx.commit()?;
            Ok(Ok(Some(moved)))
        }
        Ok(other) => Ok(other),
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(Ok(None)),
        Err(e) => Err(e),
    }
}
