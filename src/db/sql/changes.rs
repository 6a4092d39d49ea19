//! The sync pass's one read of the change log (docs/sync.md), and the log's retention. The log
//! itself, its triggers and its notification are `change_log.rs`.

use std::collections::HashMap;

use super::change_log::LOG_TRIGGERS;
use super::pages::{read_pages, Sink};
use crate::db::{Db, DbErr};
use crate::model::canon::Normalize;
use crate::model::slotset::SlotSet;

/// The xmin of the statement's snapshot, as an integer: every transaction with a smaller id
/// had ended when the snapshot was taken.
pub(in crate::db) const XMIN: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8";

/// What one sync pass read (docs/sync.md), all in one snapshot. Its rows are not here: they
/// went to the pass's sink page by page ([`Page`]).
#[derive(Debug, Default)]
pub struct Changes {
    /// The snapshot's xmin: the filters read from their watermark now cover everything below.
    pub horizon: i64,
    /// Rows with a transaction id below this may have been pruned from the log.
    pub floor: i64,
    /// Set tables that do not feed the change log (triggers missing or disabled).
    pub blind: Vec<String>,
    /// Statements this pass sent.
    pub statements: u64,
    /// Logged rows of known sets the pass read (in cluster mode, of the slots it asked for).
    pub rows_read: u64,
    /// Attached sets synced by UPDATED-COLUMN: the time each one's poll covers up to
    /// (docs/attach.md), and why a poll failed.
    pub time_horizons: HashMap<String, i64>,
    /// The timeline the server wrote on in the pass's snapshot, when the node reads timelines
    /// (docs/failover.md): a pass whose timeline is not the one the node learned at its start
    /// applies nothing.
    pub timeline: Option<i32>,
    pub poll_errors: HashMap<String, String>,
}

/// The sync loop's read for every set, two statements in one read-only REPEATABLE READ
/// transaction and so one snapshot: first the horizon, the prune floor and the set tables
/// that are blind; then every key a change logged by transactions with id ≥ `from` left
/// active, streamed in the log's index order: no sort, so the first page
/// comes at once however many rows changed (a key added and deleted again within the window
/// is applied too: a false positive the database check answers, gone at the next rebuild).
/// With `slots` (cluster mode), only the rows logged with one of those slots, or with none
/// (`CHANGE_LOG_DDL`), are read. Rows of sets not in `sets` (unknown here) are skipped; `sets`
/// gives each known set's
/// normalization. The keys go to `sink` in pages of at most [`PAGE_ROWS`] rows, all
/// from the one snapshot (docs/sync.md, "Paging"). If `prune_after_s` is given, also prunes
/// the log (`prune`).
pub fn changes_since(
    db: &mut Db,
    from: i64,
    (with_timeline, slots): (bool, Option<&SlotSet>),
    sets: &HashMap<String, Normalize>,
    prune_after_s: Option<u64>,
    sink: &mut Sink,
) -> Result<Changes, DbErr> {
    // `from` is written into the text (it is an integer), not bound: the workers' connections
    // keep generic plans, and a generic plan for "xid >= $1" cannot know that the range is the
    // last second of a large log. Planned once per pass instead.
    // The horizon, the prune floor and the blind tables come first, in a statement of their
    // own: joined to every row, they were computed and sent once per row (a third of the
    // database's time for a large backlog).
    let head_sql = format!(
        r"SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8 AS horizon,
                 (SELECT floor::text::int8 FROM member_changes_floor) AS floor,
                 (SELECT coalesce(array_agg(b.name), '{{}}') FROM (
                           SELECT t.relname::text AS name FROM pg_class t
                           WHERE t.relkind = 'r' AND t.relname LIKE 'member\_%'
                             AND t.relname NOT IN ('member_catalog', 'member_changes',
                                                   'member_changes_floor')
                             AND t.relnamespace = current_schema()::regnamespace
                             AND (SELECT count(*) FROM pg_trigger g
                                   WHERE g.tgrelid = t.oid AND g.tgenabled <> 'D'
                                     AND g.tgfoid = to_regproc('member_log_change')
                                     AND g.tgname IN ('{ins}', '{upd}', '{del}')) < 3
                           UNION ALL
                           -- Attached sets synced by the log (docs/attach.md), by set name
                           -- (their triggers' names: source_triggers::trigger_names).
                           SELECT 'member_' || a.name FROM member_catalog a
                            WHERE a.source_sync = 'log'
                              AND (SELECT count(*) FROM pg_trigger g
                                    WHERE g.tgrelid = to_regclass(format('%I.%I', a.source_schema,
                                                                         a.source_table))
                                      AND g.tgenabled <> 'D'
                                      AND g.tgfoid = to_regproc('member_log_source')
                                      AND g.tgname IN ('member_' || a.name || '$ins',
                                                       'member_' || a.name || '$upd',
                                                       'member_' || a.name || '$del')) < 3
                         ) b) AS blind,
                 {timeline} AS timeline",
        timeline = if with_timeline {
            crate::db::identity::TIMELINE
        } else {
            "NULL::int4"
        },
        ins = LOG_TRIGGERS[0],
        upd = LOG_TRIGGERS[1],
        del = LOG_TRIGGERS[2],
    );
    let rows_sql = format!(
        r"SELECT set_name, entity_id, scope
            FROM member_changes WHERE xid >= '{from}'::xid8 AND alive{only}",
        only = if slots.is_some() {
            " AND (slot IS NULL OR get_bit($1::bytea, slot) = 1)"
        } else {
            ""
        },
        from = from.max(0)
    );
    let in_cluster = crate::server::cluster_mode::enabled();
    let bits = slots.map(slot_bits);
    let mut out = db.run_own(|c, st| {
        in_one_snapshot(c, st, |tx| {
            let head = tx.query_one(head_sql.as_str(), &[])?;
            let mut out = Changes {
                statements: 2,
                horizon: head.get(0),
                floor: head.get::<_, Option<i64>>(1).unwrap_or(0),
                blind: head.get(2),
                timeline: head.get(3),
                ..Changes::default()
            };
            // The rows, from the same snapshot, through a portal a page at a time.
            let portal = match &bits {
                Some(bits) => tx.bind(rows_sql.as_str(), &[bits])?,
                None => tx.bind(rows_sql.as_str(), &[])?,
            };
            let mut rows_read = 0;
            let read = read_pages(tx, &portal, sink, |_, r, page| {
                let Some(&norm) = sets.get(r.get::<_, &str>(0)) else {
                    return;
                };
                rows_read += 1;
                page.push(r.get(0), norm, r.get(1), r.get(2), in_cluster);
            })?;
            out.rows_read = rows_read;
            Ok(read.map(|()| out))
        })
    })??;
    if let Some(after) = prune_after_s {
        // A failed prune costs nothing but disk; the pass's reading stands.
        if prune(db, after).is_ok() {
            out.statements += 1;
        }
    }
    Ok(out)
}

/// `slots` as the bit string `get_bit(bytea, slot)` reads: bit `s` is bit `s % 8` (from the
/// least significant) of byte `s / 8`.
fn slot_bits(slots: &SlotSet) -> Vec<u8> {
    let mut bits = vec![0u8; crate::model::slot::SLOTS / 8];
    for s in slots.iter() {
        bits[usize::from(s) / 8] |= 1 << (s % 8);
    }
    bits
}

/// Drops the change log's old rows, by transaction id (docs/sync.md, "Retention"): once the
/// xmin `candidate` recorded in `member_changes_floor` is older than `after_s`, every row
/// below it is deleted (all those transactions had ended when it was recorded, so no late
/// commit can land there), `floor` becomes it, and the current xmin is the next candidate.
/// One statement; concurrent callers serialize on the floor row and only one prunes.
pub fn prune(db: &mut Db, after_s: u64) -> Result<u64, DbErr> {
    let sql = format!(
        "WITH f AS (SELECT candidate FROM member_changes_floor
                     WHERE candidate_at < now() - interval '{after_s} seconds' FOR UPDATE),
              d AS (DELETE FROM member_changes WHERE xid < (SELECT candidate FROM f) RETURNING 1)
         UPDATE member_changes_floor SET floor = greatest(floor, f.candidate),
                candidate = pg_snapshot_xmin(pg_current_snapshot()), candidate_at = now()
           FROM f
         RETURNING (SELECT count(*) FROM d)"
    );
    db.run_once_own(|c, st| {
        // Read inside the transaction: a row outliving it would close its statement after
        // the commit, on whatever server connection a pooler gives next.
        by_index(c, st, |tx| {
            Ok(tx
                .query_opt(sql.as_str(), &[])?
                .map(|r| r.get::<_, i64>(0) as u64)
                .unwrap_or(0))
        })
    })
}

/// The change log is read and pruned by ranges of its xid index whatever the planner
/// believes. Right after a bulk load the log is large and not analyzed yet, and the default
/// estimate for `xid >= …` (a third of the rows) made every sync pass a sequential scan and
/// sort of the whole log: half a CPU of PostgreSQL at 10 M logged rows, until autovacuum
/// came by (measured in `make bench ARGS="--ten-million"`). The penalty that setting puts on
/// a sequential scan (of the tiny tables the same statement reads) lifts the plan's cost over
/// `jit_above_cost`, and JIT compiling it took 100 ms a pass: JIT is off for these too.
const INDEX_ONLY: &str = "SET LOCAL enable_seqscan = off; SET LOCAL jit = off";

/// Runs `f` in a read-only REPEATABLE READ transaction of its own under [`INDEX_ONLY`]: every
/// statement in it reads the one snapshot its first query takes (the sync pass's head and
/// its rows).
fn in_one_snapshot<T>(
    c: &mut postgres::Client,
    st: &crate::db::Stmts,
    f: impl FnOnce(&mut postgres::Transaction) -> Result<T, postgres::Error>,
) -> Result<T, postgres::Error> {
    let mut tx = st.begin_snapshot(c)?;
    tx.batch_execute(INDEX_ONLY)?;
    let out = f(&mut tx)?;
    tx.commit()?;
    Ok(out)
}

/// Runs `f` in a transaction of its own under [`INDEX_ONLY`] (the prune).
fn by_index<T>(
    c: &mut postgres::Client,
    st: &crate::db::Stmts,
    f: impl FnOnce(&mut postgres::Transaction) -> Result<T, postgres::Error>,
) -> Result<T, postgres::Error> {
    let mut tx = st.begin(c)?;
    tx.batch_execute(INDEX_ONLY)?;
    let out = f(&mut tx)?;
    tx.commit()?;
    Ok(out)
}
