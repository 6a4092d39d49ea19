//! The change log every set table feeds (docs/sync.md): its table and the triggers that fill
//! it, and the notification trigger `member.sync-notify` listens for. What reads it is
//! `changes.rs`.

use std::sync::LazyLock;

use super::{table, ADVISORY_KEY};

/// The change log every set table feeds (docs/sync.md): one row per row inserted, updated or
/// deleted (`alive` when it was left with `status = 1`), stamped with its writer's transaction
/// id and a sequence number that orders the changes of one key (writers of the same row
/// serialize on its lock, so the later writer draws the larger number). The trigger function is
/// `SECURITY DEFINER` (owned by the module's role), so outside writer roles need no grant on
/// the log. It runs under the writer's `search_path` and names nothing through it: the log's
/// schema is written into its body, its two operators are `OPERATOR(pg_catalog.=)`, the
/// transition tables are found before any schema, and the log's defaults are bound at its
/// creation. (v1 had `SET search_path` instead: PostgreSQL sets and restores it on every call,
/// which cost an outside single-row INSERT about a tenth of its rate; docs/sync.md "Write
/// path".) v3 also copies the row's cluster `slot` (the set table's generated column) when
/// the trigger's second argument says the table has one, so in cluster mode a sync pass reads
/// only the rows of the slots its node covers; rows logged without one (a table from before
/// the column, whose triggers get the argument at the rebuild that adds it; an attached
/// table's trigger) are read by every node. v3 replaces v2 in place, so existing triggers run
/// it at once; PL/pgSQL plans each INSERT when it first runs, so the one naming `slot` is
/// never planned for a table without the column. The one-row
/// floor table records what pruning removed (see `prune`). Idempotent; run under the advisory
/// lock with the catalog's DDL.
pub(super) const CHANGE_LOG_DDL: &str = r#"CREATE TABLE IF NOT EXISTS member_changes (
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
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'member_changes'::regclass
                   AND attname = 'slot' AND NOT attisdropped) THEN
    ALTER TABLE member_changes ADD COLUMN slot smallint;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'member_log_change'
                   AND pronamespace = current_schema()::regnamespace
                   AND prosrc LIKE '%member_changes v3%') THEN
    EXECUTE format($f$CREATE OR REPLACE FUNCTION member_log_change() RETURNS trigger
      LANGUAGE plpgsql SECURITY DEFINER AS $b$
      BEGIN -- member_changes v3: every row written or deleted, alive when status = 1, and its
            -- slot where the trigger says the table has one (a build that looks for
            -- member_changes v2 finds it here and leaves this body)
        IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
          IF TG_NARGS OPERATOR(pg_catalog.>) 1 THEN
            INSERT INTO %1$I.member_changes (set_name, entity_id, scope, alive, slot)
              SELECT TG_ARGV[0], entity_id, scope, false, slot FROM old_rows;
          ELSE
            INSERT INTO %1$I.member_changes (set_name, entity_id, scope, alive)
              SELECT TG_ARGV[0], entity_id, scope, false FROM old_rows;
          END IF;
        ELSIF TG_NARGS OPERATOR(pg_catalog.>) 1 THEN
          INSERT INTO %1$I.member_changes (set_name, entity_id, scope, alive, slot)
            SELECT TG_ARGV[0], entity_id, scope, status OPERATOR(pg_catalog.=) 1, slot
              FROM new_rows;
        ELSE
          INSERT INTO %1$I.member_changes (set_name, entity_id, scope, alive)
            SELECT TG_ARGV[0], entity_id, scope, status OPERATOR(pg_catalog.=) 1 FROM new_rows;
        END IF;
        RETURN NULL;
      END $b$$f$, current_schema());
  END IF;
END $do$"#;

/// Names of the three statement triggers that feed the change log from a set table.
pub(in crate::db) const LOG_TRIGGERS: [&str; 3] =
    ["member_log_ins", "member_log_upd", "member_log_del"];

/// The channel `member.sync-notify` listens on (docs/sync.md, "Change notification").
pub const NOTIFY_CHANNEL: &str = "member_changes";
/// The statement trigger that sends it, installed only where a node asked for notification.
const NOTIFY_TRIGGER: &str = "member_notify";

/// Name of the notification trigger an attached `SYNC log` set puts on its source table while
/// a node asks for change notification: `member_<set>$ntf`, running `member_notify_source`
/// (the body of `member_notify_change` under another name: a table with a trigger running
/// `member_notify_change` is one of the module's own, never a source). One per set, so
/// dropping one set's never silences another's on the same table; the `$` keeps its name apart
/// from the module's own (see `trigger_names` in `db/source_triggers.rs`).
pub(in crate::db) fn source_notify_trigger(set: &str) -> String {
    format!("member_{set}$ntf")
}

/// The functions behind the notification triggers, one body under two names:
/// `member_notify_change` (a set table's `member_notify`) and `member_notify_source` (an
/// attached set's [`source_notify_trigger`]; a table with a trigger running
/// `member_notify_change` is one of the module's own, never a source). One notification per
/// statement written outside the module (PostgreSQL folds the identical ones of a transaction
/// into one, sent at commit). The module's own writes (application_name `libmember`) already
/// reach the filters of the node that made them. Not SECURITY DEFINER: NOTIFY needs no
/// privilege. Idempotent; run under the advisory lock.
pub(super) static NOTIFY_FN_DDL: LazyLock<String> = LazyLock::new(|| {
    [
        ("member_notify_change", "member_notify v1"),
        ("member_notify_source", "member_notify_source v1"),
    ]
    .map(|(function, tag)| notify_function_ddl(function, tag))
    .join(";\n")
});

/// Creates `function` unless the one there already carries `tag` (its version).
fn notify_function_ddl(function: &str, tag: &str) -> String {
    format!(
        r#"DO $do$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = '{function}'
                   AND pronamespace = current_schema()::regnamespace
                   AND prosrc LIKE '%{tag}%') THEN
    CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $b$
      BEGIN -- {tag}: wakes the listening nodes, for writes made outside the module
        IF pg_catalog.current_setting('application_name') <> 'libmember' THEN
          PERFORM pg_catalog.pg_notify('{NOTIFY_CHANNEL}', '');
        END IF;
        RETURN NULL;
      END $b$;
  END IF;
END $do$"#
    )
}

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

/// Installs what the listener needs (docs/sync.md): the notify functions, `member_notify` on
/// every set table of the catalog that lacks it, and [`source_notify_trigger`] on the source
/// table of every attached `SYNC log` set that lacks it. Returns the tables where that failed,
/// with the database's reason (the table's owner is another role, a lock not granted in time);
/// their outside writes still arrive within the sync interval.
pub fn install_notify(c: &mut postgres::Client) -> Result<Vec<(String, String)>, postgres::Error> {
    let mut tx = c.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADVISORY_KEY])?;
    tx.batch_execute(&NOTIFY_FN_DDL)?;
    tx.commit()?;
    // Unnamed statements outside the transaction (a pooler may hand each to another server
    // connection).
    let missing = c.query_typed(
        "SELECT c.name FROM member_catalog c
          WHERE to_regclass(quote_ident('member_' || c.name)) IS NOT NULL
            AND NOT EXISTS (SELECT FROM pg_trigger g
                             WHERE g.tgrelid = to_regclass(quote_ident('member_' || c.name))
                               AND g.tgname = $1)",
        &[(&NOTIFY_TRIGGER, postgres::types::Type::TEXT)],
    );
    let missing = match missing {
        Ok(rows) => rows,
        // No catalog yet: the sets created later get the trigger at their CREATE.
        Err(e) if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut wanted: Vec<(String, String)> = missing
        .iter()
        .map(|row| {
            let t = table(row.get(0));
            let ddl = format!("DO $do$ BEGIN {} END $do$", notify_trigger_stmt(&t));
            (t, ddl)
        })
        .collect();
    // Attached sets: the source table, quoted by the database itself.
    let attached = c.query_typed(
        "SELECT c.name, quote_ident(c.source_schema) || '.' || quote_ident(c.source_table)
           FROM member_catalog c
          WHERE c.source_sync = 'log'
            AND to_regclass(quote_ident(c.source_schema) || '.' || quote_ident(c.source_table))
                IS NOT NULL",
        &[],
    );
    let attached = match attached {
        Ok(rows) => rows,
        // No catalog yet, or one from before attached sets (its columns come at the next
        // start).
        Err(e)
            if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE)
                || e.code() == Some(&postgres::error::SqlState::UNDEFINED_COLUMN) =>
        {
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    for row in attached {
        let (set, t): (&str, String) = (row.get(0), row.get(1));
        let name = source_notify_trigger(set);
        let has: bool = c
            .query_typed_one(
                "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = to_regclass($1)
                                   AND tgname = $2)",
                &[
                    (&t, postgres::types::Type::TEXT),
                    (&name, postgres::types::Type::TEXT),
                ],
            )?
            .get(0);
        if !has {
            let ddl = format!(
                "CREATE TRIGGER \"{name}\" AFTER INSERT OR UPDATE OR DELETE ON {t}
                   FOR EACH STATEMENT EXECUTE FUNCTION member_notify_source()"
            );
            wanted.push((t, ddl));
        }
    }
    let mut failed = Vec::new();
    // Each in one message, so one transaction, with the lock timeout a pooler may have
    // dropped from the connection.
    let lock_timeout = crate::config::db_timeout_ms();
    for (t, ddl) in wanted {
        if let Err(e) = c.batch_execute(&format!("SET LOCAL lock_timeout = {lock_timeout}; {ddl}"))
        {
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
pub(in crate::db) fn log_triggers_ddl(set: &str) -> String {
    guarded_ddl(set, "")
}

/// `log_triggers_ddl` after the statements `before` (the set table's own DDL), all refused
/// with the same text when the module's role lacks the privilege.
pub(super) fn guarded_ddl(set: &str, before: &str) -> String {
    let t = table(set);
    let has_slot = format!(
        "EXISTS (SELECT FROM pg_attribute WHERE attrelid = '{t}'::regclass
                   AND attname = 'slot' AND NOT attisdropped)"
    );
    let ensure = |name: &str, event: &str| {
        let with_slot = create_log_trigger(set, name, event, true);
        let without = create_log_trigger(set, name, event, false);
        // A trigger of the name that runs another function is not this set's change-log
        // trigger, whoever put it there (an earlier version let an attached set `log` take
        // these names on another set's table): replaced, else the set would look fed.
        // One made before the table had its slot column keeps logging rows without their
        // slot (read by every node) until `keyslot::ensure_slot_column` remakes it under its
        // own lock: dropping it here, in a CREATE or a rebuild racing another node's, made
        // the two transactions deadlock on the table and its triggers.
        format!(
            "IF EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{t}'::regclass AND tgname = '{name}'
                          AND tgfoid <> 'member_log_change'::regproc) THEN
               DROP TRIGGER {name} ON {t};
             END IF;
             IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{t}'::regclass AND tgname = '{name}') THEN
               IF {has_slot} THEN {with_slot}; ELSE {without}; END IF;
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

/// `CREATE TRIGGER` of one of a set table's change-log triggers (`name` on `event`), with the
/// second argument, which logs each row's slot, when the table has its `slot` column.
fn create_log_trigger(set: &str, name: &str, event: &str, with_slot: bool) -> String {
    let t = table(set);
    let rows = if event == "DELETE" {
        "OLD TABLE AS old_rows"
    } else {
        "NEW TABLE AS new_rows"
    };
    let slot = if with_slot { ", 'slot'" } else { "" };
    format!(
        "CREATE TRIGGER {name} AFTER {event} ON {t} REFERENCING {rows}
           FOR EACH STATEMENT EXECUTE FUNCTION member_log_change('{set}'{slot})"
    )
}

/// Makes again, with the argument that logs the slot, each change-log trigger of a set table
/// that lacks it (made before the table had its `slot` column). For
/// `keyslot::ensure_slot_column`, inside its transaction: after the column exists, under its
/// per-table advisory lock and lock timeout.
pub(in crate::db) fn slot_triggers_ddl(set: &str) -> String {
    let t = table(set);
    let remake = |name: &str, event: &str| {
        let create = create_log_trigger(set, name, event, true);
        format!(
            "IF EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{t}'::regclass AND tgname = '{name}'
                          AND tgfoid = 'member_log_change'::regproc AND tgnargs <> 2) THEN
               DROP TRIGGER {name} ON {t};
               {create};
             END IF;"
        )
    };
    format!(
        "DO $do$ BEGIN {} {} {} END $do$",
        remake(LOG_TRIGGERS[0], "INSERT"),
        remake(LOG_TRIGGERS[1], "UPDATE"),
        remake(LOG_TRIGGERS[2], "DELETE"),
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
