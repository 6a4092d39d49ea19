//! An online key rotation's state in the catalog and its start (docs/security.md, "Rotating
//! a tokenized set's key online"): the catalog's rotation columns as a node reads them, the
//! `twin` column, the form of a chain. The steps that carry a rotation to its end are
//! `rotation_rewrite.rs` (a rotation rewrites each row in place: docs/rotation-in-place.md),
//! `rotation_copy.rs` (the copy a rotation an earlier build started goes on with) and, what
//! both share, `rotation_steps.rs`.

use super::{table, ADVISORY_KEY};
use crate::db::{Db, DbErr};

/// What the catalog says of a set's rotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RotationRow {
    /// The fingerprint of the key the set is moving to.
    pub to: String,
    pub phase: Phase,
    /// The end's transaction id (from `Switching` on): a node switches to the new form once
    /// its filter covers every transaction below it and this one.
    pub end_xid: Option<i64>,
    /// Rows copied or rewritten so far.
    pub copied: i64,
    /// About how many rows the rotation has still to rewrite or copy (rewriting, copying) or
    /// delete (switching, draining, after a copy), as of the last step; `None` before the
    /// first.
    pub left: Option<i64>,
    /// Switching: every node has reported a filter that covers the end (`member_nodes`'
    /// `covered`). In a cluster, where a node asks other nodes' filters, nodes switch then.
    pub covered: bool,
    /// The rotation rewrites rows in place (it was started in the phase `rewriting`: the
    /// catalog records the pages it walks); `false` for one an earlier build started, which
    /// copies each row to a twin and deletes the old rows in its drain.
    pub in_place: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Each old-form row is rewritten in place to the new form, naming its old one
    /// (`twin`); the chain is still the old one.
    Rewriting,
    /// A rotation an earlier build started: twins are made for every old-form row; the
    /// chain is still the old one.
    Copying,
    /// The chain holds the new key; nodes switch as their filters pass the end.
    Switching,
    /// Every node switched: the old forms are deleted.
    Draining,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Rewriting => "rewriting",
            Phase::Copying => "copying",
            Phase::Switching => "switching",
            Phase::Draining => "draining",
        }
    }

    /// Before the end: the chain is still the old one, and rows are moved to the new form.
    pub fn before_end(self) -> bool {
        matches!(self, Phase::Rewriting | Phase::Copying)
    }

    fn parse(s: &str) -> Option<Phase> {
        [
            Phase::Rewriting,
            Phase::Copying,
            Phase::Switching,
            Phase::Draining,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
}

/// The catalog columns `rotation_at` reads, for a table aliased `a`.
pub(super) fn rotation_columns(a: &str) -> String {
    format!(
        "{a}.rotate_to, {a}.rotate_phase, {a}.rotate_end_xid, {a}.rotate_copied, \
         {a}.rotate_left, {a}.rotate_covered, {a}.rotate_pages IS NOT NULL"
    )
}

/// The rotation from the `rotation_columns` starting at `at`; `None` when none runs (or a
/// phase this version does not know: such a node serves the chain the catalog gives).
pub(super) fn rotation_at(row: &postgres::Row, at: usize) -> Option<RotationRow> {
    Some(RotationRow {
        to: row.get::<_, Option<String>>(at)?,
        phase: Phase::parse(row.get::<_, Option<&str>>(at + 1)?)?,
        end_xid: row.get(at + 2),
        copied: row.get::<_, Option<i64>>(at + 3).unwrap_or(0),
        left: row.get(at + 4),
        covered: row.get::<_, Option<bool>>(at + 5).unwrap_or(false),
        in_place: row.get(at + 6),
    })
}

/// The test of the form of a chain of `n` keys, for column `c`: its prefix and 64 hex digits,
/// as a length and an unbounded class (a `[0-9a-f]{64}` costs PostgreSQL's regular-expression
/// engine about 8 µs a row, this under 1 µs; the form check's triggers test the same way).
pub fn form_test(c: &str, n: usize) -> String {
    if n == 1 {
        format!("(octet_length({c}) = 64 AND {c} ~ '^[0-9a-f]*$')")
    } else {
        let prefix = format!("{n}:");
        format!(
            "(octet_length({c}) = {} AND {c} ~ '^{prefix}[0-9a-f]*$')",
            64 + prefix.len()
        )
    }
}

pub(super) fn twin_index(set: &str) -> String {
    // `$` never appears in a set's table name, so no set's relation can take this name.
    format!("\"member_{set}$twin\"")
}

/// Why a rotation cannot start, as the reply says it.
pub enum StartRefused {
    UnknownSet,
    NotTokenized,
    Running(&'static str),
    InChain,
    /// The set's table stayed locked by other sessions through every try before the deadline.
    Busy,
}

/// How long a rotation's statement waits for a table lock before it gives up (and its step is
/// tried again): a DDL statement waiting for its lock makes every later reader of the table
/// wait behind it, and a lookup waits at most `member.db-timeout-ms`.
pub(super) const LOCK_WAIT: &str = "SET LOCAL lock_timeout = '200ms'";

/// The pause between tries of the start's transactions that found the table locked.
const START_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Starts the rotation of `set` to the key of fingerprint `to`, under the catalog's lock: the
/// `twin` column (no index: no statement finds a row by it), the form check taking both
/// lengths, the catalog's rotation columns (the phase `rewriting`, the table's page count,
/// which the rewrite walks to) and version (every node re-reads it). Its transaction waits
/// at most [`LOCK_WAIT`] for the table and is tried again, until a try could not end before
/// `deadline` (the client's reply must come first): then [`StartRefused::Busy`]. Returns the
/// chain's length before the rotation.
pub fn start(
    db: &mut Db,
    set: &str,
    to: &str,
    deadline: std::time::Instant,
) -> Result<Result<usize, StartRefused>, DbErr> {
    // A try: two transactions, each waiting at most `LOCK_WAIT` (200 ms), and the pause.
    let a_try = std::time::Duration::from_millis(500);
    db.run_own(|c, st| loop {
        match start_once(c, st, set, to) {
            Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                if std::time::Instant::now() + a_try >= deadline {
                    return Ok(Err(StartRefused::Busy));
                }
                std::thread::sleep(START_PAUSE);
            }
            done => return done,
        }
    })
}

fn start_once(
    c: &mut postgres::Client,
    st: &mut crate::db::Stmts,
    set: &str,
    to: &str,
) -> Result<Result<usize, StartRefused>, postgres::Error> {
    let t = table(set);
    let mut tx = st.begin(c)?;
    tx.batch_execute(LOCK_WAIT)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
    let n = match check(&mut tx, set, to)? {
        Ok(n) => n,
        Err(refused) => return Ok(Err(refused)),
    };
    tx.batch_execute(&format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS twin text"
    ))?;
    // Rows committed before this transaction lie in the pages counted here; any written
    // after its snapshot is in the change log from the watermark on (the sweep's).
    tx.execute(
        &format!(
            "UPDATE member_catalog
                SET rotate_to = $2, rotate_phase = 'rewriting', rotate_cursor = NULL,
                    rotate_swept = pg_snapshot_xmin(pg_current_snapshot())::text::int8,
                    rotate_end_xid = NULL, rotate_copied = 0, rotate_left = NULL,
                    rotate_covered = false, rotate_started = now(), rotate_page = 0,
                    rotate_pages = pg_relation_size('{t}') / current_setting('block_size')::int8
              WHERE name = $1"
        ),
        &[&set, &to],
    )?;
    tx.execute("SELECT member_catalog_form($1)", &[&set])?;
    tx.execute(super::BUMP_VERSION, &[])?;
    tx.commit()?;
    Ok(Ok(n))
}

/// Whether `set` may start rotating to `to`: the old chain's length, or why not.
fn check(
    tx: &mut postgres::Transaction,
    set: &str,
    to: &str,
) -> Result<Result<usize, StartRefused>, postgres::Error> {
    let Some(row) = tx.query_opt(
        "SELECT tokenize, token_key_fp, rotate_phase, source_table FROM member_catalog
          WHERE name = $1 FOR UPDATE",
        &[&set],
    )?
    else {
        return Ok(Err(StartRefused::UnknownSet));
    };
    let (mode, chain): (String, Option<String>) = (row.get(0), row.get(1));
    let source: Option<String> = row.get(3);
    if mode != "hmac-sha256" || source.is_some() {
        return Ok(Err(StartRefused::NotTokenized));
    }
    if let Some(p) = row.get::<_, Option<&str>>(2).and_then(Phase::parse) {
        return Ok(Err(StartRefused::Running(p.name())));
    }
    let chain = chain.unwrap_or_default();
    if chain.split('>').any(|fp| fp == to) {
        return Ok(Err(StartRefused::InChain));
    }
    Ok(Ok(chain.split('>').count()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_test_names_its_chain() {
        assert_eq!(
            form_test("e", 1),
            "(octet_length(e) = 64 AND e ~ '^[0-9a-f]*$')"
        );
        assert_eq!(
            form_test("m.e", 12),
            "(octet_length(m.e) = 67 AND m.e ~ '^12:[0-9a-f]*$')"
        );
        for p in [
            Phase::Rewriting,
            Phase::Copying,
            Phase::Switching,
            Phase::Draining,
        ] {
            assert_eq!(Phase::parse(p.name()), Some(p));
        }
        assert_eq!(Phase::parse("moving"), None);
    }
}
