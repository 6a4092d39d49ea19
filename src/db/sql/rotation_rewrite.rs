//! The steps of an online key rotation that rewrites each row in place
//! (docs/rotation-in-place.md): the walk of the table's pages, each old-form row given its
//! new form and naming its old one (`twin`), a row whose new form is already there merged
//! into it; the sweep of rows written behind the walk (read from the change log); the end
//! that lengthens the chain; and the end of the drain, which drops the `twin` column and
//! deletes no row. Each is one transaction under the set's rotation lock
//! (`rotation_steps.rs`). The module computes each new form (`wrap`: it holds the keys); the
//! statements only read and write rows.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use postgres::error::SqlState;
use postgres::Transaction;

use super::rotation::form_test;
use super::rotation_steps::{
    end_drain, end_walk, phase_is, refused, try_lock, watermark, wrap_all, Step, Wrap,
};
use super::table;
use crate::db::{Db, DbErr};

/// Heap pages a step of the walk reads: about 16 000 rows of a tokenized set's table (65 to
/// a page).
pub const PAGES: i64 = 250;

/// Whether the walk's steps look for new forms already there before they rewrite (see
/// [`rewrite`]): set when a step met one, cleared when a step that looked found none.
static LOOK_FIRST: AtomicBool = AtomicBool::new(false);

/// How often a step that met a writer (a new form committed after it looked, a deadlock on
/// a row lock) is tried again at once, in a new transaction, before it fails.
const TRIES: usize = 3;

/// The keys `sql` reads (its first column).
fn keys(
    tx: &mut Transaction,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<Vec<String>, postgres::Error> {
    Ok(tx.query(sql, params)?.iter().map(|r| r.get(0)).collect())
}

/// A range of heap pages, `[from, to)`, as the bounds of a TID range scan.
fn tids(from: i64, to: i64) -> (String, String) {
    (format!("({from},0)"), format!("({to},0)"))
}

/// The old-form rows (chain `n`, no twin) in pages `[from, to)`: a TID range scan reads each
/// page once and probes no index. A row a step rewrote has a twin, wherever its new version
/// landed, and so is not read again.
fn in_pages(
    tx: &mut Transaction,
    set: &str,
    n: usize,
    (from, to): (i64, i64),
) -> Result<Vec<String>, postgres::Error> {
    let sql = format!(
        "SELECT entity_id FROM {t}
          WHERE ctid >= $1::text::tid AND ctid < $2::text::tid
            AND scope = '' AND twin IS NULL AND {form}",
        t = table(set),
        form = form_test("entity_id", n)
    );
    let (from, to) = tids(from, to);
    keys(tx, &sql, &[&from, &to])
}

/// Every old-form row of the table, wherever it lies and however old: the drain's last look.
fn everywhere(tx: &mut Transaction, set: &str, n: usize) -> Result<Vec<String>, postgres::Error> {
    let sql = format!(
        "SELECT entity_id FROM {t} WHERE scope = '' AND twin IS NULL AND {form}",
        t = table(set),
        form = form_test("entity_id", n)
    );
    keys(tx, &sql, &[])
}

/// Old-form rows written since the sweep's watermark (the change log's keys left alive),
/// and the next watermark: rows a writer put behind the walk, or a row a writer changed
/// while a step read it (its new version lies elsewhere).
fn behind(
    tx: &mut Transaction,
    set: &str,
    n: usize,
) -> Result<(Vec<String>, i64), postgres::Error> {
    let (from, horizon, pruned) = watermark(tx, set)?;
    if pruned {
        return Ok((everywhere(tx, set, n)?, horizon));
    }
    let sql = format!(
        "SELECT DISTINCT m.entity_id FROM member_changes l
           JOIN {t} m ON m.entity_id = l.entity_id AND m.scope = ''
          WHERE l.set_name = $1 AND l.xid >= $2::text::xid8 AND l.alive AND l.scope = ''
            AND {form} AND m.twin IS NULL",
        t = table(set),
        // On the log's key, so the rows the walk rewrote (most of what a step's sweep reads)
        // are passed over before the join looks them up in the table.
        form = form_test("l.entity_id", n)
    );
    Ok((keys(tx, &sql, &[&set, &from.to_string()])?, horizon))
}

/// Rewrites the rows of keys `olds` in place (read in pages `pages`, when given: the
/// statement then reads those pages again rather than probe the key's index for each),
/// `wrap` computing each new form (or saying why it cannot): a row whose new form is not
/// there yet takes it, naming its old one; one whose new form is there (an ADD's row, an
/// outside writer's) is merged into that row (a member if either was, with the later expiry,
/// none outliving any, as lookups answer: `Found::either`) and deleted. A row a writer
/// changed since it was read is rewritten as it is now, or, if its new version lies outside
/// `pages`, left to the sweep. The rows rewritten or merged.
///
/// Without `look`, the new forms already there are not looked for (the look, an index probe
/// for each row, took 5–10 % of a step in the bench, and finds none unless writers added
/// items during the rotation): a row whose new form is there then fails the `UPDATE` on the
/// key, and the step is tried again with `look`.
fn rewrite(
    tx: &mut Transaction,
    set: &str,
    olds: &[String],
    pages: Option<(i64, i64)>,
    look: bool,
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
    // The new forms already there, locked until this commits (a DELETE of one waits).
    let there: HashSet<String> = match look {
        true => keys(
            tx,
            &format!(
                "SELECT entity_id FROM {t} WHERE scope = '' AND entity_id = ANY($1)
                  ORDER BY entity_id FOR UPDATE"
            ),
            &[&news],
        )?
        .into_iter()
        .collect(),
        false => HashSet::new(),
    };
    if look && there.is_empty() {
        LOOK_FIRST.store(false, Ordering::Relaxed);
    }
    let (mut moved, mut merged) = ((vec![], vec![]), (vec![], vec![]));
    for (o, w) in olds.iter().zip(news) {
        let to = if there.contains(&w) {
            &mut merged
        } else {
            &mut moved
        };
        to.0.push(o.clone());
        to.1.push(w);
    }
    let mut done = 0;
    if !merged.0.is_empty() {
        done += tx.execute(
            &format!(
                "WITH p AS (SELECT * FROM unnest($1::text[], $2::text[]) AS p(o, w)),
                 gone AS (
                   DELETE FROM {t} m USING p WHERE m.entity_id = p.o AND m.scope = ''
                   RETURNING p.o, p.w, m.expires_at,
                             m.status = 1 AND (m.expires_at IS NULL OR m.expires_at > now()) AS live)
                 UPDATE {t} n
                    SET twin = coalesce(n.twin, g.o),
                        status = CASE WHEN g.live THEN 1 ELSE n.status END,
                        expires_at = CASE
                          WHEN NOT g.live THEN n.expires_at
                          WHEN NOT (n.status = 1 AND (n.expires_at IS NULL OR n.expires_at > now()))
                            THEN g.expires_at
                          WHEN n.expires_at IS NULL OR g.expires_at IS NULL THEN NULL
                          ELSE greatest(n.expires_at, g.expires_at) END
                   FROM gone g WHERE n.entity_id = g.w AND n.scope = ''"
            ),
            &[&merged.0, &merged.1],
        )?;
    }
    if !moved.0.is_empty() {
        let set_new = format!(
            "UPDATE {t} m SET entity_id = u.w, twin = u.o
               FROM unnest($1::text[], $2::text[]) AS u(o, w)
              WHERE m.entity_id = u.o AND m.scope = '' AND m.twin IS NULL"
        );
        done += match pages {
            Some((from, to)) => {
                // A hash join of the pages' rows and the keys, whatever the table's statistics
                // say. Where they are stale (a table just filled, before autovacuum's ANALYZE)
                // the pages' rows are estimated at 1, and a nested loop that reads all the
                // keys for each row costs barely more in the plan than the hash join: for
                // 16 250 rows it took 57 s against 0.47 s, and in a test, just after
                // PostgreSQL restarted, the step met the statement timeout.
                tx.batch_execute("SET LOCAL enable_nestloop = off")?;
                let (from, to) = tids(from, to);
                let done = tx.execute(
                    &format!("{set_new} AND m.ctid >= $3::text::tid AND m.ctid < $4::text::tid"),
                    &[&moved.0, &moved.1, &from, &to],
                )?;
                tx.batch_execute("SET LOCAL enable_nestloop = on")?;
                done
            }
            None => tx.execute(&set_new, &[&moved.0, &moved.1])?,
        };
    }
    Ok(Ok(done))
}

/// Whether a step met a writer and is tried again at once: its `UPDATE` met a new form
/// committed after it looked (the next try merges), or a row lock's deadlock.
fn met_writer(e: &postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| *c == SqlState::UNIQUE_VIOLATION || *c == SqlState::T_R_DEADLOCK_DETECTED)
}

/// One step of the walk: the old-form rows of the next `pages` pages up to the end recorded
/// at the start, and the rows the sweep finds, are rewritten in place; the cursor and the
/// watermark move, in one transaction. With `pages` 0, the sweep alone (while nodes switch).
pub fn rewrite_step(
    db: &mut Db,
    set: &str,
    n: usize,
    pages: i64,
    wrap: Wrap,
) -> Result<Result<Step, String>, DbErr> {
    db.run_own(|c, st| {
        let mut tries = 0;
        loop {
            let mut tx = st.begin(c)?;
            let look = tries > 0 || LOOK_FIRST.load(Ordering::Relaxed);
            match walk(&mut tx, set, n, pages, look, wrap) {
                Err(e) if met_writer(&e) && tries + 1 < TRIES => {
                    LOOK_FIRST.store(true, Ordering::Relaxed);
                    tries += 1
                }
                Ok(Ok(step)) if !step.busy && !step.stale => {
                    tx.commit()?;
                    return Ok(Ok(step));
                }
                done => return done,
            }
        }
    })
}

fn walk(
    tx: &mut Transaction,
    set: &str,
    n: usize,
    pages: i64,
    look: bool,
    wrap: Wrap,
) -> Result<Result<Step, String>, postgres::Error> {
    if let Some(nothing) = refused(tx, set, &["rewriting", "switching"])? {
        return Ok(Ok(nothing));
    }
    let t = table(set);
    // The first step counts what there is to rewrite.
    tx.execute(
        &format!(
            "UPDATE member_catalog SET rotate_left = (SELECT count(*) FROM {t})
              WHERE name = $1 AND rotate_left IS NULL AND rotate_phase = 'rewriting'"
        ),
        &[&set],
    )?;
    let r = tx.query_one(
        "SELECT coalesce(rotate_page, 0), coalesce(rotate_pages, 0) FROM member_catalog
          WHERE name = $1",
        &[&set],
    )?;
    let (page, end): (i64, i64) = (r.get(0), r.get(1));
    let upto = (page + pages).min(end).max(page);
    let walked = match upto > page {
        true => in_pages(tx, set, n, (page, upto))?,
        false => vec![],
    };
    let (mut swept, horizon) = behind(tx, set, n)?;
    // A row both found (written behind the walk, in the pages it reads now) is walked.
    let seen: HashSet<&String> = walked.iter().collect();
    swept.retain(|k| !seen.contains(k));
    let done = match rewrite(tx, set, &walked, Some((page, upto)), look, wrap)? {
        Ok(walked) => match rewrite(tx, set, &swept, None, look, wrap)? {
            Ok(swept) => walked + swept,
            Err(e) => return Ok(Err(e)),
        },
        Err(e) => return Ok(Err(e)),
    };
    let left: Option<i64> = tx
        .query_one(
            "UPDATE member_catalog
                SET rotate_page = $2, rotate_swept = $3, rotate_copied = rotate_copied + $4,
                    rotate_left = CASE rotate_phase
                                    WHEN 'rewriting' THEN greatest(rotate_left - $4, 0)
                                    ELSE rotate_left END
              WHERE name = $1 RETURNING rotate_left",
            &[&set, &upto, &horizon, &(done as i64)],
        )?
        .get(0);
    Ok(Ok(Step {
        copied: done as usize,
        copy_done: upto >= end,
        left,
        ..Step::default()
    }))
}

/// The end of the walk (`rotation_steps::end_walk`): the last rows the sweep finds are
/// rewritten; the drain is left no row to delete.
pub fn end(db: &mut Db, set: &str, n: usize, wrap: Wrap) -> Result<Result<Step, String>, DbErr> {
    end_walk(db, set, "rewriting", "0", &mut |tx| {
        let (olds, _) = behind(tx, set, n)?;
        rewrite(tx, set, &olds, None, true, wrap)
    })
}

/// One step of the drain: the rows the sweep finds are rewritten (a late writer's old form).
/// When `may_end` (every node follows the drain, so none writes an old form), the end of the
/// drain (`rotation_steps::end_drain`): every old-form row left is rewritten (a full scan:
/// one the change log does not carry, a lapsed row, too), and the `twin` column dropped (a
/// change of the catalog: no row is written). Returns the rows rewritten and whether the
/// rotation is over.
pub fn drain_step(
    db: &mut Db,
    set: &str,
    n: usize,
    may_end: bool,
    wrap: Wrap,
) -> Result<Result<(u64, bool), String>, DbErr> {
    db.run_own(|c, st| {
        let mut tx = st.begin(c)?;
        if !try_lock(&mut tx, set)? || !phase_is(&mut tx, set, &["draining"])? {
            return Ok(Ok((0, false)));
        }
        let (olds, horizon) = behind(&mut tx, set, n)?;
        let swept = match rewrite(&mut tx, set, &olds, None, true, wrap)? {
            Ok(done) => done,
            Err(e) => return Ok(Err(e)),
        };
        tx.execute(
            "UPDATE member_catalog SET rotate_swept = $2 WHERE name = $1",
            &[&set, &horizon],
        )?;
        tx.commit()?;
        if !may_end {
            return Ok(Ok((swept, false)));
        }
        let ended = end_drain(c, st, set, &mut |tx| {
            let olds = everywhere(tx, set, n)?;
            rewrite(tx, set, &olds, None, true, wrap)
        })?;
        Ok(ended.map(|last| match last {
            Some(last) => (swept + last, true),
            None => (swept, false),
        }))
    })
}
