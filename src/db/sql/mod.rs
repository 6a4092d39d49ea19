//! Every SQL statement libmember sends. Here: the names every part shares and the point
//! writes and reads of the hot path. The catalog and the set tables' DDL are in
//! `sql/catalog.rs`; the change log, its triggers and the sync pass's reads in
//! `sql/change_log.rs` and `sql/changes.rs`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::{Db, DbErr, Param};
use crate::model::error;

mod catalog;
mod change_log;
mod changes;
mod nodes;
mod pages;
pub mod rotation;
pub mod rotation_copy;
pub mod rotation_rewrite;
pub mod rotation_steps;

pub use catalog::{
    alter_set, create_set, drop_set, find_set, load_catalog, poll_catalog, Altered, CatalogRow,
};
pub use change_log::{blind_reason, install_notify, NOTIFY_CHANNEL};
pub(super) use change_log::{
    log_triggers_ddl, slot_triggers_ddl, source_notify_trigger, LOG_TRIGGERS,
};
pub(super) use changes::XMIN;
pub use changes::{changes_since, prune, Changes};
pub use nodes::{nodes, nodes_lacking, nodes_older, report, Needed, NodeReport, NodeSeen};
pub(crate) use pages::read_pages;
pub use pages::{Page, Sink, PAGE_ROWS};

/// Serializes the catalog's and the change log's DDL and catalog changes across nodes.
const ADVISORY_KEY: i64 = 0x6c69_626d_656d; // "libmem"

/// Bumps the catalog version inside a transaction that changed the set list (CREATE of a new
/// set, DROP): every node's periodic check sees the change and re-reads the catalog. The row
/// lock orders the changes; the version is read in the same snapshot as the rows.
pub(super) const BUMP_VERSION: &str =
    "UPDATE member_catalog_version SET version = version + 1 WHERE id = 1 RETURNING version";

/// Takes the lock of [`ADVISORY_KEY`] for the rest of `tx`.
pub fn lock_schema(tx: &mut postgres::Transaction) -> Result<(), postgres::Error> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])
        .map(drop)
}

/// Runs `ddl` (`CREATE OR REPLACE FUNCTION …`) unless every function of `names` is already
/// in the current schema with `mark` (its version) in its body: replacing an identical
/// function would still rewrite its catalog row, on every start of every node. Run under the
/// catalog's advisory lock, with the catalog DDL.
pub fn install_functions(
    tx: &mut postgres::Transaction,
    names: &[&str],
    mark: &str,
    ddl: impl FnOnce() -> String,
) -> Result<(), postgres::Error> {
    let current: bool = tx
        .query_one(
            "SELECT count(DISTINCT proname) = cardinality($1::text[]) FROM pg_proc
              WHERE proname = ANY($1::text[])
                AND pronamespace = current_schema()::regnamespace
                AND prosrc LIKE '%' || $2 || '%'",
            &[&names, &mark],
        )?
        .get(0);
    if !current {
        tx.batch_execute(&ddl())?;
    }
    Ok(())
}

/// Name of a set's table. Set names are validated to `[a-z0-9_]{1,40}`, so this is safe SQL.
pub fn table(set: &str) -> String {
    format!("member_{set}")
}

/// Whether a new set may not take `set` as its name: its table `member_<set>` would be one of
/// the module's own relations (`member_catalog`, `member_changes_floor`, the log's sequence
/// `member_changes_seq_seq`, …) or one of another set's indexes (`member_<x>_updated_at`,
/// `member_<x>_slot`, `member_<x>_pkey`): PostgreSQL keeps tables, indexes and sequences in
/// one namespace.
pub fn reserved_set_name(set: &str) -> bool {
    ["catalog", "changes"].contains(&set)
        || ["catalog_", "changes_"].iter().any(|p| set.starts_with(p))
        || ["_updated_at", "_slot", "_pkey"]
            .iter()
            .any(|s| set.ends_with(s))
}

pub(super) const ACTIVE: &str = "status = 1 AND (expires_at IS NULL OR expires_at > now())";
/// `ACTIVE` for a table aliased `m` (prefix the first column with `m.`).
const ACTIVE_M: &str = "status = 1 AND (m.expires_at IS NULL OR m.expires_at > now())";

/// Inserts memberships into a set's own table with one multi-row statement. For each item,
/// true when the call made it a member (a new row, or a deleted or expired one revived); false
/// when it already was an active member. PostgreSQL's primary key decides between concurrent
/// callers: exactly one gets true. An item given twice in one batch is inserted once; its
/// later copies get false, as if they had come just after.
///
/// While the set's key rotates, `twins` names for each row of the new form the item's old form
/// (`""` for none; empty when the set does not rotate): stored in the `twin` column, which
/// only then exists. Such a row is made a member unless it is one, and counts as made only if
/// no active row of the old form was there either (read in the statement's snapshot): the
/// item may still have a row of its old form, which lookups take as well
/// (docs/rotation-in-place.md).
pub fn add_many(
    db: &mut Db,
    set: &str,
    items: &[(&str, &str, Option<f64>)],
    twins: &[&str],
) -> Result<Vec<bool>, DbErr> {
    const ON_CONFLICT: &str = "ON CONFLICT (entity_id, scope) DO UPDATE
            SET status = 1, expires_at = EXCLUDED.expires_at, created_at = now(), updated_at = now()
            WHERE NOT (m.status = 1 AND (m.expires_at IS NULL OR m.expires_at > now()))
         RETURNING entity_id, scope";
    let t = table(set);
    let sql = if twins.is_empty() {
        format!(
            "INSERT INTO {t} AS m (entity_id, scope, status, expires_at)
             SELECT e, s, 1, to_timestamp(x)
               FROM unnest($1::text[], $2::text[], $3::float8[]) AS u(e, s, x)
             {ON_CONFLICT}"
        )
    } else {
        format!(
            "WITH was AS (SELECT o.entity_id FROM {t} o
                           WHERE (o.entity_id, o.scope) IN
                                   (SELECT * FROM unnest($4::text[], $2::text[]))
                             AND o.status = 1 AND (o.expires_at IS NULL OR o.expires_at > now()))
             INSERT INTO {t} AS m (entity_id, scope, status, expires_at, twin)
             SELECT e, s, 1, to_timestamp(x), CASE WHEN length(w) > 0 THEN w END
               FROM unnest($1::text[], $2::text[], $3::float8[], $4::text[]) AS u(e, s, x, w)
             {}",
            ON_CONFLICT
                .replace(
                    "updated_at = now()",
                    "updated_at = now(), twin = coalesce(m.twin, EXCLUDED.twin)"
                )
                .replace(
                    "RETURNING entity_id, scope",
                    "RETURNING entity_id, scope,
                               m.twin IS NOT NULL AND m.twin IN (SELECT entity_id FROM was)"
                )
        )
    };
    let mut first: HashMap<(&str, &str), usize> = HashMap::with_capacity(items.len());
    let mut rows: Vec<(&str, &str, Option<f64>, &str)> = Vec::with_capacity(items.len());
    for (i, (e, s, x)) in items.iter().enumerate() {
        if let Entry::Vacant(v) = first.entry((e, s)) {
            v.insert(i);
            rows.push((e, s, *x, twins.get(i).copied().unwrap_or("")));
        }
    }
    // Every multi-row insert takes its rows' key locks in one global order, so two that
    // overlap (MADDs, batched ADDs on other workers) wait for each other instead of
    // deadlocking, which would fail one of them.
    rows.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let (mut es, mut ss, mut xs, mut ws) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &(e, s, x, w) in &rows {
        es.push(e);
        ss.push(s);
        xs.push(x);
        ws.push(w);
    }
    // Behind a pooler the statement is planned at every call: there the rows are a VALUES
    // list, which plans quicker than three arrays taken apart.
    let values_sql = format!(
        "INSERT INTO {t} AS m (entity_id, scope, status, expires_at) VALUES $1 {ON_CONFLICT}"
    );
    // One statement, its own transaction even behind a pooler (`Stmts::hot`).
    let mut ended = false;
    let inserted = db
        .run_once_own(|c, st| {
            if !twins.is_empty() {
                let arrays = [
                    Param::Texts(&es),
                    Param::Texts(&ss),
                    Param::Floats(&xs),
                    Param::Texts(&ws),
                ];
                return st
                    .hot(c, &sql, &arrays)
                    .inspect_err(|e| ended = twin_dropped(e));
            }
            if st.pooled() {
                let members: Vec<(&str, &str, Option<f64>)> =
                    rows.iter().map(|r| (r.0, r.1, r.2)).collect();
                return st.hot(c, &values_sql, &[Param::Members(&members)]);
            }
            st.hot(
                c,
                &sql,
                &[Param::Texts(&es), Param::Texts(&ss), Param::Floats(&xs)],
            )
        })
        .map_err(|e| rotation_ended(e, ended))?;
    let mut out = vec![false; items.len()];
    for r in 0..inserted.len() {
        // A row of the new form whose item was an active member in its old form.
        if !twins.is_empty() && inserted.flag(r, 2) {
            continue;
        }
        let key = (
            inserted.text(r, 0).unwrap_or_default(),
            inserted.text(r, 1).unwrap_or_default(),
        );
        if let Some(&i) = first.get(&key) {
            out[i] = true;
        }
    }
    Ok(out)
}

/// What the database holds of one item.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Found {
    /// An active member, with its expiry (unix seconds), if it has one.
    Member(Option<f64>),
    /// A row that is a member no more: expired, or marked inactive (`status`).
    Lapsed,
    /// No row.
    Absent,
}

impl Found {
    pub fn is_member(self) -> bool {
        matches!(self, Found::Member(_))
    }

    /// What an item is when its rows say `self` and `other` (an item asked under both forms of
    /// a rotating set): a member if either row is, with the later expiry; else lapsed if
    /// either row is there.
    pub fn either(self, other: Found) -> Found {
        match (self, other) {
            (Found::Member(a), Found::Member(b)) => Found::Member(match (a, b) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            }),
            (Found::Member(x), _) | (_, Found::Member(x)) => Found::Member(x),
            (Found::Lapsed, _) | (_, Found::Lapsed) => Found::Lapsed,
            _ => Found::Absent,
        }
    }
}

/// Looks memberships up in a set's own table with one query: for each item, whether it is an
/// active member (and its expiry), a row that lapsed, or absent. Repeated items are asked once.
///
/// While the set's key rotates, `twins` gives for an item of the old form its new form (`""`
/// for none; empty when the set does not rotate): the item is then asked under both, and is a
/// member if either row is (`Found::either`), so a row is found whichever form it holds now
/// (docs/rotation-in-place.md).
pub fn lookup_many(
    db: &mut Db,
    set: &str,
    items: &[(&str, &str)],
    twins: &[&str],
) -> Result<Vec<Found>, DbErr> {
    let sql = format!(
        "SELECT m.entity_id, m.scope, EXTRACT(EPOCH FROM m.expires_at)::float8, (m.{ACTIVE_M})
           FROM {t} m
          WHERE (m.entity_id, m.scope) IN (SELECT * FROM unnest($1::text[], $2::text[]))",
        t = table(set)
    );
    let mut uniq: HashMap<(&str, &str), Found> = HashMap::with_capacity(items.len());
    let (mut es, mut ss) = (Vec::new(), Vec::new());
    for &(e, s) in items {
        if let Entry::Vacant(v) = uniq.entry((e, s)) {
            v.insert(Found::Absent);
            es.push(e);
            ss.push(s);
        }
    }
    // Each twin asked beside its item, and the items it stands for (a twin is unscoped).
    let mut twin_of: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
    for (&(e, s), &w) in items.iter().zip(twins).filter(|(_, w)| !w.is_empty()) {
        let of = twin_of.entry(w).or_default();
        if of.is_empty() && !uniq.contains_key(&(w, "")) {
            es.push(w);
            ss.push("");
        }
        of.push((e, s));
    }
    // Behind a pooler the statement is planned at every call: a batch of one scope (every
    // batch of an unscoped set) takes the form that is quickest to plan, an index scan on an
    // array of entities (1.6x the statements a second of the pairs' form, in the database).
    let one_scope = ss.windows(2).all(|w| w[0] == w[1]);
    let one_scope_sql = format!(
        "SELECT m.entity_id, m.scope, EXTRACT(EPOCH FROM m.expires_at)::float8, (m.{ACTIVE_M})
           FROM {t} m
          WHERE m.scope = $2 AND m.entity_id = ANY($1::text[])",
        t = table(set)
    );
    // One statement, its own transaction even behind a pooler (`Stmts::hot`), bounded as a
    // lookup: it ends in the database when its client stops waiting.
    let rows = db.run_lookup_own(|c, st| match ss.first() {
        Some(scope) if one_scope && st.pooled() => {
            st.hot(c, &one_scope_sql, &[Param::Texts(&es), Param::Text(scope)])
        }
        _ => st.hot(c, &sql, &[Param::Texts(&es), Param::Texts(&ss)]),
    })?;
    for r in 0..rows.len() {
        let key = (
            rows.text(r, 0).unwrap_or_default(),
            rows.text(r, 1).unwrap_or_default(),
        );
        let found = if rows.flag(r, 3) {
            Found::Member(rows.float(r, 2))
        } else {
            Found::Lapsed
        };
        let of = twin_of.get(key.0).filter(|_| key.1.is_empty());
        for item in std::iter::once(&key).chain(of.into_iter().flatten()) {
            if let Some(v) = uniq.get_mut(item) {
                *v = v.either(found);
            }
        }
    }
    Ok(items.iter().map(|k| uniq[k]).collect())
}

/// Deletes a membership row from a set's own table, and its `twin` while the set's key
/// rotates. True when an active member was removed.
pub fn del(
    db: &mut Db,
    set: &str,
    entity: &str,
    scope: &str,
    twin: Option<&str>,
) -> Result<bool, DbErr> {
    let sql = match twin {
        None => format!(
            "DELETE FROM {t} WHERE entity_id = $1 AND scope = $2 RETURNING ({ACTIVE})",
            t = table(set)
        ),
        Some(_) => format!(
            "DELETE FROM {t} WHERE entity_id IN ($1, $3) AND scope = $2 RETURNING ({ACTIVE})",
            t = table(set)
        ),
    };
    // Both forms by the key alone (no `twin` column): once the drain has ended, the old form
    // is gone and the statement still holds.
    db.run_once_own(|c, st| {
        let rows = match twin {
            None => st.hot(c, &sql, &[Param::Text(entity), Param::Text(scope)])?,
            Some(w) => st.hot(
                c,
                &sql,
                &[Param::Text(entity), Param::Text(scope), Param::Text(w)],
            )?,
        };
        Ok((0..rows.len()).any(|r| rows.flag(r, 0)))
    })
}

/// A write planned with its twin failed on the `twin` column: the rotation's drain ended
/// (and dropped it) while the write was in flight, and the statement stored nothing.
fn twin_dropped(e: &postgres::Error) -> bool {
    e.as_db_error().is_some_and(|d| {
        *d.code() == postgres::error::SqlState::UNDEFINED_COLUMN && d.message().contains("\"twin\"")
    })
}

/// The error of an ADD with twins: [`error::ROTATION_ENDED`] when the drain ended under it
/// (`ended`, [`twin_dropped`]): a retry is planned in the form the set has now.
fn rotation_ended(e: DbErr, ended: bool) -> DbErr {
    if ended {
        DbErr::Refused(error::ROTATION_ENDED)
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_asked_under_both_forms_is_a_member_if_either_row_is() {
        use Found::*;
        assert_eq!(Absent.either(Absent), Absent);
        assert_eq!(Absent.either(Lapsed), Lapsed);
        assert_eq!(Lapsed.either(Member(None)), Member(None));
        assert_eq!(Member(Some(5.0)).either(Absent), Member(Some(5.0)));
        assert_eq!(
            Member(Some(5.0)).either(Member(Some(9.0))),
            Member(Some(9.0))
        );
        // No expiry outlives any.
        assert_eq!(Member(Some(5.0)).either(Member(None)), Member(None));
        assert_eq!(Member(None).either(Lapsed), Member(None));
    }

    #[test]
    fn names_that_would_collide_with_the_modules_relations_are_reserved() {
        for name in [
            "catalog",
            "catalog_version",
            "changes",
            "changes_floor",
            "changes_seq_seq",
            "a_updated_at",
            "users_slot",
            "_slot",
            "users_pkey",
        ] {
            assert!(reserved_set_name(name), "{name}");
        }
        for name in [
            "catalogs",
            "changes2",
            "slot",
            "updated_at",
            "slots",
            "a_slot_1",
            "users",
            "pkey",
        ] {
            assert!(!reserved_set_name(name), "{name}");
        }
    }
}
