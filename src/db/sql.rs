//! Every SQL statement libmember sends: the catalog, the per-set tables, the point writes and
//! reads, and the COPY stream a filter is built from.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::{prepared, Db, DbErr};
use crate::canon::{self, Normalize};
use crate::error;
use crate::state::{SetChange, SetDef, Source, SourceSync};
use crate::token::Tokenize;

const ADVISORY_KEY: i64 = 0x6c69_626d_656d; // "libmem"

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

pub(super) const ACTIVE: &str = "status = 1 AND (expires_at IS NULL OR expires_at > now())";
/// `ACTIVE` for a table aliased `m` (prefix the first column with `m.`).
const ACTIVE_M: &str = "status = 1 AND (m.expires_at IS NULL OR m.expires_at > now())";

/// The change log every set table feeds (docs/sync.md): one row per row inserted, updated or
/// deleted (`alive` when it was left with `status = 1`), stamped with its writer's transaction
/// id and a sequence number that orders the changes of one key (writers of the same row
/// serialize on its lock, so the later writer draws the larger number). The trigger function is
/// `SECURITY DEFINER` (owned by the module's role, with the log's schema written into its body
/// and a fixed `search_path`), so outside writer roles need no grant on the log. The one-row
/// floor table records what pruning removed (see `prune`). Idempotent; run under the advisory
/// lock with the catalog's DDL.
const CHANGE_LOG_DDL: &str = r#"CREATE TABLE IF NOT EXISTS member_changes (
    set_name text NOT NULL,
    entity_id text NOT NULL,
    scope text NOT NULL,
    alive boolean NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    seq bigint GENERATED ALWAYS AS IDENTITY,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS member_changes_xid ON member_changes (xid);
CREATE TABLE IF NOT EXISTS member_changes_floor (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    floor xid8 NOT NULL,
    candidate xid8 NOT NULL,
    candidate_at timestamptz NOT NULL
);
INSERT INTO member_changes_floor (floor, candidate, candidate_at)
    SELECT '0', pg_snapshot_xmin(pg_current_snapshot()), now()
    ON CONFLICT DO NOTHING;
DO $do$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'member_log_change'
                   AND pronamespace = current_schema()::regnamespace
                   AND prosrc LIKE '%member_changes v1%') THEN
    EXECUTE format($f$CREATE OR REPLACE FUNCTION member_log_change() RETURNS trigger
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
      BEGIN -- member_changes v1: every row written or deleted, alive when status = 1
        IF TG_OP = 'DELETE' THEN
          INSERT INTO %1$I.member_changes (set_name, entity_id, scope, alive)
            SELECT TG_ARGV[0], entity_id, scope, false FROM old_rows;
        ELSE
          INSERT INTO %1$I.member_changes (set_name, entity_id, scope, alive)
            SELECT TG_ARGV[0], entity_id, scope, status = 1 FROM new_rows;
        END IF;
        RETURN NULL;
      END $b$$f$, current_schema());
  END IF;
END $do$"#;

/// Names of the three statement triggers that feed the change log from a set table.
pub(super) const LOG_TRIGGERS: [&str; 3] = ["member_log_ins", "member_log_upd", "member_log_del"];

/// The channel `member.sync-notify` listens on (docs/sync.md, "Change notification").
pub const NOTIFY_CHANNEL: &str = "member_changes";
/// The statement trigger that sends it, installed only where a node asked for notification.
const NOTIFY_TRIGGER: &str = "member_notify";

/// The function behind `member_notify`: one notification per statement written outside the
/// module (PostgreSQL folds the identical ones of a transaction into one, sent at commit).
/// The module's own writes (application_name `libmember`) already reach the filters of the
/// node that made them. Not SECURITY DEFINER: NOTIFY needs no privilege. Idempotent; run under
/// the advisory lock.
const NOTIFY_FN_DDL: &str = r#"DO $do$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'member_notify_change'
                   AND pronamespace = current_schema()::regnamespace
                   AND prosrc LIKE '%member_notify v1%') THEN
    CREATE OR REPLACE FUNCTION member_notify_change() RETURNS trigger LANGUAGE plpgsql AS $b$
      BEGIN -- member_notify v1: wakes the listening nodes, for writes made outside the module
        IF pg_catalog.current_setting('application_name') <> 'libmember' THEN
          PERFORM pg_catalog.pg_notify('member_changes', '');
        END IF;
        RETURN NULL;
      END $b$;
  END IF;
END $do$"#;

/// Statements (for a DO block) that install `member_notify` on `t` where missing.
fn notify_trigger_stmt(t: &str) -> String {
    format!(
        "IF to_regproc('member_notify_change') IS NOT NULL AND NOT EXISTS (SELECT FROM pg_trigger
               WHERE tgrelid = '{t}'::regclass AND tgname = '{NOTIFY_TRIGGER}') THEN
           CREATE TRIGGER {NOTIFY_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {t}
             FOR EACH STATEMENT EXECUTE FUNCTION member_notify_change();
         END IF;"
    )
}

/// Installs what the listener needs (docs/sync.md): the notify function, and `member_notify`
/// on every set table of the catalog that lacks it. Returns the tables where that failed, with
/// the database's reason (the table's owner is another role, a lock not granted in time);
/// their outside writes still arrive within the sync interval.
pub fn install_notify(c: &mut postgres::Client) -> Result<Vec<(String, String)>, postgres::Error> {
    let mut tx = c.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
    tx.batch_execute(NOTIFY_FN_DDL)?;
    tx.commit()?;
    let missing = c.query(
        "SELECT c.name FROM member_catalog c
          WHERE to_regclass(quote_ident('member_' || c.name)) IS NOT NULL
            AND NOT EXISTS (SELECT FROM pg_trigger g
                             WHERE g.tgrelid = to_regclass(quote_ident('member_' || c.name))
                               AND g.tgname = $1)",
        &[&NOTIFY_TRIGGER],
    );
    let missing = match missing {
        Ok(rows) => rows,
        // No catalog yet: the sets created later get the trigger at their CREATE.
        Err(e) if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut failed = Vec::new();
    for row in missing {
        let name: String = row.get(0);
        let t = table(&name);
        let ddl = format!("DO $do$ BEGIN {} END $do$", notify_trigger_stmt(&t));
        if let Err(e) = c.batch_execute(&ddl) {
            let why = e
                .as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_string());
            if c.is_closed() {
                return Err(e);
            }
            // Another node's listener installed it at the same moment.
            if e.code() != Some(&postgres::error::SqlState::DUPLICATE_OBJECT) {
                failed.push((t, why));
            }
        }
    }
    Ok(failed)
}

/// Installs the change-log triggers (INSERT, UPDATE, DELETE) on a set's table where missing, and enables them where
/// disabled (no lock, no privilege needed when they are there and enabled). When the module's
/// role may not, fails with SQLSTATE 42501 and the `blind_reason` text, which names what to grant.
pub(super) fn log_triggers_ddl(set: &str) -> String {
    guarded_ddl(set, "")
}

/// `log_triggers_ddl` after the statements `before` (the set table's own DDL), all refused
/// with the same text when the module's role lacks the privilege.
fn guarded_ddl(set: &str, before: &str) -> String {
    let t = table(set);
    let ensure = |name: &str, event: &str| {
        let rows = if event == "DELETE" {
            "OLD TABLE AS old_rows"
        } else {
            "NEW TABLE AS new_rows"
        };
        format!(
            "IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{t}'::regclass AND tgname = '{name}') THEN
               CREATE TRIGGER {name} AFTER {event} ON {t} REFERENCING {rows}
                 FOR EACH STATEMENT EXECUTE FUNCTION member_log_change('{set}');
             ELSIF EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{t}'::regclass AND tgname = '{name}'
                             AND tgenabled = 'D') THEN
               ALTER TABLE {t} ENABLE TRIGGER {name};
             END IF;"
        )
    };
    // A node with `member.sync-notify yes` also wants the notification trigger.
    let notify = if crate::config::sync_notify() {
        notify_trigger_stmt(&t)
    } else {
        String::new()
    };
    format!(
        "DO $do$ BEGIN
           {before}
           {ins}
           {upd}
           {del}
           {notify}
         EXCEPTION WHEN insufficient_privilege THEN
           RAISE EXCEPTION '{msg}', SQLERRM USING ERRCODE = 'insufficient_privilege';
         END $do$",
        ins = ensure(LOG_TRIGGERS[0], "INSERT"),
        upd = ensure(LOG_TRIGGERS[1], "UPDATE"),
        del = ensure(LOG_TRIGGERS[2], "DELETE"),
        msg = blind_reason(set, "%").replace('\'', "''"),
    )
}

/// Why a set is blind to outside writes, naming what to grant; `why` is the database's word.
pub fn blind_reason(set: &str, why: &str) -> String {
    format!(
        "cannot install the change-log triggers on {t} ({why}): the module's database role \
         must own {t} (or hold TRIGGER on it); until then rows written outside the module \
         cannot be seen and the set's filter never answers absent",
        t = table(set)
    )
}

fn set_ddl(set: &str) -> String {
    let t = table(set);
    let slot = super::keyslot::SLOT_COLUMN;
    let slot_index = super::keyslot::slot_index_ddl(set);
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
         (EXTRACT(EPOCH FROM {a}.created_at) * 1000000)::int8, {a}.tokenize, {a}.token_key_fp,
         {a}.source_schema, {a}.source_table, {a}.source_column, {a}.source_scope_column,
         {a}.source_updated_column, {a}.source_sync"
    )
}

/// A catalog row from the `catalog_columns` starting at column `at`; `None` for a row this
/// version cannot read (an unknown normalization or tokenization is never served as plain).
fn row_at(row: &postgres::Row, at: usize) -> Option<CatalogRow> {
    let def = SetDef {
        name: row.get(at),
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
        id: row.get(at + 6),
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

/// The catalog version and every set definition, read in one snapshot. Creates the catalog
/// tables on a fresh database (or one from before the version table existed).
pub fn load_catalog(db: &mut Db) -> Result<(i64, Vec<CatalogRow>), DbErr> {
    db.run(|c, _| {
        let mut tx = c.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(CATALOG_DDL)?;
        tx.batch_execute(CHANGE_LOG_DDL)?;
        tx.batch_execute(NOTIFY_FN_DDL)?;
        super::keyslot::install_function(&mut tx)?;
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
pub fn create_set(db: &mut Db, wanted: &SetDef, explicit: &[bool; 6]) -> Result<CatalogRow, DbErr> {
    let row = db.run(|c, _| {
        let mut tx = c.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
        tx.batch_execute(CATALOG_DDL)?;
        tx.batch_execute(CHANGE_LOG_DDL)?;
        tx.batch_execute(NOTIFY_FN_DDL)?;
        super::keyslot::install_function(&mut tx)?;
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
            None => {
                // An attached set's source is checked first: a refusal rolls back, so nothing
                // is created.
                if let Err(e) = super::source_check::validate(&mut tx, wanted) {
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
                CatalogRow { def: wanted.clone(), id }
            }
        };
        match &row.def.source {
            None => tx.batch_execute(&set_ddl(&row.def.name))?,
            Some(src) if src.sync == SourceSync::Log => {
                tx.batch_execute(super::source::LOG_FN_DDL)?;
                if let Err(e) = super::source::install_log_triggers(&mut tx, &row.def) {
                    return Ok(Err(e));
                }
            }
            Some(_) => {}
        }
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
    db.run_once(|c, _| {
        let mut tx = c.transaction()?;
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
            Some(row) => super::source::drop_log_triggers(&mut tx, &row.def)?,
            None => None,
        };
        tx.execute(BUMP_VERSION, &[])?;
        if delete_data {
            tx.batch_execute(&format!("DROP TABLE IF EXISTS {}", table(name)))?;
        }
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
    let done = db.run_once(|c, _| {
        let mut tx = c.transaction()?;
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
            row: CatalogRow { def, id: before.id },
            before: before.def,
            version,
        })))
    })?;
    done.map_err(DbErr::Invalid)
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
    if let Some(src) = super::source::of(set) {
        return super::source::confirm_many(db, &src, items);
    }
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
    if let Some(src) = super::source::of(set) {
        return super::source::lookup_many(db, &src, items);
    }
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
    // An attached set never deletes from its source (docs/attach.md): the call only drops the
    // cached answer, on the main thread, and removed nothing.
    if super::source::of(set).is_some() {
        return Ok(false);
    }
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

/// The xmin of the statement's snapshot, as an integer: every transaction with a smaller id
/// had ended when the snapshot was taken.
pub(super) const XMIN: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8";

/// What one sync pass read (docs/sync.md), all in one snapshot.
#[derive(Debug, Default)]
pub struct Changes {
    /// The snapshot's xmin: the filters read from their watermark now cover everything below.
    pub horizon: i64,
    /// Rows with a transaction id below this may have been pruned from the log.
    pub floor: i64,
    /// Set tables that do not feed the change log (triggers missing or disabled).
    pub blind: Vec<String>,
    /// Canonical hashes of the rows logged since the pass's start, per set.
    pub rows: HashMap<String, Vec<u128>>,
    /// Cluster mode: the hash slot of each of those rows, in the same order.
    pub slots: HashMap<String, Vec<u16>>,
    /// Statements this pass sent.
    pub statements: u64,
    /// Attached sets synced by UPDATED-COLUMN: the time each one's poll covers up to
    /// (docs/attach.md), and why a poll failed.
    pub time_horizons: HashMap<String, i64>,
    pub poll_errors: HashMap<String, String>,
}

/// The sync loop's one statement for every set: the horizon, the prune floor, the set tables
/// that are blind, and every key whose latest change logged by transactions with id ≥ `from`
/// left it active, in one snapshot (a key added and deleted since is not applied again). Rows of sets not in `sets` (unknown here) are skipped; `sets` gives each known
/// set's normalization. If `prune_after_s` is given, also prunes the log (`prune`).
pub fn changes_since(
    db: &mut Db,
    from: i64,
    sets: &HashMap<String, Normalize>,
    prune_after_s: Option<u64>,
) -> Result<Changes, DbErr> {
    // `from` is written into the text (it is an integer), not bound: the workers' connections
    // keep generic plans, and a generic plan for "xid >= $1" cannot know that the range is the
    // last second of a large log. Planned once per pass instead.
    let sql = format!(
        r"SELECT h.horizon, h.floor, h.blind, c.set_name, c.entity_id, c.scope
            FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8 AS horizon,
                         (SELECT floor::text::int8 FROM member_changes_floor) AS floor,
                         (SELECT coalesce(array_agg(b.name), '{{}}') FROM (
                           SELECT t.relname::text AS name FROM pg_class t
                           WHERE t.relkind = 'r' AND t.relname LIKE 'member\_%'
                             AND t.relname NOT IN ('member_catalog', 'member_changes',
                                                   'member_changes_floor')
                             AND t.relnamespace = current_schema()::regnamespace
                             AND (SELECT count(*) FROM pg_trigger g
                                   WHERE g.tgrelid = t.oid AND g.tgenabled <> 'D'
                                     AND g.tgname IN ('{ins}', '{upd}', '{del}')) < 3
                           UNION ALL
                           -- Attached sets synced by the log (docs/attach.md), by set name.
                           SELECT 'member_' || a.name FROM member_catalog a
                            WHERE a.source_sync = 'log'
                              AND (SELECT count(*) FROM pg_trigger g
                                    WHERE g.tgrelid = to_regclass(format('%I.%I', a.source_schema,
                                                                         a.source_table))
                                      AND g.tgenabled <> 'D'
                                      AND g.tgname IN ('member_' || a.name || '_ins',
                                                       'member_' || a.name || '_upd',
                                                       'member_' || a.name || '_del')) < 3
                         ) b) AS blind) h
            LEFT JOIN (SELECT DISTINCT ON (set_name, entity_id, scope) set_name, entity_id,
                              scope, alive
                         FROM member_changes WHERE xid >= '{from}'::xid8
                        ORDER BY set_name, entity_id, scope, seq DESC) c ON c.alive",
        ins = LOG_TRIGGERS[0],
        upd = LOG_TRIGGERS[1],
        del = LOG_TRIGGERS[2],
        from = from.max(0)
    );
    let in_cluster = crate::cluster::enabled();
    let mut out = db.run(|c, _| {
        let rows = by_index(c, |tx| tx.query(sql.as_str(), &[]))?;
        let mut out = Changes {
            statements: 1,
            ..Changes::default()
        };
        for (i, r) in rows.iter().enumerate() {
            if i == 0 {
                out.horizon = r.get(0);
                out.floor = r.get::<_, Option<i64>>(1).unwrap_or(0);
                out.blind = r.get(2);
            }
            let Some(set) = r.get::<_, Option<&str>>(3) else {
                continue;
            };
            let Some(&norm) = sets.get(set) else {
                continue;
            };
            let entity: &str = r.get(4);
            let scope: &str = r.get(5);
            if let Ok(k) = canon::canonicalize(norm, entity.as_bytes(), scope.as_bytes()) {
                out.rows.entry(set.to_string()).or_default().push(k.hash);
                if in_cluster {
                    let slot = crate::cluster::slot::keyslot(k.entity.as_bytes());
                    out.slots.entry(set.to_string()).or_default().push(slot);
                }
            }
        }
        Ok(out)
    })?;
    if let Some(after) = prune_after_s {
        // A failed prune costs nothing but disk; the pass's reading stands.
        if prune(db, after).is_ok() {
            out.statements += 1;
        }
    }
    Ok(out)
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
    db.run_once(|c, _| {
        Ok(by_index(c, |tx| tx.query_opt(sql.as_str(), &[]))?
            .map(|r| r.get::<_, i64>(0) as u64)
            .unwrap_or(0))
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

/// Runs `f` in a transaction of its own under [`INDEX_ONLY`] (the sync pass and the prune).
fn by_index<T>(
    c: &mut postgres::Client,
    f: impl FnOnce(&mut postgres::Transaction) -> Result<T, postgres::Error>,
) -> Result<T, postgres::Error> {
    let mut tx = c.transaction()?;
    tx.batch_execute(INDEX_ONLY)?;
    let out = f(&mut tx)?;
    tx.commit()?;
    Ok(out)
}
