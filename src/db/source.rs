//! Attached sets (docs/attach.md): the SQL that reads a table the module does not own (the
//! checks MEMBER.CREATE runs on it are in `source_check`). Every name the caller gave is
//! looked up in the catalog with bound parameters, and quoted (`quote_ident`, always) wherever
//! it appears in generated SQL; the module never writes to the table, and alters it only when
//! asked (`SYNC log`: triggers, in `source_triggers`).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::sql::{read_pages, Found, Sink};
use postgres::types::Type;

use super::{Db, DbErr};
use crate::model::canon::Normalize;
use crate::model::set_def::{SetDef, Source, SourceSync};

/// A time watermark (UPDATED-COLUMN sets) is stored in the filter's watermark field as this
/// plus microseconds since the epoch (the database's clock). Transaction-id watermarks stay far
/// below it, so a value of one kind is never taken for the other (see `is_time`).
pub const TIME_BASE: i64 = 1 << 62;

/// True when `w` is a time watermark.
pub fn is_time(w: i64) -> bool {
    w >= TIME_BASE
}

/// `s` as a PostgreSQL identifier, always quoted: exact case, any character.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `s` as a PostgreSQL string literal, safe whatever `standard_conforming_strings` says.
pub fn quote_literal(s: &str) -> String {
    if s.contains('\\') {
        format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// A name as an error reply shows it: quoted, then escaped to printable ASCII.
pub fn shown(s: &str) -> String {
    crate::server::reply::escape(quote_ident(s).as_bytes())
}

/// `"schema"."table"`.
pub fn qualified(src: &Source) -> String {
    format!("{}.{}", quote_ident(&src.schema), quote_ident(&src.table))
}

/// The item as the filter hashes it: the column as text, lowercased by PostgreSQL too under
/// NORMALIZE lower (then by `canon`, which trims: see docs/attach.md).
fn entity_expr(src: &Source, norm: Normalize) -> String {
    let c = quote_ident(&src.column);
    match norm {
        Normalize::Lower => format!("lower({c}::text)"),
        _ => format!("{c}::text"),
    }
}

fn scope_expr(src: &Source) -> String {
    src.scope_column
        .as_ref()
        .map_or_else(|| "''".to_string(), |s| format!("{}::text", quote_ident(s)))
}

/// `col IS NOT NULL [AND scope IS NOT NULL]`: rows no lookup can match are left out.
fn not_null(src: &Source) -> String {
    let mut w = format!("{} IS NOT NULL", quote_ident(&src.column));
    if let Some(s) = &src.scope_column {
        w.push_str(&format!(" AND {} IS NOT NULL", quote_ident(s)));
    }
    w
}

/// The rows a filter is built from, as `entity \t scope` text rows.
pub fn copy_sql(src: &Source, norm: Normalize) -> String {
    format!(
        "COPY (SELECT {}, {} FROM {} WHERE {}) TO STDOUT",
        entity_expr(src, norm),
        scope_expr(src),
        qualified(src),
        not_null(src)
    )
}

/// The cold path's point query. Parameters: the canonical item twice (one compared with the
/// column's own type, so its index serves, one as text, so the match is exact: a `char(n)` or
/// `citext` column compares more loosely than the filter does), then the scope twice.
/// NORMALIZE lower: `lower(col::text) = $1` (an index on `lower(col)` serves; CREATE checks).
pub fn point_sql(src: &Source, norm: Normalize) -> String {
    let c = quote_ident(&src.column);
    let mut w = match norm {
        Normalize::Lower => format!("lower({c}::text) = $1 AND $2::text IS NOT NULL"),
        _ => format!("{c} = $1 AND {c}::text = $2"),
    };
    if let Some(s) = &src.scope_column {
        let s = quote_ident(s);
        w.push_str(&format!(" AND {s} = $3 AND {s}::text = $4"));
    } else {
        w.push_str(" AND $3::text IS NOT NULL AND $4::text IS NOT NULL");
    }
    format!("SELECT 1 FROM {} WHERE {w} LIMIT 1", qualified(src))
}

/// UPDATED-COLUMN polling: the rows stamped at or after `$1` (microseconds since the epoch).
pub fn poll_sql(src: &Source, norm: Normalize, updated: &str) -> String {
    format!(
        "SELECT {}, {} FROM {} WHERE {} >= to_timestamp($1::float8 / 1000000) AND {}",
        entity_expr(src, norm),
        scope_expr(src),
        qualified(src),
        quote_ident(updated),
        not_null(src)
    )
}

/// The database's clock, as a time watermark (see `TIME_BASE`).
pub const NOW_WATERMARK: &str =
    "SELECT (EXTRACT(EPOCH FROM now()) * 1000000)::int8 + 4611686018427387904";

pub use super::source_triggers::{
    drop_log_triggers, install_log_triggers, refuse_module_relation, trigger_names, LOG_FN_DDL,
};

pub fn shown_table(src: &Source) -> String {
    format!("{}.{}", shown(&src.schema), shown(&src.table))
}

/// Attached sets this node knows, for the workers (which see only a set's name): set name →
/// source and normalization. Written on the main thread when a set is learned or forgotten;
/// read by workers, which clone the entry and release the lock before any database call.
static SOURCES: RwLock<Option<HashMap<String, Attached>>> = RwLock::new(None);

/// An attached set's source and normalization, as the workers read them.
pub type Attached = Arc<(Source, Normalize)>;

/// Records `def` (an attached set) or forgets it (an own set) for the workers.
pub fn remember(def: &SetDef) {
    let mut g = SOURCES.write().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    match &def.source {
        Some(s) => {
            m.insert(def.name.clone(), Arc::new((s.clone(), def.normalize)));
        }
        None => {
            m.remove(&def.name);
        }
    }
}

/// Forgets a dropped set.
pub fn forget(name: &str) {
    let mut g = SOURCES.write().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = g.as_mut() {
        m.remove(name);
    }
}

/// The source of set `name`, if it is an attached set.
pub fn of(name: &str) -> Option<Attached> {
    let g = SOURCES.read().unwrap_or_else(|e| e.into_inner());
    g.as_ref().and_then(|m| m.get(name).cloned())
}

/// Point lookups in the source table, one indexed query per distinct item (prepared once per
/// connection). For each item a member without expiry (the table has none) or absent.
pub fn lookup_many(
    db: &mut Db,
    src: &(Source, Normalize),
    items: &[(&str, &str)],
) -> Result<Vec<Found>, DbErr> {
    let sql = point_sql(&src.0, src.1);
    let mut seen: HashMap<(&str, &str), bool> = HashMap::with_capacity(items.len());
    db.run_lookup(|c, st| {
        for &(e, s) in items {
            if let Entry::Vacant(v) = seen.entry((e, s)) {
                let params: [(&(dyn postgres::types::ToSql + Sync), Type); 4] = [
                    (&e, Type::TEXT),
                    (&e, Type::TEXT),
                    (&s, Type::TEXT),
                    (&s, Type::TEXT),
                ];
                v.insert(st.query_opt(c, &sql, &params)?.is_some());
            }
        }
        Ok(())
    })?;
    Ok(items
        .iter()
        .map(|k| match seen.get(k) {
            Some(true) => Found::Member(None),
            _ => Found::Absent,
        })
        .collect())
}

/// MEMBER.ADD on an attached set: "I have just committed this row" — true for each item whose
/// row the source holds. Never writes.
pub fn confirm_many(
    db: &mut Db,
    src: &(Source, Normalize),
    items: &[(&str, &str, Option<f64>)],
) -> Result<Vec<bool>, DbErr> {
    let keys: Vec<(&str, &str)> = items.iter().map(|(e, s, _)| (*e, *s)).collect();
    Ok(lookup_many(db, src, &keys)?
        .into_iter()
        .map(Found::is_member)
        .collect())
}

/// One UPDATED-COLUMN poll (docs/attach.md) of set `set`: the canonical hashes of the rows
/// stamped at or after `from_us` minus `lookback_ms` go to `sink` in pages of at most
/// `sql::PAGE_ROWS` rows; returns the time watermark they cover (the database's `now()` at
/// the poll's start).
pub fn poll(
    db: &mut Db,
    set: &str,
    src: &(Source, Normalize),
    from: i64,
    lookback_ms: i64,
    sink: &mut Sink,
) -> Result<i64, DbErr> {
    let SourceSync::Updated(u) = &src.0.sync else {
        return Err(DbErr::Failed("not an UPDATED-COLUMN set".into()));
    };
    let sql = poll_sql(&src.0, src.1, u);
    // In a cluster each row carries its canonical slot: the main thread applies a node's own.
    let in_cluster = crate::server::cluster_mode::enabled();
    let since = (from - TIME_BASE).max(0) - lookback_ms.saturating_mul(1000);
    let since = since as f64;
    db.run_own(|c, st| {
        let mut tx = st.begin(c)?;
        let horizon: i64 = tx.query_one(NOW_WATERMARK, &[])?.get(0);
        let portal = tx.bind(sql.as_str(), &[&since])?;
        let read = read_pages(&mut tx, &portal, sink, |_, r, page| {
            page.push(set, src.1, r.get(0), r.get(1), in_cluster);
        })?;
        drop(portal);
        tx.commit()?;
        Ok(read.map(|()| horizon))
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(scope: bool) -> Source {
        Source {
            schema: "we\"ird".into(),
            table: "Users; DROP TABLE x".into(),
            column: "user name".into(),
            scope_column: scope.then(|| "Org".into()),
            sync: SourceSync::Log,
        }
    }

    #[test]
    fn identifiers_are_always_quoted() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("a\\b'"), "E'a\\\\b'''");
        let s = src(true);
        assert_eq!(qualified(&s), "\"we\"\"ird\".\"Users; DROP TABLE x\"");
        assert_eq!(
            copy_sql(&s, Normalize::None),
            "COPY (SELECT \"user name\"::text, \"Org\"::text FROM \"we\"\"ird\".\"Users; DROP \
             TABLE x\" WHERE \"user name\" IS NOT NULL AND \"Org\" IS NOT NULL) TO STDOUT"
        );
        let p = point_sql(&src(false), Normalize::Lower);
        assert!(p.contains("lower(\"user name\"::text) = $1"), "{p}");
        assert!(point_sql(&s, Normalize::None).contains("\"Org\" = $3 AND \"Org\"::text = $4"));
    }

    #[test]
    fn time_watermarks_are_told_from_transaction_ids() {
        assert!(!is_time(1_000_000_000));
        assert!(is_time(TIME_BASE + 1_700_000_000_000_000));
        assert_eq!(
            NOW_WATERMARK.rsplit(" + ").next().unwrap(),
            TIME_BASE.to_string()
        );
    }
}
