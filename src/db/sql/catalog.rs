//! The catalog (`member_catalog`, its version row) and the set tables it names: load, poll,
//! CREATE, DROP and ALTER, each one transaction under the catalog's advisory lock.

use super::change_log::{guarded_ddl, CHANGE_LOG_DDL, NOTIFY_FN_DDL};
use super::{table, ADVISORY_KEY, BUMP_VERSION};
use postgres::types::Type;

use crate::db::{Db, DbErr, Stmts};
use crate::model::canon::Normalize;
use crate::model::error;
use crate::model::set_def::{SetChange, SetDef, Source, SourceSync};
use crate::model::token::Tokenize;

const CATALOG_DDL: &str = "CREATE TABLE IF NOT EXISTS member_catalog (
    name text PRIMARY KEY,
    error_rate double precision NOT NULL,
    capacity bigint NOT NULL,
    cache_ttl integer NOT NULL,
    recent_ttl integer NOT NULL,
    normalize text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    tokenize text NOT NULL DEFAULT 'none',
    token_key_fp text
);
-- Catalogs made before tokenization get its two columns (a catalog lookup, no lock, once
-- they are there; adding them rewrites nothing).
DO $cat$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'member_catalog'::regclass
                   AND attname = 'token_key_fp' AND NOT attisdropped) THEN
    ALTER TABLE member_catalog ADD COLUMN IF NOT EXISTS tokenize text NOT NULL DEFAULT 'none',
                               ADD COLUMN IF NOT EXISTS token_key_fp text;
  END IF;
END $cat$;
-- Catalogs made before attached sets (docs/attach.md) get their columns, the same way.
DO $cat$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'member_catalog'::regclass
                   AND attname = 'source_sync' AND NOT attisdropped) THEN
    ALTER TABLE member_catalog ADD COLUMN IF NOT EXISTS source_schema text,
                               ADD COLUMN IF NOT EXISTS source_table text,
                               ADD COLUMN IF NOT EXISTS source_column text,
                               ADD COLUMN IF NOT EXISTS source_scope_column text,
                               ADD COLUMN IF NOT EXISTS source_updated_column text,
                               ADD COLUMN IF NOT EXISTS source_sync text;
  END IF;
END $cat$;
-- Catalogs made before the form counter get it (docs/security.md, offline rotation):
-- a set rotated offline before keeps the identity it had, which moved one
-- microsecond per key of its chain.
DO $cat$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'member_catalog'::regclass
                   AND attname = 'form_epoch' AND NOT attisdropped) THEN
    ALTER TABLE member_catalog ADD COLUMN IF NOT EXISTS form_epoch bigint NOT NULL DEFAULT 0;
    UPDATE member_catalog
       SET form_epoch = array_length(string_to_array(token_key_fp, '>'), 1) - 1
     WHERE token_key_fp LIKE '%>%';
  END IF;
END $cat$;
-- Catalogs made before online rotations get their columns (docs/security.md).
DO $rot$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'member_catalog'::regclass
                   AND attname = 'rotate_to' AND NOT attisdropped) THEN
    ALTER TABLE member_catalog ADD COLUMN IF NOT EXISTS rotate_to text,
                               ADD COLUMN IF NOT EXISTS rotate_phase text,
                               ADD COLUMN IF NOT EXISTS rotate_cursor text,
                               ADD COLUMN IF NOT EXISTS rotate_swept bigint,
                               ADD COLUMN IF NOT EXISTS rotate_end_xid bigint,
                               ADD COLUMN IF NOT EXISTS rotate_copied bigint,
                               ADD COLUMN IF NOT EXISTS rotate_started timestamptz;
  END IF;
END $rot$;
-- And those added since (the newest tested: a catalog that has it has the others).
DO $later$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'member_catalog'::regclass
                   AND attname = 'rotate_covered' AND NOT attisdropped) THEN
    ALTER TABLE member_catalog ADD COLUMN IF NOT EXISTS rotate_left bigint,
                               ADD COLUMN IF NOT EXISTS rotate_covered boolean;
  END IF;
END $later$;
-- The rewrite's cursor and end, in heap pages (docs/rotation-in-place.md).
DO $pages$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'member_catalog'::regclass
                   AND attname = 'rotate_pages' AND NOT attisdropped) THEN
    ALTER TABLE member_catalog ADD COLUMN IF NOT EXISTS rotate_page bigint,
                               ADD COLUMN IF NOT EXISTS rotate_pages bigint;
  END IF;
END $pages$;
CREATE TABLE IF NOT EXISTS member_catalog_version (
    id smallint PRIMARY KEY CHECK (id = 1),
    version bigint NOT NULL
);
INSERT INTO member_catalog_version VALUES (1, 0) ON CONFLICT DO NOTHING";

fn set_ddl(set: &str) -> String {
    let t = table(set);
    let slot = crate::db::keyslot::SLOT_COLUMN;
    let slot_index = crate::db::keyslot::slot_index_ddl(set);
    guarded_ddl(
        set,
        &format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                entity_id text NOT NULL,
                scope text NOT NULL DEFAULT '',
                status smallint NOT NULL DEFAULT 1,
                created_at timestamptz NOT NULL DEFAULT now(),
                updated_at timestamptz NOT NULL DEFAULT now(),
                expires_at timestamptz,
                {slot},
                PRIMARY KEY (entity_id, scope)
            );
            CREATE INDEX IF NOT EXISTS {t}_updated_at ON {t} (updated_at);
            {slot_index}"
        ),
    )
}

/// A set's catalog row: its definition and the identity of this row (its creation time in
/// microseconds), which tells a set dropped and created again under the same name from the
/// one a node knew. The identity moves one microsecond forward each time `form_epoch` is
/// raised, which a change of the stored rows' form that bypassed the change log does (an
/// offline rotation): filters, marks and exact-match keys made before are then another
/// set's, distrusted and rebuilt as after a DROP and CREATE (docs/security.md, "Rotating a
/// set's key offline").
#[derive(Clone, Debug)]
pub struct CatalogRow {
    pub def: SetDef,
    pub id: i64,
    /// The online key rotation the set is in, if any.
    pub rotation: Option<super::rotation::RotationRow>,
}

/// The catalog columns `row_at` reads, for a table aliased `a`.
fn catalog_columns(a: &str) -> String {
    format!(
        "{a}.name, {a}.error_rate, {a}.capacity, {a}.cache_ttl, {a}.recent_ttl, {a}.normalize,
         (EXTRACT(EPOCH FROM {a}.created_at) * 1000000)::int8, {a}.tokenize, {a}.token_key_fp,
         {a}.source_schema, {a}.source_table, {a}.source_column, {a}.source_scope_column,
         {a}.source_updated_column, {a}.source_sync, {a}.form_epoch, {rot}",
        rot = super::rotation::rotation_columns(a)
    )
}

/// A catalog row from the `catalog_columns` starting at column `at`; `None` where an outer
/// join matched no set (the name is NULL) and for a row this version cannot read (an unknown
/// normalization or tokenization is never served as plain).
fn row_at(row: &postgres::Row, at: usize) -> Option<CatalogRow> {
    let def = SetDef {
        name: row.get::<_, Option<String>>(at)?,
        error_rate: row.get(at + 1),
        capacity: row.get::<_, i64>(at + 2) as u64,
        cache_ttl: row.get::<_, i32>(at + 3) as u64,
        recent_ttl: row.get::<_, i32>(at + 4) as u64,
        normalize: Normalize::parse(row.get::<_, &str>(at + 5).as_bytes())?,
        tokenize: Tokenize::from_stored(row.get(at + 7), row.get(at + 8))?,
        source: source_at(row, at + 9)?,
    };
    Some(CatalogRow {
        def,
        id: row.get::<_, i64>(at + 6) + row.get::<_, i64>(at + 15),
        rotation: super::rotation::rotation_at(row, at + 16),
    })
}

/// An attached set's source from its catalog columns starting at `at`: `Some(None)` for an
/// own set, `None` for a row this version cannot read (an unknown sync mode).
fn source_at(row: &postgres::Row, at: usize) -> Option<Option<Source>> {
    let (Some(schema), Some(table), Some(column)) = (
        row.get::<_, Option<String>>(at),
        row.get::<_, Option<String>>(at + 1),
        row.get::<_, Option<String>>(at + 2),
    ) else {
        return Some(None);
    };
    let sync = match row.get::<_, Option<&str>>(at + 5) {
        Some("log") => SourceSync::Log,
        Some("updated-column") => SourceSync::Updated(row.get::<_, Option<String>>(at + 4)?),
        _ => return None,
    };
    Some(Some(Source {
        schema,
        table,
        column,
        scope_column: row.get(at + 3),
        sync,
    }))
}

/// A transaction holding the catalog's advisory lock, in which the module's tables and
/// functions (catalog, change log, notify functions, slot function) exist: idempotent DDL.
fn schema_transaction<'c>(
    c: &'c mut postgres::Client,
    st: &Stmts,
) -> Result<postgres::Transaction<'c>, postgres::Error> {
    let mut tx = st.begin(c)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
    tx.batch_execute(CATALOG_DDL)?;
    tx.batch_execute(super::nodes::NODES_DDL)?;
    tx.batch_execute(CHANGE_LOG_DDL)?;
    tx.batch_execute(&NOTIFY_FN_DDL)?;
    crate::db::keyslot::install_function(&mut tx)?;
    crate::db::token_sql::install_function(&mut tx)?;
    Ok(tx)
}

/// The catalog version and every set definition, read in one snapshot. Creates the catalog
/// tables on a fresh database (or one from before the version table existed).
pub fn load_catalog(db: &mut Db) -> Result<(i64, Vec<CatalogRow>), DbErr> {
    db.run_own(|c, st| {
        let tx = schema_transaction(c, st)?;
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
    let rows = db.run(|c, st| st.query(c, &sql, &[(&known, Type::INT8)]))?;
    let Some(first) = rows.first() else {
        return Err(DbErr::Failed("member_catalog_version has no row".into()));
    };
    let version: i64 = first.get(0);
    if version == known {
        return Ok(None);
    }
    let defs = rows.iter().filter_map(|r| row_at(r, 1)).collect();
    Ok(Some((version, defs)))
}

/// One set's definition (`None` when the catalog has no such set), with the catalog version
/// it was read at: both come from one statement, so from one snapshot, and a caller can tell
/// an answer older than a catalog read it has already applied.
pub fn find_set(db: &mut Db, name: &str) -> Result<(i64, Option<CatalogRow>), DbErr> {
    let sql = format!(
        "SELECT v.version, {}
           FROM member_catalog_version v
           LEFT JOIN member_catalog a ON a.name = $1",
        catalog_columns("a")
    );
    let row = db.run(|c, st| st.query_opt(c, &sql, &[(&name, Type::TEXT)]))?;
    let Some(row) = row else {
        return Err(DbErr::Failed("member_catalog_version has no row".into()));
    };
    Ok((row.get(0), row_at(&row, 1)))
}

/// Creates (or confirms) a set: catalog row and table. `explicit` says which settings the
/// caller gave; an existing set whose given settings differ is refused. `check` sees a set
/// about to be inserted and may refuse it with a reason (`ERR <reason>`; nothing is written
/// then). Returns the stored row (the filter is built by the rebuild path).
pub fn create_set(
    db: &mut Db,
    wanted: &SetDef,
    explicit: &[bool; 6],
    check: &dyn Fn(&SetDef) -> Result<(), String>,
) -> Result<CatalogRow, DbErr> {
    let row = db.run_own(|c, st| {
        let mut tx = schema_transaction(c, st)?;
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
                    return Ok(Err(DbErr::Refused(error::SET_EXISTS_DIFFERENT)));
                }
                have
            }
            None if super::reserved_set_name(&wanted.name) => {
                return Ok(Err(DbErr::Refused(error::RESERVED_SET_NAME)));
            }
            None => {
                if let Err(why) = check(wanted) {
                    return Ok(Err(DbErr::Invalid(why)));
                }
                // An attached set's source is checked first: a refusal rolls back, so nothing
                // is created.
                if let Err(e) = crate::db::source_check::validate(&mut tx, wanted) {
                    return Ok(Err(e));
                }
                let src = wanted.source.as_ref();
                let updated = src.and_then(|s| match &s.sync {
                    SourceSync::Updated(u) => Some(u.as_str()),
                    SourceSync::Log => None,
                });
                let id: i64 = tx.query_one(
                    "INSERT INTO member_catalog (name, error_rate, capacity, cache_ttl, recent_ttl, normalize,
                                                 tokenize, token_key_fp, source_schema, source_table,
                                                 source_column, source_scope_column,
                                                 source_updated_column, source_sync)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                     RETURNING (EXTRACT(EPOCH FROM created_at) * 1000000)::int8",
                    &[
                        &wanted.name,
                        &wanted.error_rate,
                        &(wanted.capacity as i64),
                        &(wanted.cache_ttl as i32),
                        &(wanted.recent_ttl as i32),
                        &wanted.normalize.name(),
                        &wanted.tokenize.name(),
                        &wanted.tokenize.fingerprint(),
                        &src.map(|s| s.schema.as_str()),
                        &src.map(|s| s.table.as_str()),
                        &src.map(|s| s.column.as_str()),
                        &src.and_then(|s| s.scope_column.as_deref()),
                        &updated,
                        &src.map(|s| s.sync.name()),
                    ],
                )?.get(0);
                tx.execute(BUMP_VERSION, &[])?;
                CatalogRow { def: wanted.clone(), id, rotation: None }
            }
        };
        match &row.def.source {
            None => {
                tx.batch_execute(&set_ddl(&row.def.name))?;
                if row.def.tokenize.is_on() {
                    crate::db::token_form::make(&mut tx, Some(&row.def.name))?;
                }
            }
            Some(src) if src.sync == SourceSync::Log => {
                tx.batch_execute(crate::db::source::LOG_FN_DDL)?;
                if let Err(e) = crate::db::source::install_log_triggers(&mut tx, &row.def) {
                    return Ok(Err(e));
                }
            }
            Some(_) => {}
        }
        // Every row read goes before the commit: a row holds its statement, and a statement
        // closed after it would stay behind on a pooler's server connection.
        drop(existing);
        tx.commit()?;
        Ok(Ok(row))
    })?;
    row
}

/// Drops a set: its catalog row and, with `delete_data`, its table, in one transaction that
/// bumps the catalog version (every node forgets the set at its next check). False when the
/// catalog has no such set (nothing is changed then); with it, for an attached set whose
/// triggers the module may not remove, what to tell the operator.
pub fn drop_set(
    db: &mut Db,
    name: &str,
    delete_data: bool,
) -> Result<(bool, Option<String>), DbErr> {
    db.run_once_own(|c, st| {
        let mut tx = st.begin(c)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(CATALOG_DDL)?;
        let sql = format!(
            "DELETE FROM member_catalog a WHERE name = $1 RETURNING {}",
            catalog_columns("a")
        );
        let Some(gone) = tx.query_opt(&sql, &[&name])? else {
            return Ok((false, None));
        };
        // An attached set's triggers leave its source table with it; its table is never
        // dropped (DELETE-DATA concerns `member_<set>` only, which it does not have).
        let note = match row_at(&gone, 0) {
            Some(row) => crate::db::source::drop_log_triggers(&mut tx, &row.def)?,
            None => None,
        };
        tx.execute(BUMP_VERSION, &[])?;
        if delete_data {
            tx.batch_execute(&format!("DROP TABLE IF EXISTS {}", table(name)))?;
        }
        // The row (and with it its statement) goes before the commit (see create_set).
        drop(gone);
        tx.commit()?;
        Ok((true, note))
    })
}

/// What MEMBER.ALTER did to a set's catalog row: the row as stored now, and the definition
/// it replaced.
#[derive(Clone, Debug)]
pub struct Altered {
    pub row: CatalogRow,
    pub before: SetDef,
    /// The catalog version this change wrote (None: it changed nothing): of two ALTERs of one
    /// set whose answers reach the main thread out of order, the later version wins.
    pub version: Option<i64>,
}

/// Changes a set's settings in its catalog row, in one transaction that bumps the catalog
/// version (every node learns the new definition at its next check). Serialized with CREATE,
/// DROP and other ALTERs by the catalog's advisory lock, so each applies its own settings to
/// the row as the one before it left it. `check` sees a new definition that needs another
/// filter (ERROR or CAPACITY changed) first and may refuse it with a reason (`ERR <reason>`;
/// nothing is changed then). `None` when the catalog
/// has no such set; a change that changes nothing writes nothing.
pub fn alter_set(
    db: &mut Db,
    name: &str,
    change: &SetChange,
    check: &dyn Fn(&SetDef) -> Result<(), String>,
) -> Result<Option<Altered>, DbErr> {
    let done = db.run_once_own(|c, st| {
        let mut tx = st.begin(c)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(CATALOG_DDL)?;
        let sql = format!(
            "SELECT {} FROM member_catalog a WHERE name = $1",
            catalog_columns("a")
        );
        let Some(before) = tx.query_opt(&sql, &[&name])?.and_then(|r| row_at(&r, 0)) else {
            return Ok(Ok(None));
        };
        let def = change.applied_to(&before.def);
        if def.filter_differs(&before.def) {
            if let Err(why) = check(&def) {
                return Ok(Err(why));
            }
        }
        let mut version = None;
        if def != before.def {
            tx.execute(
                "UPDATE member_catalog SET error_rate = $2, capacity = $3, cache_ttl = $4,
                                           recent_ttl = $5
                  WHERE name = $1",
                &[
                    &name,
                    &def.error_rate,
                    &(def.capacity as i64),
                    &(def.cache_ttl as i32),
                    &(def.recent_ttl as i32),
                ],
            )?;
            version = Some(tx.query_one(BUMP_VERSION, &[])?.get::<_, i64>(0));
            tx.commit()?;
        }
        Ok(Ok(Some(Altered {
            row: CatalogRow {
                def,
                id: before.id,
                rotation: before.rotation.clone(),
            },
            before: before.def,
            version,
        })))
    })?;
    done.map_err(DbErr::Invalid)
}
