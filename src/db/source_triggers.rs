//! The change-log triggers an attached set (`SYNC log`, docs/attach.md) puts on its source
//! table: their names, their function, installing, migrating from the names of earlier
//! versions, and removing them at MEMBER.DROP. Also the rule that the module's own relations
//! are never a source.
//!
//! A trigger is the module's for set `s` only when it runs `member_log_source` (of the
//! module's schema) with `s` as its first argument: names alone never decide what is dropped.

use postgres::types::Type;
use postgres::{GenericClient, Transaction};

use super::source::{qualified, quote_ident, quote_literal, shown_table};
use super::sql::source_notify_trigger as notify_trigger_name;
use super::DbErr;
use crate::model::error;
use crate::model::set_def::{SetDef, Source};

/// Names of the change-log triggers an attached set puts on its source table,
/// `member_<set>$<op>`: one set of three per set, so several sets may attach to one table.
/// Set names are `[a-z0-9_]`, so the `$` (which PostgreSQL allows in a name after its first
/// character) is the only one in the name, and no set name can make another set's names nor
/// any name the module gives its own triggers (`member_log_ins`, `member_notify`, …, without a
/// `$`). Always quoted in SQL.
pub fn trigger_names(set: &str) -> [String; 3] {
    ["ins", "upd", "del"].map(|op| format!("member_{set}${op}"))
}

/// The names earlier versions gave them, `member_<set>_<op>`: those of the set `log` were the
/// names of every set table's own triggers. Found at install and DROP, and removed where they
/// are this set's.
pub fn old_trigger_names(set: &str) -> [String; 3] {
    ["ins", "upd", "del"].map(|op| format!("member_{set}_{op}"))
}

/// The trigger function that feeds the change log from a source table (docs/sync.md). Its
/// arguments (set name, column, scope column or '', normalize) are quoted into SQL here, inside
/// the database, with `format('%I')`. SECURITY DEFINER with a fixed search path, like
/// `member_log_change`, so writers need no grant on the log.
pub const LOG_FN_DDL: &str = r#"DO $do$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'member_log_source'
                   AND pronamespace = current_schema()::regnamespace
                   AND prosrc LIKE '%member_log_source v1%') THEN
    EXECUTE replace($f$CREATE OR REPLACE FUNCTION member_log_source() RETURNS trigger
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
      BEGIN -- member_log_source v1: args set, column, scope column or '', normalize
        EXECUTE format('INSERT INTO @S@.member_changes (set_name, entity_id, scope, alive)
                          SELECT $1, %s, %s, $2 FROM %I WHERE %I IS NOT NULL%s',
          CASE WHEN TG_ARGV[3] = 'lower' THEN format('lower(%I::text)', TG_ARGV[1])
               ELSE format('%I::text', TG_ARGV[1]) END,
          CASE WHEN TG_ARGV[2] = '' THEN '''''' ELSE format('%I::text', TG_ARGV[2]) END,
          CASE WHEN TG_OP = 'DELETE' THEN 'old_rows' ELSE 'new_rows' END,
          TG_ARGV[1],
          CASE WHEN TG_ARGV[2] = '' THEN '' ELSE format(' AND %I IS NOT NULL', TG_ARGV[2]) END)
        USING TG_ARGV[0], TG_OP <> 'DELETE';
        RETURN NULL;
      END $b$$f$, '@S@', quote_ident(current_schema()));
  END IF;
END $do$"#;

/// True when `schema.table` is one of the module's own relations: in the module's schema
/// (its connection's `current_schema()`), the catalog's and the change log's families
/// (`member_catalog…`, `member_changes…`: no set's table can take those names) and the table
/// `member_<set>` of every set the catalog holds that is not attached; anywhere, a table
/// carrying the module's own-set triggers (`member_log_change`) or its notify trigger (an
/// attached set's runs `member_notify_source`, so a source stays a source). An
/// application's own `member_…` table is not reserved by its name alone (an earlier version
/// may have attached one). False for a table that does not exist.
fn module_relation<C: GenericClient>(c: &mut C, src: &Source) -> Result<bool, DbErr> {
    // Unnamed statements throughout this file: the caller may run them outside a transaction
    // on a connection a pooler shares.
    let row = c
        .query_typed_opt(
            "SELECT (n.nspname = current_schema()
                     AND (c.relname::text LIKE 'member\\_catalog%'
                          OR c.relname::text LIKE 'member\\_changes%'
                          OR EXISTS (SELECT FROM member_catalog m
                                      WHERE m.source_table IS NULL
                                        AND 'member_' || m.name = c.relname::text)))
                    OR EXISTS (SELECT FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid
                                WHERE g.tgrelid = c.oid
                                  AND p.proname IN ('member_log_change', 'member_notify_change'))
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND c.relname = $2",
            &[(&src.schema, Type::TEXT), (&src.table, Type::TEXT)],
        )
        .map_err(|e| super::classify(&e))?;
    Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
}

/// Refuses (`error::SOURCE_MODULE_OWN`) a source that is one of the module's own relations,
/// whatever `member.attach-allow` says: at CREATE, and at every build of a set an earlier
/// version let attach one (it then never serves, rather than serve from the module's tables
/// or take their triggers' names).
pub fn refuse_module_relation<C: GenericClient>(c: &mut C, src: &Source) -> Result<(), DbErr> {
    if module_relation(c, src)? {
        return Err(DbErr::Refused(error::SOURCE_MODULE_OWN));
    }
    Ok(())
}

/// One trigger on the source table, as `install_log_triggers` and `drop_log_triggers` see it.
struct Found {
    name: String,
    disabled: bool,
    /// `pg_trigger.tgargs`: each argument followed by a NUL byte.
    args: Vec<u8>,
    /// It runs the module's `member_log_source` (or, for the notification trigger,
    /// `member_notify_source`).
    ours: bool,
}

impl Found {
    /// The module's trigger for `set` (whatever its other arguments).
    fn of_set(&self, set: &str) -> bool {
        self.ours && self.args.split(|b| *b == 0).next() == Some(set.as_bytes())
    }
}

/// The triggers named `names` on `t`, and whether the module's role owns `t` (None: no table).
fn found<C: GenericClient>(
    c: &mut C,
    t: &str,
    names: &[String],
) -> Result<(Vec<Found>, Option<bool>), postgres::Error> {
    let rows = c.query_typed(
        "SELECT g.tgname::text, g.tgenabled = 'D', g.tgargs,
                p.proname IN ('member_log_source', 'member_notify_source')
                  AND p.pronamespace = current_schema()::regnamespace
           FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid
          WHERE g.tgrelid = to_regclass($1) AND g.tgname::text = ANY($2::text[])",
        &[(&t, Type::TEXT), (&names, Type::TEXT_ARRAY)],
    )?;
    let owner: Option<bool> = c
        .query_typed_one(
            "SELECT (SELECT pg_has_role(relowner, 'USAGE') FROM pg_class
                      WHERE oid = to_regclass($1))",
            &[(&t, Type::TEXT)],
        )?
        .get(0);
    let found = rows
        .iter()
        .map(|r| Found {
            name: r.get(0),
            disabled: r.get(1),
            args: r.get(2),
            ours: r.get(3),
        })
        .collect();
    Ok((found, owner))
}

/// Installs (or enables) the set's change-log triggers on its source table, then removes the
/// ones an earlier version installed for this set under the old names (where the module's
/// role owns the table; otherwise they stay, and only log each write twice). Refused with the
/// reason when the module's role may not install them (owner, or TRIGGER on the table), when
/// the table is one of the module's own relations, or when a trigger of one of the names is
/// not the module's (it is never dropped).
pub fn install_log_triggers<C: GenericClient>(c: &mut C, def: &SetDef) -> Result<(), DbErr> {
    let Some(src) = &def.source else {
        return Ok(());
    };
    refuse_module_relation(c, src)?;
    let t = qualified(src);
    let names = trigger_names(&def.name);
    let old = old_trigger_names(&def.name);
    let all: Vec<String> = names.iter().chain(&old).cloned().collect();
    let (have, owner) = found(c, &t, &all).map_err(|e| super::classify(&e))?;
    let raw = [
        def.name.as_str(),
        src.column.as_str(),
        src.scope_column.as_deref().unwrap_or(""),
        def.normalize.name(),
    ];
    let args = raw.map(quote_literal).join(", ");
    let want: Vec<u8> = raw.iter().flat_map(|a| a.bytes().chain([0])).collect();
    for (name, op) in names.iter().zip(["INSERT", "UPDATE", "DELETE"]) {
        let q = quote_ident(name);
        let ddl = match have.iter().find(|f| &f.name == name) {
            Some(f) if !f.ours => {
                return Err(DbErr::Invalid(format!(
                    "{} has a trigger named {} that is not the module's: SYNC log needs that \
                     name for its change-log trigger; rename or drop it",
                    shown_table(src),
                    super::source::shown(name)
                )))
            }
            // Left by an earlier set of this name on other columns (its DROP could not remove
            // it): replaced, which takes the owner.
            Some(f) if f.args != want => {
                c.batch_execute(&format!("DROP TRIGGER {q} ON {t}"))
                    .map_err(|e| privilege(e, src))?;
                create_trigger(&q, op, &t, &args)
            }
            Some(f) if f.disabled => format!("ALTER TABLE {t} ENABLE TRIGGER {q}"),
            Some(_) => continue,
            None => create_trigger(&q, op, &t, &args),
        };
        c.batch_execute(&ddl).map_err(|e| privilege(e, src))?;
    }
    if crate::config::sync_notify() {
        install_notify_trigger(c, def)?;
    }
    if owner == Some(true) {
        for f in have
            .iter()
            .filter(|f| old.contains(&f.name) && f.of_set(&def.name))
        {
            c.batch_execute(&format!("DROP TRIGGER {} ON {t}", quote_ident(&f.name)))
                .map_err(|e| privilege(e, src))?;
        }
    }
    Ok(())
}

/// Installs (or enables) the set's notification trigger on its source table where the notify
/// function exists (the listener installs it). A trigger of that name that is not the
/// module's is left alone: the set's outside writes then arrive with the sync interval.
pub fn install_notify_trigger<C: GenericClient>(c: &mut C, def: &SetDef) -> Result<(), DbErr> {
    let Some(src) = &def.source else {
        return Ok(());
    };
    let function: bool = c
        .query_typed_one("SELECT to_regproc('member_notify_source') IS NOT NULL", &[])
        .map_err(|e| super::classify(&e))?
        .get(0);
    if !function {
        return Ok(());
    }
    let t = qualified(src);
    let name = notify_trigger_name(&def.name);
    let (have, _) = found(c, &t, std::slice::from_ref(&name)).map_err(|e| super::classify(&e))?;
    let q = quote_ident(&name);
    let ddl = match have.first() {
        None => format!(
            "CREATE TRIGGER {q} AFTER INSERT OR UPDATE OR DELETE ON {t}
               FOR EACH STATEMENT EXECUTE FUNCTION member_notify_source()"
        ),
        Some(f) if f.ours && f.disabled => format!("ALTER TABLE {t} ENABLE TRIGGER {q}"),
        Some(_) => return Ok(()),
    };
    c.batch_execute(&ddl).map_err(|e| privilege(e, src))
}

fn create_trigger(name: &str, op: &str, t: &str, args: &str) -> String {
    let rows = if op == "DELETE" {
        "OLD TABLE AS old_rows"
    } else {
        "NEW TABLE AS new_rows"
    };
    format!(
        "CREATE TRIGGER {name} AFTER {op} ON {t} REFERENCING {rows}
           FOR EACH STATEMENT EXECUTE FUNCTION member_log_source({args})"
    )
}

/// A refusal for want of privilege, naming what to grant; other errors as they are.
fn privilege(e: postgres::Error, src: &Source) -> DbErr {
    match e.code() {
        Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => DbErr::Invalid(format!(
            "SYNC log cannot install the change-log triggers on {}: the module's database \
             role must own it or hold TRIGGER on it ({})",
            shown_table(src),
            crate::server::reply::escape(e.as_db_error().map_or("", |d| d.message()).as_bytes())
        )),
        _ => super::classify(&e),
    }
}

/// Removes the set's triggers from its source table (MEMBER.DROP), if the module's role owns
/// it: those of the current names, and those of the old names that are this set's (a trigger
/// of another set, or not the module's, is never dropped). Otherwise what to tell the operator
/// (the triggers stay, feeding log rows no set reads, pruned with the log).
pub fn drop_log_triggers(
    tx: &mut Transaction,
    def: &SetDef,
) -> Result<Option<String>, postgres::Error> {
    let Some(src) = &def.source else {
        return Ok(None);
    };
    let t = qualified(src);
    let names: Vec<String> = trigger_names(&def.name)
        .into_iter()
        .chain([notify_trigger_name(&def.name)])
        .collect();
    let all: Vec<String> = names
        .iter()
        .chain(&old_trigger_names(&def.name))
        .cloned()
        .collect();
    let (have, owner) = found(tx, &t, &all)?;
    let mine: Vec<&str> = have
        .iter()
        .filter(|f| (names.contains(&f.name) && f.ours) || f.of_set(&def.name))
        .map(|f| f.name.as_str())
        .collect();
    match owner {
        // Only the table's owner may drop triggers (TRIGGER only lets one create them).
        Some(true) => {
            for name in mine {
                tx.batch_execute(&format!("DROP TRIGGER {} ON {t}", quote_ident(name)))?;
            }
            Ok(None)
        }
        Some(false) if !mine.is_empty() => {
            let t = shown_table(src);
            let drops: Vec<String> = mine
                .iter()
                .map(|n| format!("DROP TRIGGER {} ON {t};", super::source::shown(n)))
                .collect();
            Ok(Some(format!(
                "libmember: set '{}' dropped, but its change-log triggers stay on {t} (only \
                 the table's owner may drop them): {}",
                def.name,
                drops.join(" ")
            )))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trigger_is_a_sets_only_by_its_function_and_first_argument() {
        let f = |ours: bool, args: &[u8]| Found {
            name: "member_log_ins".into(),
            disabled: false,
            args: args.to_vec(),
            ours,
        };
        assert!(f(true, b"log\0c\0\0none\0").of_set("log"));
        assert!(!f(true, b"log\0c\0\0none\0").of_set("lo"));
        assert!(!f(true, b"logx\0c\0\0none\0").of_set("log"));
        // A set table's own trigger (member_log_change('b')) is never set `log`'s.
        assert!(!f(false, b"b\0").of_set("log"));
        assert!(!f(false, b"log\0").of_set("log"));
    }
}
