//! The copy, the key rotation an earlier build started (docs/security.md, "Rotating a
//! tokenized set's key online"; a rotation this build starts rewrites rows in place,
//! `rotation_rewrite.rs`): a rotation found in its `copying` phase goes on to its end as it
//! began. The copy of old-form rows to their twins by the key cursor, the sweep of rows
//! written behind it (read from the change log), the end that lengthens the chain, and the
//! drain that deletes the old rows. The module computes each twin (`wrap`: it holds the
//! keys); the statements only read and write rows.

use postgres::Transaction;

use super::rotation::form_test;
use super::rotation_steps::{
    end_drain, end_walk, phase_is, refused, try_lock, watermark, wrap_all, Step, Wrap,
};
use super::table;
use crate::db::{Db, DbErr};

/// The key the copy or the drain has reached (`''` before its first step).
fn cursor(tx: &mut Transaction, set: &str) -> Result<String, postgres::Error> {
    let cursor: Option<String> = tx
        .query_one(
            "SELECT rotate_cursor FROM member_catalog WHERE name = $1",
            &[&set],
        )?
        .get(0);
    Ok(cursor.unwrap_or_default())
}

/// What one window of the copy read: how many rows, the last key among them as PostgreSQL
/// orders them (the next cursor), and which of them are old-form rows without twins.
#[derive(Default)]
struct Window {
    scanned: i64,
    last: Option<String>,
    olds: Vec<String>,
}

/// The next window of the copy: at most `limit` rows after the cursor in key order (an index
/// scan that passes each row once over the whole copy; a filter on the form and the twins in
/// the same scan made the planner sort the table's whole remainder at every step), and among
/// them the old-form rows (chain `n`) without twins.
fn next_batch(
    tx: &mut Transaction,
    set: &str,
    n: usize,
    limit: i64,
) -> Result<Window, postgres::Error> {
    let t = table(set);
    let cursor = cursor(tx, set)?;
    let sql = format!(
        "WITH s AS MATERIALIZED (
           SELECT entity_id, twin FROM {t} WHERE scope = '' AND entity_id > $1
            ORDER BY entity_id LIMIT $2)
         SELECT (SELECT count(*) FROM s), (SELECT max(entity_id) FROM s),
                ARRAY(SELECT s.entity_id FROM s
                       WHERE s.twin IS NULL AND {form}
                         AND NOT EXISTS (SELECT FROM {t} w
                                          WHERE w.twin = s.entity_id AND w.scope = '')
                       ORDER BY s.entity_id)",
        form = form_test("s.entity_id", n)
    );
    let row = tx.query_one(&sql, &[&cursor, &limit])?;
    Ok(Window {
        scanned: row.get(0),
        last: row.get(1),
        olds: row.get(2),
    })
}

/// Old-form rows written since the sweep's watermark (the change log's keys left alive) that
/// have no twin yet, and the new watermark: rows a writer put behind the copy's cursor.
fn swept(tx: &mut Transaction, set: &str, n: usize) -> Result<(Vec<String>, i64), postgres::Error> {
    let t = table(set);
    let (from, horizon, pruned) = watermark(tx, set)?;
    if pruned {
        let sql = format!(
            "SELECT m.entity_id FROM {t} m
              WHERE m.scope = '' AND m.twin IS NULL AND {form}
                AND NOT EXISTS (SELECT FROM {t} w WHERE w.twin = m.entity_id AND w.scope = '')",
            form = form_test("m.entity_id", n)
        );
        let rows = tx.query(&sql, &[])?;
        return Ok((rows.iter().map(|r| r.get(0)).collect(), horizon));
    }
    let sql = format!(
        "SELECT DISTINCT l.entity_id FROM member_changes l
           JOIN {t} m ON m.entity_id = l.entity_id AND m.scope = ''
          WHERE l.set_name = $1 AND l.xid >= $2::text::xid8 AND l.alive AND l.scope = ''
            AND {form} AND m.twin IS NULL
            AND NOT EXISTS (SELECT FROM {t} w WHERE w.twin = m.entity_id AND w.scope = '')",
        // On the log's key, so the copy's own twins (most of what a step's sweep reads) are
        // passed over before the join looks them up in the table.
        form = form_test("l.entity_id", n)
    );
    let rows = tx.query(&sql, &[&set, &from.to_string()])?;
    Ok((rows.iter().map(|r| r.get(0)).collect(), horizon))
}

/// Gives each of `olds` (old-form rows) its twin, `wrap` computing it (or saying why it
/// cannot), copying each old row's status and times: the twins made.
fn make_twins(
    tx: &mut Transaction,
    set: &str,
    olds: &[String],
    wrap: Wrap,
) -> Result<Result<u64, String>, postgres::Error> {
    if olds.is_empty() {
        return Ok(Ok(0));
    }
    let news = match wrap_all(olds, wrap) {
        Ok(news) => news,
        Err(e) => return Ok(Err(e)),
    };
    let t = table(set);
    // The old rows stay until this commits (the statement locks them as it reads them, in key
    // order): a DELETE of one waits, and then its twin trigger, a statement of its own, sees
    // the twin made here and deletes it too; a row deleted before the lock is taken gets no
    // twin. (Without the lock, a DELETE that ran between this statement's snapshot and its
    // commit would miss the twin, which would then outlive its row.)
    let made = tx.execute(
        &format!(
            "INSERT INTO {t} (entity_id, scope, status, created_at, updated_at, expires_at, twin)
             SELECT u.w, '', m.status, m.created_at, m.updated_at, m.expires_at, m.entity_id
               FROM unnest($1::text[], $2::text[]) AS u(w, o)
               JOIN {t} m ON m.entity_id = u.o AND m.scope = ''
              ORDER BY m.entity_id FOR KEY SHARE OF m
             ON CONFLICT (entity_id, scope) DO NOTHING"
        ),
        &[&news, &olds],
    )?;
    Ok(Ok(made))
}

/// One step of the copy: the next `limit` old-form rows after the cursor and the rows the
/// sweep finds get their twins (`wrap` computes a twin, or says why it cannot), the cursor
/// and the watermark move, in one transaction.
pub fn copy_step(
    db: &mut Db,
    set: &str,
    n: usize,
    limit: i64,
    wrap: Wrap,
) -> Result<Result<Step, String>, DbErr> {
    db.run_own(|c, st| {
        let mut tx = st.begin(c)?;
        if let Some(nothing) = refused(&mut tx, set, &["copying", "switching"])? {
            return Ok(Ok(nothing));
        }
        // The first step counts what there is to copy (once; before it takes any row lock).
        tx.execute(
            &format!(
                "UPDATE member_catalog SET rotate_left = (SELECT count(*) FROM {t})
                  WHERE name = $1 AND rotate_left IS NULL AND rotate_phase = 'copying'",
                t = table(set)
            ),
            &[&set],
        )?;
        let window = match limit {
            0 => Window::default(),
            _ => next_batch(&mut tx, set, n, limit)?,
        };
        let (behind, horizon) = swept(&mut tx, set, n)?;
        let olds: Vec<String> = window.olds.iter().chain(&behind).cloned().collect();
        let copied = match make_twins(&mut tx, set, &olds, wrap)? {
            Ok(made) => made,
            Err(e) => return Ok(Err(e)),
        };
        // Copying, the rows still to copy; switching (a sweep), those the drain will delete.
        let left: Option<i64> = tx
            .query_one(
                "UPDATE member_catalog
                    SET rotate_cursor = coalesce($2, rotate_cursor), rotate_swept = $3,
                        rotate_copied = rotate_copied + $4,
                        rotate_left = CASE rotate_phase
                                        WHEN 'copying' THEN greatest(rotate_left - $4, 0)
                                        ELSE rotate_left + $4 END
                  WHERE name = $1 RETURNING rotate_left",
                &[&set, &window.last, &horizon, &(copied as i64)],
            )?
            .get(0);
        tx.commit()?;
        Ok(Ok(Step {
            copied: copied as usize,
            copy_done: window.scanned < limit,
            left,
            ..Step::default()
        }))
    })
}

/// The end of the copy (`rotation_steps::end_walk`): the last rows the sweep finds get
/// twins; the drain is left every row copied to delete.
pub fn end(db: &mut Db, set: &str, n: usize, wrap: Wrap) -> Result<Result<Step, String>, DbErr> {
    end_walk(db, set, "copying", "rotate_copied + $2", &mut |tx| {
        let (behind, _) = swept(tx, set, n)?;
        make_twins(tx, set, &behind, wrap)
    })
}

/// While nodes switch: the rows written behind since the last sweep get their twins (outside
/// writers of the old form, nodes that had not read the rotation): a copy step without a
/// batch.
pub fn sweep_step(
    db: &mut Db,
    set: &str,
    n: usize,
    wrap: Wrap,
) -> Result<Result<Step, String>, DbErr> {
    copy_step(db, set, n, 0, wrap)
}

/// One step of the drain: at most `limit` old-form rows deleted. When fewer were left and
/// `may_end` (every node follows the drain, so none writes a twin or an old form), the end of
/// the drain, under the table's lock: the last old-form rows deleted, the form check
/// taking the new length alone (a late writer's old-form row is refused from here on), the
/// twin column and its index dropped, the rotation's columns cleared, the catalog version
/// bumped. Returns the rows deleted, whether the rotation is over, and about how many old-form
/// rows are left.
pub fn drain_step(
    db: &mut Db,
    set: &str,
    n: usize,
    limit: i64,
    may_end: bool,
) -> Result<(u64, bool, Option<i64>), DbErr> {
    let t = table(set);
    // A step's rows: the next old-form rows in key order after the drain's cursor (an index
    // scan that passes each row once over the whole drain; a scan from the table's start
    // each step would read the rows already drained again and again).
    // The cursor is the last row's key as PostgreSQL orders them (`max` under the column's
    // collation, as the `ORDER BY`), whatever order Rust would give the strings. The keys go
    // to the DELETE as an array, which it finds by the key's index (an `IN` of the subquery
    // was a hash join over a sequential scan of the whole table).
    let step_delete = format!(
        "WITH d AS (
           DELETE FROM {t} WHERE scope = '' AND entity_id = ANY(ARRAY(
             SELECT entity_id FROM {t}
              WHERE scope = '' AND entity_id > $2 AND {form} ORDER BY entity_id LIMIT $1))
           RETURNING entity_id)
         SELECT count(*), max(entity_id) FROM d",
        form = form_test("entity_id", n)
    );
    // The drain's end: whatever old-form row is left, behind the cursor too (a late writer's).
    let delete = format!(
        "DELETE FROM {t} WHERE scope = '' AND {form}",
        form = form_test("entity_id", n)
    );
    db.run_own(|c, st| {
        let mut tx = st.begin(c)?;
        if !try_lock(&mut tx, set)? || !phase_is(&mut tx, set, &["draining"])? {
            return Ok((0, false, None));
        }
        let cursor = cursor(&mut tx, set)?;
        let deleted = tx.query_one(&step_delete, &[&limit, &cursor])?;
        let gone = deleted.get::<_, i64>(0) as u64;
        let last: Option<String> = deleted.get(1);
        let left: Option<i64> = tx
            .query_one(
                "UPDATE member_catalog SET rotate_left = greatest(rotate_left - $2, 0),
                        rotate_cursor = coalesce($3, rotate_cursor)
                  WHERE name = $1 RETURNING rotate_left",
                &[&set, &(gone as i64), &last],
            )?
            .get(0);
        tx.commit()?;
        if gone as i64 >= limit || !may_end {
            return Ok((gone, false, left));
        }
        let delete = &delete;
        let ended = end_drain(c, st, set, &mut |tx| Ok(Ok(tx.execute(delete, &[])?)))?;
        Ok(match ended {
            Ok(Some(last)) => (gone + last, true, Some(0)),
            _ => (gone, false, left),
        })
    })
}
