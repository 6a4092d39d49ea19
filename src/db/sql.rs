//! Every SQL statement libmember sends: the catalog, the per-set tables, the point writes and
//! reads, and the COPY stream a filter is built from.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};

use postgres::Client;

use super::{prepared, Db, DbErr};
use crate::canon::{self, Normalize};
use crate::error;
use crate::filter::Bloom;
use crate::state::SetDef;

const ADVISORY_KEY: i64 = 0x6c69_626d_656d; // "libmem"

const CATALOG_DDL: &str = "CREATE TABLE IF NOT EXISTS member_catalog (
    name text PRIMARY KEY,
    error_rate double precision NOT NULL,
    capacity bigint NOT NULL,
    cache_ttl integer NOT NULL,
    recent_ttl integer NOT NULL,
    normalize text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS member_catalog_version (
    id smallint PRIMARY KEY CHECK (id = 1),
    version bigint NOT NULL
);
INSERT INTO member_catalog_version VALUES (1, 0) ON CONFLICT DO NOTHING";

/// Bumps the catalog version inside a transaction that changed the set list (CREATE of a new
/// set, DROP): every node's periodic check sees the change and re-reads the catalog. The row
/// lock orders the changes; the version is read in the same snapshot as the rows.
const BUMP_VERSION: &str =
    "UPDATE member_catalog_version SET version = version + 1 WHERE id = 1 RETURNING version";

/// Name of a set's table. Set names are validated to `[a-z0-9_]{1,40}`, so this is safe SQL.
pub fn table(set: &str) -> String {
    format!("member_{set}")
}

const ACTIVE: &str = "status = 1 AND (expires_at IS NULL OR expires_at > now())";
/// `ACTIVE` for a table aliased `m` (prefix the first column with `m.`).
const ACTIVE_M: &str = "status = 1 AND (m.expires_at IS NULL OR m.expires_at > now())";

/// The sync horizon, in microseconds since the epoch: the start of the oldest transaction
/// still open in this database (its rows, defaulting `updated_at` to its start, may commit
/// later), or now. Every row committed later has `updated_at` at or after it — as long as
/// writers let `updated_at` default to `now()`. Seeing other roles' transactions needs
/// superuser or `pg_read_all_stats`.
///
/// It must be read *before* the snapshot the rows are read in is taken: a transaction that
/// commits between a snapshot and a later look at `pg_stat_activity` would be in neither.
const HORIZON: &str = "SELECT (EXTRACT(EPOCH FROM least(now(), coalesce(
        (SELECT min(xact_start) FROM pg_stat_activity
          WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()
            AND backend_type = 'client backend' AND datname = current_database()),
        now()))) * 1000000)::int8";

fn set_ddl(set: &str) -> String {
    let t = table(set);
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (
            entity_id text NOT NULL,
            scope text NOT NULL DEFAULT '',
            status smallint NOT NULL DEFAULT 1,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz,
            PRIMARY KEY (entity_id, scope)
        );
        CREATE INDEX IF NOT EXISTS {t}_updated_at ON {t} (updated_at);"
    )
}

/// A set's catalog row: its definition and the identity of this row (its creation time in
/// microseconds), which tells a set dropped and created again under the same name from the
/// one a node knew.
#[derive(Clone, Debug)]
pub struct CatalogRow {
    pub def: SetDef,
    pub id: i64,
}

/// The catalog columns `row_at` reads, for a table aliased `a`.
fn catalog_columns(a: &str) -> String {
    format!(
        "{a}.name, {a}.error_rate, {a}.capacity, {a}.cache_ttl, {a}.recent_ttl, {a}.normalize,
         (EXTRACT(EPOCH FROM {a}.created_at) * 1000000)::int8"
    )
}

/// A catalog row from the `catalog_columns` starting at column `at`.
fn row_at(row: &postgres::Row, at: usize) -> Option<CatalogRow> {
    let def = SetDef {
        name: row.get(at),
        error_rate: row.get(at + 1),
        capacity: row.get::<_, i64>(at + 2) as u64,
        cache_ttl: row.get::<_, i32>(at + 3) as u64,
        recent_ttl: row.get::<_, i32>(at + 4) as u64,
        normalize: Normalize::parse(row.get::<_, &str>(at + 5).as_bytes())?,
    };
    Some(CatalogRow {
        def,
        id: row.get(at + 6),
    })
}

/// The catalog version and every set definition, read in one snapshot. Creates the catalog
/// tables on a fresh database (or one from before the version table existed).
pub fn load_catalog(db: &mut Db) -> Result<(i64, Vec<CatalogRow>), DbErr> {
    db.run(|c, _| {
        let mut tx = c.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(CATALOG_DDL)?;
        tx.commit()
    })?;
    // Versions start at 0: -1 is never current, so this reads everything.
    poll_catalog(db, -1)?.ok_or_else(|| DbErr::Failed("catalog version unreadable".into()))
}

/// The periodic check: one statement. `None` when the catalog version is still `known`;
/// otherwise the new version and every set definition, from one snapshot.
pub fn poll_catalog(db: &mut Db, known: i64) -> Result<Option<(i64, Vec<CatalogRow>)>, DbErr> {
    let sql = format!(
        "SELECT v.version, {cols}
           FROM member_catalog_version v
           LEFT JOIN member_catalog c ON v.version <> $1
          ORDER BY c.name",
        cols = catalog_columns("c")
    );
    let rows = db.run(|c, st| {
        let q = prepared(c, st, &sql)?;
        c.query(&q, &[&known])
    })?;
    let Some(first) = rows.first() else {
        return Err(DbErr::Failed("member_catalog_version has no row".into()));
    };
    let version: i64 = first.get(0);
    if version == known {
        return Ok(None);
    }
    let defs = rows
        .iter()
        .filter(|r| r.get::<_, Option<&str>>(1).is_some())
        .filter_map(|r| row_at(r, 1))
        .collect();
    Ok(Some((version, defs)))
}

/// One set's definition, or `None` when the catalog has no such set.
pub fn find_set(db: &mut Db, name: &str) -> Result<Option<CatalogRow>, DbErr> {
    let sql = format!(
        "SELECT {} FROM member_catalog a WHERE name = $1",
        catalog_columns("a")
    );
    let row = db.run(|c, st| {
        let q = prepared(c, st, &sql)?;
        c.query_opt(&q, &[&name])
    })?;
    Ok(row.as_ref().and_then(|r| row_at(r, 0)))
}

/// Creates (or confirms) a set: catalog row and table. `explicit` says which settings the
/// caller gave; an existing set whose given settings differ is refused. Returns the stored
/// row (the filter is built by the rebuild path).
pub fn create_set(db: &mut Db, wanted: &SetDef, explicit: &[bool; 5]) -> Result<CatalogRow, DbErr> {
    let row = db.run(|c, _| {
        let mut tx = c.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(CATALOG_DDL)?;
        let existing = tx.query_opt(
            &format!(
                "SELECT {} FROM member_catalog a WHERE name = $1",
                catalog_columns("a")
            ),
            &[&wanted.name],
        )?;
        let row = match existing.as_ref().and_then(|r| row_at(r, 0)) {
            Some(have) => {
                if wanted.conflicts_with(&have.def, explicit) {
                    return Ok(None);
                }
                have
            }
            None => {
                let id: i64 = tx.query_one(
                    "INSERT INTO member_catalog (name, error_rate, capacity, cache_ttl, recent_ttl, normalize)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     RETURNING (EXTRACT(EPOCH FROM created_at) * 1000000)::int8",
                    &[
                        &wanted.name,
                        &wanted.error_rate,
                        &(wanted.capacity as i64),
                        &(wanted.cache_ttl as i32),
                        &(wanted.recent_ttl as i32),
                        &wanted.normalize.name(),
                    ],
                )?.get(0);
                tx.execute(BUMP_VERSION, &[])?;
                CatalogRow { def: wanted.clone(), id }
            }
        };
        tx.batch_execute(&set_ddl(&row.def.name))?;
        tx.commit()?;
        Ok(Some(row))
    })?;
    row.ok_or(DbErr::Refused(error::SET_EXISTS_DIFFERENT))
}

/// Drops a set: its catalog row and, with `delete_data`, its table, in one transaction that
/// bumps the catalog version (every node forgets the set at its next check). False when the
/// catalog has no such set (nothing is changed then).
pub fn drop_set(db: &mut Db, name: &str, delete_data: bool) -> Result<bool, DbErr> {
    db.run_once(|c, _| {
        let mut tx = c.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(CATALOG_DDL)?;
        let n = tx.execute("DELETE FROM member_catalog WHERE name = $1", &[&name])?;
        if n == 0 {
            return Ok(false);
        }
        tx.execute(BUMP_VERSION, &[])?;
        if delete_data {
            tx.batch_execute(&format!("DROP TABLE IF EXISTS {}", table(name)))?;
        }
        tx.commit()?;
        Ok(true)
    })
}

/// Inserts memberships with one multi-row statement. For each item, true when the call made
/// it a member (a new row, or a deleted or expired one revived); false when it already was an
/// active member. PostgreSQL's primary key decides between concurrent callers: exactly one
/// gets true. An item given twice in one batch is inserted once; its later copies get false,
/// as if they had come just after.
pub fn add_many(
    db: &mut Db,
    set: &str,
    items: &[(&str, &str, Option<f64>)],
) -> Result<Vec<bool>, DbErr> {
    let sql = format!(
        "INSERT INTO {t} AS m (entity_id, scope, status, expires_at)
         SELECT e, s, 1, to_timestamp(x) FROM unnest($1::text[], $2::text[], $3::float8[]) AS u(e, s, x)
         ON CONFLICT (entity_id, scope) DO UPDATE
            SET status = 1, expires_at = EXCLUDED.expires_at, created_at = now(), updated_at = now()
            WHERE NOT (m.status = 1 AND (m.expires_at IS NULL OR m.expires_at > now()))
         RETURNING entity_id, scope",
        t = table(set)
    );
    let mut first: HashMap<(&str, &str), usize> = HashMap::with_capacity(items.len());
    let mut rows: Vec<(&str, &str, Option<f64>)> = Vec::with_capacity(items.len());
    for (i, (e, s, x)) in items.iter().enumerate() {
        if let Entry::Vacant(v) = first.entry((e, s)) {
            v.insert(i);
            rows.push((e, s, *x));
        }
    }
    // Every multi-row insert takes its rows' key locks in one global order, so two that
    // overlap (MADDs, batched ADDs on other workers) wait for each other instead of
    // deadlocking, which would fail one of them.
    rows.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let (mut es, mut ss, mut xs) = (Vec::new(), Vec::new(), Vec::new());
    for (e, s, x) in rows {
        es.push(e);
        ss.push(s);
        xs.push(x);
    }
    let inserted = db.run_once(|c, st| {
        let q = prepared(c, st, &sql)?;
        c.query(&q, &[&es, &ss, &xs])
    })?;
    let mut out = vec![false; items.len()];
    for row in &inserted {
        let key = (row.get::<_, &str>(0), row.get::<_, &str>(1));
        if let Some(&i) = first.get(&key) {
            out[i] = true;
        }
    }
    Ok(out)
}

/// Looks memberships up with one query. For each item, `Some(expires_at)` (unix seconds, if
/// any) when it is an active member, `None` when not. Repeated items are asked once.
pub fn lookup_many(
    db: &mut Db,
    set: &str,
    items: &[(&str, &str)],
) -> Result<Vec<Option<Option<f64>>>, DbErr> {
    let sql = format!(
        "SELECT m.entity_id, m.scope, EXTRACT(EPOCH FROM m.expires_at)::float8
           FROM {t} m
          WHERE (m.entity_id, m.scope) IN (SELECT * FROM unnest($1::text[], $2::text[]))
            AND m.{ACTIVE_M}",
        t = table(set)
    );
    let mut uniq: HashMap<(&str, &str), Option<Option<f64>>> = HashMap::with_capacity(items.len());
    let (mut es, mut ss) = (Vec::new(), Vec::new());
    for &(e, s) in items {
        if let Entry::Vacant(v) = uniq.entry((e, s)) {
            v.insert(None);
            es.push(e);
            ss.push(s);
        }
    }
    let rows = db.run(|c, st| {
        let q = prepared(c, st, &sql)?;
        c.query(&q, &[&es, &ss])
    })?;
    for row in &rows {
        let key = (row.get::<_, &str>(0), row.get::<_, &str>(1));
        if let Some(v) = uniq.get_mut(&key) {
            *v = Some(row.get::<_, Option<f64>>(2));
        }
    }
    Ok(items.iter().map(|k| uniq[k]).collect())
}

/// Deletes a membership row. True when an active member was removed.
pub fn del(db: &mut Db, set: &str, entity: &str, scope: &str) -> Result<bool, DbErr> {
    let sql = format!(
        "DELETE FROM {t} WHERE entity_id = $1 AND scope = $2 RETURNING ({ACTIVE})",
        t = table(set)
    );
    db.run_once(|c, s| {
        let st = prepared(c, s, &sql)?;
        Ok(c.query_opt(&st, &[&entity, &scope])?
            .map(|r| r.get::<_, bool>(0))
            .unwrap_or(false))
    })
}

/// A filter built from the whole table.
pub struct Built {
    pub bloom: Bloom,
    pub rows: u64,
    /// Sync watermark of the build (see `HORIZON`).
    pub watermark: i64,
}

fn tx_error(e: postgres::Error) -> DbErr {
    super::classify(&e)
}

/// Streams the set's active rows with `COPY … TO STDOUT` inside one repeatable-read snapshot
/// and builds a complete filter from them through the same canonicalization as the write path.
/// Sized for the larger of the set's capacity and the row count. `estimate` receives the
/// planner's row estimate for progress reports. Peak extra memory: 16 bytes per row (the
/// hashes) plus the new filter.
pub fn build_filter(
    c: &mut Client,
    def: &SetDef,
    progress: &AtomicU64,
    estimate: &AtomicU64,
) -> Result<Built, DbErr> {
    let t = table(&def.name);
    // A set whose CAPACITY alone exceeds the ceiling fails before any row is read.
    let max_bytes = crate::config::max_filter_bytes();
    crate::filter::check_size(def.capacity, def.error_rate, max_bytes)
        .map_err(|e| DbErr::Invalid(e.to_string()))?;
    // The horizon first, in its own statement; then the snapshot the COPY reads.
    let watermark: i64 = c.query_one(HORIZON, &[]).map_err(tx_error)?.get(0);
    let mut tx = c
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(tx_error)?;
    let est: f32 = tx
        .query_one(
            "SELECT coalesce((SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)), 0)",
            &[&t],
        )
        .map_err(tx_error)?
        .get(0);
    estimate.store(est.max(0.0) as u64, Ordering::Relaxed);
    let sql = format!("COPY (SELECT entity_id, scope FROM {t} WHERE {ACTIVE}) TO STDOUT");
    let mut hashes: Vec<u128> = Vec::with_capacity((est.max(0.0) as usize).min(1 << 26));
    {
        let reader = tx.copy_out(sql.as_str()).map_err(tx_error)?;
        let mut reader = std::io::BufReader::with_capacity(1 << 16, reader);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .map_err(copy_read_error)?;
            if n == 0 {
                break;
            }
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            if let Some(h) = hash_copy_row(def.normalize, &line) {
                hashes.push(h);
            }
            if hashes.len().is_multiple_of(4096) {
                progress.store(hashes.len() as u64, Ordering::Relaxed);
            }
        }
    }
    tx.commit().map_err(tx_error)?;
    progress.store(hashes.len() as u64, Ordering::Relaxed);
    let mut bloom = Bloom::try_new(
        def.capacity.max(hashes.len() as u64),
        def.error_rate,
        max_bytes,
    )
    .map_err(|e| DbErr::Invalid(e.to_string()))?;
    bloom.add_many(&hashes);
    Ok(Built {
        bloom,
        rows: hashes.len() as u64,
        watermark,
    })
}

/// Rows that became active members since `watermark` (inclusive), canonicalized, and the new
/// watermark: the sync loop's one query. Catches writes made outside the module.
pub fn changes_since(db: &mut Db, def: &SetDef, watermark: i64) -> Result<(Vec<u128>, i64), DbErr> {
    // The watermark is written into the text (it is an integer), not bound: the workers'
    // connections keep generic plans, and a generic plan for "updated_at >= $1" cannot know
    // that the range is the last second of a large table. Planned once per pass instead.
    let sql = format!(
        "SELECT entity_id, scope FROM {t}
          WHERE updated_at >= 'epoch'::timestamptz + {watermark}::int8 * interval '1 microsecond'
            AND {ACTIVE}",
        t = table(&def.name)
    );
    db.run(|c, _| {
        // Two autocommit statements, horizon first: the rows query takes a newer snapshot.
        let horizon: i64 = c.query_one(HORIZON, &[])?.get(0);
        let rows = c.query(sql.as_str(), &[])?;
        let hashes = rows
            .iter()
            .filter_map(|r| {
                let entity: &str = r.get(0);
                let scope: &str = r.get(1);
                canon::canonicalize(def.normalize, entity.as_bytes(), scope.as_bytes())
                    .ok()
                    .map(|c| c.hash)
            })
            .collect();
        Ok((hashes, horizon))
    })
}

/// A read error from a COPY stream carries the driver's error inside; classify that.
fn copy_read_error(e: std::io::Error) -> DbErr {
    match e.into_inner().map(|b| b.downcast::<postgres::Error>()) {
        Some(Ok(pg)) => super::classify(&pg),
        Some(Err(other)) => DbErr::Unavailable(other.to_string()),
        None => DbErr::Unavailable("COPY stream failed".into()),
    }
}

/// Canonical hash of one COPY text-format row `entity \t scope`; None for rows the write
/// path would have refused (they can only come from outside writes).
fn hash_copy_row(norm: Normalize, line: &[u8]) -> Option<u128> {
    let tab = line.iter().position(|&b| b == b'\t')?;
    let entity = unescape(&line[..tab]);
    let scope = unescape(&line[tab + 1..]);
    canon::canonicalize(norm, &entity, &scope)
        .ok()
        .map(|c| c.hash)
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
        assert_eq!(hash_copy_row(Normalize::Username, row), Some(want));
        // Rows written from outside are normalized the same way.
        assert_eq!(hash_copy_row(Normalize::Username, b"  ALICE\t"), Some(want));
        let scoped = canon::canonicalize(Normalize::None, b"a\tb", b"m1")
            .unwrap()
            .hash;
        assert_eq!(hash_copy_row(Normalize::None, b"a\\tb\tm1"), Some(scoped));
        assert_eq!(hash_copy_row(Normalize::None, b"no-tab"), None);
    }
}
