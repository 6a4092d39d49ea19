//! The check that keeps a tokenized set's own table in its token form (docs/security.md, "A
//! row in another form is refused"): two triggers refuse a row whose `entity_id` is not a
//! token of the set's chain, or whose scope is not `''` (a raw item, a late writer's token
//! under a key the set was rotated away from), which no lookup would ever find. They carry
//! the chain's length as an argument, so a write pays no catalog read; `member_catalog_form`
//! (re)makes them from the catalog: in CREATE, at a node's start for a table whose triggers
//! are missing or name another length, and in the offline rotation's transaction.

use postgres::Transaction;

/// Marker in the functions' bodies: bodies without it (absent, or older) are replaced.
const MARK: &str = "member_check_token_form v4";

/// The triggers a tokenized set's own table carries: one per INSERT statement (over its
/// transition table), one per row whose `entity_id` or `scope` an UPDATE changes.
pub const FORM_TRIGGERS: [&str; 2] = ["member_form_ins", "member_form_upd"];

/// The declarations of the token forms a row may have: of a chain of `n` keys, or while the
/// set rotates (a third trigger argument, `m` = n + 1) of either `n` or `m` keys. A form is
/// its prefix (`''` or `'<k>:'`), 64 lowercase hex digits after it: a length and an
/// unbounded class. (v3 matched `[0-9a-f]{64}` and an alternation, built for every row: 17 µs
/// a row in PostgreSQL's regular-expression engine, against under 1 µs for this test.)
const FORMS: &str = "n CONSTANT int := TG_ARGV[1]::int;
  m CONSTANT int := CASE WHEN TG_NARGS > 2 THEN TG_ARGV[2]::int ELSE n END;
  pn CONSTANT text := CASE WHEN n = 1 THEN '' ELSE n || ':' END;
  pm CONSTANT text := CASE WHEN m = 1 THEN '' ELSE m || ':' END;
  rn CONSTANT text := '^' || pn || '[0-9a-f]*$';
  rm CONSTANT text := '^' || pm || '[0-9a-f]*$';";

/// Whether `e` has one of the forms [`FORMS`] declares.
fn in_form(e: &str) -> String {
    format!(
        "((octet_length({e}) = 64 + octet_length(pn) AND {e} ~ rn) \
         OR (octet_length({e}) = 64 + octet_length(pm) AND {e} ~ rm))"
    )
}

/// The chain lengths a set's rows may have now, `lo` and `hi`, from its catalog row aliased
/// `c`: the chain's length, and while it rotates the one after it (rewriting, copying) or before it
/// (switching, draining: the chain already names the new key).
const LENGTHS: &str = "array_length(string_to_array(c.token_key_fp, '>'), 1)
      - CASE WHEN c.rotate_phase IN ('switching', 'draining') THEN 1 ELSE 0 END AS lo,
    array_length(string_to_array(c.token_key_fp, '>'), 1)
      + CASE WHEN c.rotate_phase IN ('rewriting', 'copying') THEN 1 ELSE 0 END AS hi";

/// How the check refuses: never quoting the row, whose text may be a raw item.
const REFUSE: &str = "RAISE EXCEPTION 'set % stores tokens of a chain of % key(s): a row in \
another form would never be found', quote_literal(TG_ARGV[0]), n
      USING ERRCODE = 'check_violation',
            HINT = format('store entity_id member_catalog_token(%L, <normalized item>, \
<scope>, <the keys of MEMBER.INFO''s token_key_id>) and scope ''''', TG_ARGV[0]);";

/// The three functions: the statement check, the row check, and `member_catalog_form(set)`.
fn functions_ddl() -> String {
    let [ins, upd] = FORM_TRIGGERS;
    let (rows_in_form, new_in_form) = (in_form("entity_id"), in_form("NEW.entity_id"));
    format!(
        r"CREATE OR REPLACE FUNCTION member_check_token_form() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
  -- {MARK}: every row an INSERT wrote is a token of a chain of TG_ARGV[1] keys (or,
  -- while the set rotates, of TG_ARGV[2]).
  {FORMS}
BEGIN
  IF EXISTS (SELECT FROM member_form_rows WHERE NOT {rows_in_form} OR scope <> '') THEN
    {REFUSE}
  END IF;
  RETURN NULL;
END
$body$;
CREATE OR REPLACE FUNCTION member_check_token_row() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
  -- {MARK}: a row an UPDATE gave another entity_id or scope is a token of the chain.
  {FORMS}
BEGIN
  IF NOT {new_in_form} OR NEW.scope <> '' THEN
    {REFUSE}
  END IF;
  RETURN NULL;
END
$body$;
CREATE OR REPLACE FUNCTION member_catalog_form(set_name text) RETURNS int
LANGUAGE plpgsql AS $body$
DECLARE
  -- {MARK}: (re)makes the form triggers of a tokenized set for its chain's length now
  -- (both lengths while it rotates).
  n int;
  m int;
  args text;
  t text := 'member_' || set_name;
BEGIN
  SELECT {LENGTHS} INTO n, m
    FROM member_catalog c
   WHERE c.name = set_name AND c.tokenize = 'hmac-sha256' AND c.source_table IS NULL;
  IF n IS NULL THEN
    RAISE EXCEPTION 'member_catalog_form: no tokenized set named %', quote_literal(set_name)
      USING ERRCODE = 'undefined_object';
  END IF;
  args := format('%L, %s', set_name, n) || CASE WHEN m <> n THEN ', ' || m ELSE '' END;
  EXECUTE format('DROP TRIGGER IF EXISTS {ins} ON %I', t);
  EXECUTE format('DROP TRIGGER IF EXISTS {upd} ON %I', t);
  EXECUTE format('CREATE TRIGGER {ins} AFTER INSERT ON %I
                    REFERENCING NEW TABLE AS member_form_rows FOR EACH STATEMENT
                    EXECUTE FUNCTION member_check_token_form(%s)', t, args);
  EXECUTE format('CREATE TRIGGER {upd} AFTER UPDATE ON %I FOR EACH ROW
                    WHEN (OLD.entity_id IS DISTINCT FROM NEW.entity_id
                          OR OLD.scope IS DISTINCT FROM NEW.scope)
                    EXECUTE FUNCTION member_check_token_row(%s)', t, args);
  RETURN n;
END
$body$"
    )
}

/// The tokenized own sets (all, or the one named by `$1`) whose table lacks a form trigger,
/// or has one made for other chain lengths (sets created before them; a rotation done
/// without `member_catalog_form`).
fn stale_sql() -> String {
    format!(
        "SELECT c.name FROM (SELECT c.*, {LENGTHS} FROM member_catalog c) c
          WHERE c.tokenize = 'hmac-sha256' AND c.source_table IS NULL
            AND ($1::text IS NULL OR c.name = $1)
            AND to_regclass('member_' || c.name) IS NOT NULL
            AND (SELECT count(*) FROM pg_trigger
                  WHERE tgrelid = to_regclass('member_' || c.name)
                    AND tgname IN ('member_form_ins', 'member_form_upd')
                    AND tgargs = convert_to(c.name, 'UTF8') || '\\x00'::bytea
                       || convert_to(c.lo::text, 'UTF8') || '\\x00'::bytea
                       || CASE WHEN c.hi <> c.lo
                               THEN convert_to(c.hi::text, 'UTF8') || '\\x00'::bytea
                               ELSE ''::bytea END) < 2"
    )
}

/// Makes the form triggers of `set` (of every tokenized set when `None`) whose own are
/// missing or stale. Triggers already right are left alone: remaking them would lock the
/// table against its readers at every repeated CREATE.
pub fn make(tx: &mut Transaction, set: Option<&str>) -> Result<(), postgres::Error> {
    for row in tx.query(&stale_sql(), &[&set])? {
        let stale: String = row.get(0);
        tx.execute("SELECT member_catalog_form($1)", &[&stale])?;
    }
    Ok(())
}

/// Installs the functions unless this version is there, and remakes the triggers of every
/// tokenized set whose own are missing or stale. Run under the catalog's advisory lock, with
/// the catalog DDL.
pub fn install(tx: &mut Transaction) -> Result<(), postgres::Error> {
    let names = [
        "member_check_token_form",
        "member_check_token_row",
        "member_catalog_form",
    ];
    crate::db::sql::install_functions(tx, &names, MARK, functions_ddl)?;
    make(tx, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_functions_carry_their_version_and_the_triggers_names() {
        let ddl = functions_ddl();
        assert_eq!(ddl.matches(MARK).count(), 3);
        assert_eq!(ddl.matches("quote_literal(TG_ARGV[0])").count(), 2);
        assert!(FORM_TRIGGERS
            .iter()
            .all(|t| ddl.contains(t) && stale_sql().contains(t)));
    }
}
