//! The cluster key slot in PostgreSQL: the `member_keyslot(text)` function (the same CRC16 and
//! hash-tag rule as `cluster::slot::keyslot`) and each set table's generated `slot` column.

use postgres::{Client, Transaction};

use super::sql::{slot_triggers_ddl, table, LOG_TRIGGERS};
use crate::model::slot::CRC16_TABLE;

/// Marker in the function's body: a body without it (absent, or an older one) is replaced.
/// Raise it only for a body that computes the same slots faster: stored `slot` values are not
/// recomputed when the function changes.
const VERSION_MARK: &str = "member_keyslot v1";

/// `member_keyslot(k)`: the hash slot of the UTF-8 bytes of `k`, as `CLUSTER KEYSLOT` answers
/// it. PL/pgSQL with the 256-entry CRC table as a literal inside the expression (a constant of
/// the cached plan: held in a variable instead, the array is rebuilt on every call, 5× slower).
fn function_ddl() -> String {
    let table: Vec<String> = CRC16_TABLE.iter().map(|v| v.to_string()).collect();
    format!(
        r"CREATE OR REPLACE FUNCTION member_keyslot(k text) RETURNS smallint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $body$
DECLARE
  -- {VERSION_MARK}: CRC16-XMODEM mod 16384 of the key, or of its first non-empty {{tag}}.
  b CONSTANT bytea := convert_to(k, 'UTF8');
  lo int := 0;
  hi int := length(b);
  o int;
  c int;
  crc int := 0;
BEGIN
  o := position('\x7b'::bytea IN b);
  IF o > 0 THEN
    c := position('\x7d'::bytea IN substring(b FROM o + 1));
    IF c > 1 THEN
      lo := o;
      hi := o + c - 1;
    END IF;
  END IF;
  FOR i IN lo .. hi - 1 LOOP
    crc := ((crc << 8) & 65280) # ('{{{}}}'::int[])[((crc >> 8) # get_byte(b, i)) + 1];
  END LOOP;
  RETURN (crc & 16383)::smallint;
END
$body$",
        table.join(",")
    )
}

/// Installs `member_keyslot()` in the current schema unless this version is already there
/// (`sql::install_functions`).
pub fn install_function(tx: &mut Transaction) -> Result<(), postgres::Error> {
    super::sql::install_functions(tx, &["member_keyslot"], VERSION_MARK, function_ddl)
}

/// The `slot` column as a set table declares it: computed by PostgreSQL on every write, so
/// outside writers need to know nothing about it (they cannot set it).
pub const SLOT_COLUMN: &str =
    "slot smallint GENERATED ALWAYS AS (member_keyslot(entity_id)) STORED";

/// For `set_ddl`: the index on `slot` for a table that has the column but not the index (a
/// table just created), in the CREATE's own transaction, before any row is there. Building it
/// later, in the rebuild, would make writers queue behind it while the table fills. A table
/// without the column (an older one) is left to `ensure_slot_column`, and a complete one is
/// not locked at all.
pub fn slot_index_ddl(set: &str) -> String {
    let t = table(set);
    format!(
        "DO $slot$ BEGIN
           IF to_regclass('{t}_slot') IS NULL AND EXISTS (
                SELECT FROM pg_attribute WHERE attrelid = '{t}'::regclass
                   AND attname = 'slot' AND NOT attisdropped) THEN
             CREATE INDEX {t}_slot ON {t} (slot);
           END IF;
         END $slot$;"
    )
}

/// What a set table lacks of its slot column, its index and change-log triggers that log the
/// slot; nothing when the table is absent (the rebuild reports that).
struct Missing {
    column: bool,
    index: bool,
    triggers: bool,
}

impl Missing {
    fn any(&self) -> bool {
        self.column || self.index || self.triggers
    }
}

fn missing(c: &mut impl postgres::GenericClient, t: &str) -> Result<Missing, postgres::Error> {
    let names: Vec<&str> = LOG_TRIGGERS.to_vec();
    let row = c.query_one(
        "SELECT to_regclass($1) IS NOT NULL AND NOT EXISTS (
                    SELECT FROM pg_attribute WHERE attrelid = to_regclass($1)
                       AND attname = 'slot' AND NOT attisdropped),
                to_regclass($1) IS NOT NULL AND to_regclass($1 || '_slot') IS NULL,
                EXISTS (SELECT FROM pg_trigger WHERE tgrelid = to_regclass($1)
                           AND tgname = ANY($2) AND tgnargs <> 2
                           AND tgfoid = to_regproc('member_log_change'))",
        &[&t, &names],
    )?;
    Ok(Missing {
        column: row.get(0),
        index: row.get(1),
        triggers: row.get(2),
    })
}

/// Gives a set table its `slot` column and index where either is missing (a table created
/// before the column existed; an index dropped since). Runs where every node meets every
/// table, before a rebuild reads it, on the rebuild's connection (no statement timeout).
///
/// A table that has both costs one catalog query and takes no lock. Adding the column rewrites
/// the table under an ACCESS EXCLUSIVE lock (writers and readers of that set wait for it, once;
/// about 0.4 s per 100 000 rows); building the index blocks writers only. Waiting for the
/// table's lock is bounded by `lock_timeout_ms`, after which this fails and the rebuild is
/// retried. Nodes meeting the table together serialize on an advisory lock per table, so one
/// does the work and the others find it done. In the same transaction, the table's change-log
/// triggers made before the column get the argument that logs the slot
/// (`sql::changes::slot_triggers_ddl`); nothing else drops them.
pub fn ensure_slot_column(
    c: &mut Client,
    set: &str,
    lock_timeout_ms: u64,
) -> Result<(), postgres::Error> {
    let t = table(set);
    // Everything in the transaction (a pooler may hand each one to another server
    // connection); a table that has both still takes no lock.
    let mut tx = c.transaction()?;
    if !missing(&mut tx, &t)?.any() {
        return tx.commit();
    }
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('libmember slot column ' || $1, 0))",
        &[&t],
    )?;
    let m = missing(&mut tx, &t)?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = {lock_timeout_ms}"))?;
    if m.column {
        tx.batch_execute(&format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {SLOT_COLUMN}"
        ))?;
    }
    if m.column || m.index {
        tx.batch_execute(&format!(
            "CREATE INDEX IF NOT EXISTS {t}_slot ON {t} (slot)"
        ))?;
    }
    if m.column || m.triggers {
        tx.batch_execute(&slot_triggers_ddl(set))?;
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_function_carries_the_crc_table_and_its_version() {
        let ddl = function_ddl();
        assert!(ddl.contains(VERSION_MARK));
        // First entries of CRC16-XMODEM's table, and its last.
        assert!(ddl.contains("'{0,4129,8258,12387,"), "{ddl}");
        assert!(ddl.contains(",7920}'::int[]"), "{ddl}");
    }
}
