//! The checks MEMBER.CREATE runs on an attached set's source table (docs/attach.md), all
//! against the database's catalog with bound parameters, inside CREATE's transaction: a
//! refusal rolls it back, so nothing is created. (The operator's `member.attach-allow` is
//! checked before, on the arguments: `command::admin::attach::allowed`.)

use postgres::Transaction;

use super::source::{point_sql, shown, shown_table};
use super::DbErr;
use crate::model::canon::Normalize;
use crate::model::set_def::{SetDef, Source, SourceSync};

/// Checks an attached set's source at CREATE (docs/attach.md): the table, its columns and
/// their types, a unique key the point query can use, the module's SELECT privilege, and for
/// `SYNC log` its right to add triggers. `Err(DbErr::Invalid)` names what is wrong; the caller
/// rolls its transaction back, so nothing is created.
pub fn validate(tx: &mut Transaction, def: &SetDef) -> Result<(), DbErr> {
    let Some(src) = &def.source else {
        return Ok(());
    };
    let db = |e: postgres::Error| super::classify(&e);
    let bad = |m: String| Err(DbErr::Invalid(m));
    let table = tx
        .query_opt(
            "SELECT c.oid, c.relkind::text, has_schema_privilege(n.oid, 'USAGE') FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND c.relname = $2",
            &[&src.schema, &src.table],
        )
        .map_err(db)?;
    let Some(table) = table else {
        return bad(format!("SOURCE table {} does not exist", shown_table(src)));
    };
    let oid: u32 = table.get(0);
    if !matches!(table.get::<_, &str>(1), "r" | "p") {
        return bad(format!(
            "SOURCE {} is not a table (views and other relations cannot be attached)",
            shown_table(src)
        ));
    }
    // Whatever `member.attach-allow` says (docs/attach.md).
    super::source::refuse_module_relation(tx, src)?;
    let column = |tx: &mut Transaction, what: &str, name: &str| {
        tx.query_opt(
            "SELECT a.attnum, t.typname::text, format_type(a.atttypid, a.atttypmod)
               FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
              WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            &[&oid, &name],
        )
        .map_err(db)?
        .map(|r| {
            (
                r.get::<_, i16>(0),
                r.get::<_, String>(1),
                r.get::<_, String>(2),
            )
        })
        .ok_or_else(|| {
            DbErr::Invalid(format!(
                "{what} {} does not exist in {}",
                shown(name),
                shown_table(src)
            ))
        })
    };
    let text_like = |what: &str, name: &str, (_, typ, full): &(i16, String, String)| {
        if matches!(typ.as_str(), "text" | "varchar" | "bpchar" | "citext") {
            Ok(())
        } else {
            Err(DbErr::Invalid(format!(
                "{what} {} is of type {}: an attached set's {} must be text, varchar, char or \
                 citext",
                shown(name),
                crate::server::reply::escape(full.as_bytes()),
                what.to_lowercase()
            )))
        }
    };
    let col = column(tx, "COLUMN", &src.column)?;
    text_like("COLUMN", &src.column, &col)?;
    let mut keys = vec![col.0];
    let mut names = vec![src.column.clone()];
    if let Some(s) = &src.scope_column {
        let sc = column(tx, "SCOPE-COLUMN", s)?;
        text_like("SCOPE-COLUMN", s, &sc)?;
        keys.push(sc.0);
        names.push(s.clone());
    }
    if let SourceSync::Updated(u) = &src.sync {
        let uc = column(tx, "UPDATED-COLUMN", u)?;
        if !matches!(uc.1.as_str(), "timestamptz" | "timestamp") {
            return bad(format!(
                "UPDATED-COLUMN {} is of type {}: it must be timestamptz or timestamp",
                shown(u),
                crate::server::reply::escape(uc.2.as_bytes())
            ));
        }
        names.push(u.clone());
    }
    if !table.get::<_, bool>(2) {
        return bad(format!(
            "the module's database role lacks USAGE on schema {}: GRANT USAGE ON SCHEMA {} TO \
             the module's role",
            shown(&src.schema),
            shown(&src.schema)
        ));
    }
    for name in &names {
        let ok: bool = tx
            .query_one(
                "SELECT has_column_privilege($1::oid, $2::text, 'SELECT')",
                &[&oid, name],
            )
            .map_err(db)?
            .get(0);
        if !ok {
            return bad(format!(
                "the module's database role lacks SELECT on {} of {}: GRANT SELECT ON {} TO \
                 the module's role",
                shown(name),
                shown_table(src),
                shown_table(src)
            ));
        }
    }
    check_key(tx, def, src, oid, &mut keys)?;
    if src.sync == SourceSync::Log {
        let ok: bool = tx
            .query_one("SELECT has_table_privilege($1::oid, 'TRIGGER')", &[&oid])
            .map_err(db)?
            .get(0);
        if !ok {
            return bad(format!(
                "SYNC log needs to install change-log triggers on {}: the module's database \
                 role must own it or hold TRIGGER on it (or use UPDATED-COLUMN, see \
                 docs/attach.md)",
                shown_table(src)
            ));
        }
    }
    Ok(())
}

/// The point query must be indexed and find one row per item. NORMALIZE none: a unique index
/// (or primary key) on exactly (COLUMN) or (SCOPE-COLUMN, COLUMN), any order, without a
/// predicate or expression. NORMALIZE lower: the planner must serve `lower(col::text) = $1`
/// from an index (an index on `lower(col)`), asked with sequential scans turned off.
fn check_key(
    tx: &mut Transaction,
    def: &SetDef,
    src: &Source,
    oid: u32,
    keys: &mut [i16],
) -> Result<(), DbErr> {
    let db = |e: postgres::Error| super::classify(&e);
    let t = shown_table(src);
    if def.normalize == Normalize::Lower {
        tx.batch_execute("SET LOCAL enable_seqscan = off")
            .map_err(db)?;
        let plan: Vec<String> = tx
            .query(
                &format!("EXPLAIN {}", point_sql(src, def.normalize)),
                &[&"x", &"x", &"x", &"x"],
            )
            .map_err(db)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.batch_execute("SET LOCAL enable_seqscan = on")
            .map_err(db)?;
        // A condition on the index itself: with sequential scans off, a full scan of some
        // other index would also say "Index".
        if !plan
            .iter()
            .any(|l| l.contains("Index Cond") && l.contains("lower("))
        {
            return Err(DbErr::Invalid(format!(
                "NORMALIZE lower needs an index on lower({}) of {} for the point lookup \
                 (CREATE UNIQUE INDEX ON {} (lower({})))",
                shown(&src.column),
                t,
                t,
                shown(&src.column)
            )));
        }
        return Ok(());
    }
    keys.sort_unstable();
    let ok: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_index i
                WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL
                  AND i.indexprs IS NULL
                  AND (SELECT array_agg(k ORDER BY k) FROM unnest(i.indkey::int2[])
                         WITH ORDINALITY AS u(k, n) WHERE n <= i.indnkeyatts) = $2::int2[])",
            &[&oid, &keys.to_vec()],
        )
        .map_err(db)?
        .get(0);
    if ok {
        return Ok(());
    }
    let cols = match &src.scope_column {
        Some(s) => format!("({}, {})", shown(s), shown(&src.column)),
        None => format!("({})", shown(&src.column)),
    };
    Err(DbErr::Invalid(format!(
        "{t} has no usable key: an attached set needs a primary key or unique index on exactly \
         {cols} (in any order), so each lookup is one indexed row"
    )))
}
