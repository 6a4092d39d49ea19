//! The token in PostgreSQL: `member_catalog_token(set, item, scope, VARIADIC keys)`, the form
//! an outside writer stores for a tokenized set now (docs/security.md, "Outside writers
//! store tokens"). It reads the set's chain from the catalog, checks each key given against
//! the chain's fingerprint before it uses it, and computes the token with pgcrypto's `hmac()`
//! exactly as `model::token` and `model::token_chain` do. The keys are its arguments only:
//! nothing of them is stored, and no error shows one.
//!
//! And the check that keeps a tokenized set's table in that form: triggers refuse a row
//! whose `entity_id` is not a token of the set's chain (a raw item, or a late writer's token
//! under a key the set was rotated away from), which no lookup would ever find.

use postgres::Transaction;

use crate::model::token::{CHAIN_SEPARATOR, FINGERPRINT_LABEL};

/// Marker in the function's body: a body without it (absent, or an older one) is replaced.
const VERSION_MARK: &str = "member_catalog_token v1";
/// The same for the form check's two functions.
const CHECK_MARK: &str = "member_check_token_form v1";

/// The triggers a tokenized set's own table carries: one per INSERT statement (over its
/// transition table), one per row whose `entity_id` or `scope` an UPDATE changes.
pub const FORM_TRIGGERS: [&str; 2] = ["member_form_ins", "member_form_upd"];

/// The regular expression of the token form of a chain of `n` keys, as PostgreSQL builds it.
const FORM_PATTERN: &str =
    "CASE WHEN n = 1 THEN '^[0-9a-f]{64}$' ELSE '^' || n || ':[0-9a-f]{64}$' END";

/// How the check refuses: never quoting the row, whose text may be a raw item.
const REFUSE: &str = "RAISE EXCEPTION 'set % stores tokens of a chain of % key(s): a row in \
another form would never be found', quote_literal(TG_ARGV[0]), n
      USING ERRCODE = 'check_violation',
            HINT = format('store entity_id member_catalog_token(%L, <normalized item>, \
<scope>, <the keys of MEMBER.INFO''s token_key_id>) and scope ''''', TG_ARGV[0]);";

/// The chain's length, read from the catalog when the statement runs (so a rotation changes
/// no trigger); a set that is gone has nothing to keep.
const CHAIN_LENGTH: &str = "SELECT array_length(string_to_array(token_key_fp, '>'), 1) INTO n
    FROM member_catalog WHERE name = TG_ARGV[0] AND tokenize = 'hmac-sha256';
  IF n IS NULL THEN
    RETURN NULL;
  END IF;";

/// `member_check_token_form()` (statement) and `member_check_token_row()` (row).
fn check_ddl() -> String {
    format!(
        r"CREATE OR REPLACE FUNCTION member_check_token_form() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
  -- {CHECK_MARK}: every row an INSERT wrote is a token of the set's chain.
  n int;
BEGIN
  {CHAIN_LENGTH}
  IF EXISTS (SELECT FROM member_form_rows
              WHERE entity_id !~ ({FORM_PATTERN}) OR scope <> '') THEN
    {REFUSE}
  END IF;
  RETURN NULL;
END
$body$;
CREATE OR REPLACE FUNCTION member_check_token_row() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
  -- {CHECK_MARK}: a row an UPDATE gave another entity_id or scope is a token of the chain.
  n int;
BEGIN
  {CHAIN_LENGTH}
  IF NEW.entity_id !~ ({FORM_PATTERN}) OR NEW.scope <> '' THEN
    {REFUSE}
  END IF;
  RETURN NULL;
END
$body$"
    )
}

/// The form triggers of `set`'s own table, each made unless there (in the CREATE of a
/// tokenized set, and at catalog load for sets created before them). Set names are
/// `[a-z0-9_]`: nothing to quote.
pub fn form_triggers_ddl(set: &str) -> String {
    let t = crate::db::sql::table(set);
    let [ins, upd] = FORM_TRIGGERS;
    format!(
        "DO $form$ BEGIN
           IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{t}'::regclass AND tgname = '{ins}') THEN
             CREATE TRIGGER {ins} AFTER INSERT ON {t} REFERENCING NEW TABLE AS member_form_rows
               FOR EACH STATEMENT EXECUTE FUNCTION member_check_token_form('{set}');
           END IF;
           IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '{t}'::regclass AND tgname = '{upd}') THEN
             CREATE TRIGGER {upd} AFTER UPDATE ON {t} FOR EACH ROW
               WHEN (OLD.entity_id IS DISTINCT FROM NEW.entity_id OR OLD.scope IS DISTINCT FROM NEW.scope)
               EXECUTE FUNCTION member_check_token_row('{set}');
           END IF;
         END $form$"
    )
}

/// The tokenized own sets whose table lacks a form trigger (sets created before them).
const MISSING_FORM: &str = "SELECT c.name FROM member_catalog c
     WHERE c.tokenize <> 'none' AND c.source_table IS NULL
       AND to_regclass('member_' || c.name) IS NOT NULL
       AND (SELECT count(*) FROM pg_trigger
             WHERE tgrelid = to_regclass('member_' || c.name)
               AND tgname IN ('member_form_ins', 'member_form_upd')) < 2";

fn function_ddl() -> String {
    let label = std::str::from_utf8(FINGERPRINT_LABEL).expect("the label is ASCII");
    format!(
        r"CREATE OR REPLACE FUNCTION member_catalog_token(set_name text, item text, scope text,
                                                    VARIADIC keys_hex text[])
RETURNS text LANGUAGE plpgsql STABLE AS $body$
DECLARE
  -- {VERSION_MARK}: the token of the normalized item and scope under the set's chain.
  chain text[];
  n int;
  fp text;
  t text;
BEGIN
  SELECT string_to_array(token_key_fp, '{CHAIN_SEPARATOR}') INTO chain
    FROM member_catalog WHERE name = set_name AND tokenize = 'hmac-sha256';
  IF chain IS NULL THEN
    RAISE EXCEPTION 'member_catalog_token: no tokenized set named %', quote_literal(set_name)
      USING ERRCODE = 'undefined_object';
  END IF;
  n := array_length(chain, 1);
  IF coalesce(array_length(keys_hex, 1), 0) <> n THEN
    RAISE EXCEPTION 'member_catalog_token: set % is tokenized under % key(s), % given',
                    quote_literal(set_name), n, coalesce(array_length(keys_hex, 1), 0)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'pass the keys of MEMBER.INFO''s token_key_id, first to last, in hex';
  END IF;
  IF to_regprocedure('hmac(bytea,bytea,text)') IS NULL THEN
    RAISE EXCEPTION 'member_catalog_token needs pgcrypto''s hmac()'
      USING ERRCODE = 'undefined_function', HINT = 'CREATE EXTENSION pgcrypto';
  END IF;
  FOR i IN 1 .. n LOOP
    fp := substr(encode(hmac(convert_to('{label}', 'UTF8'), decode(keys_hex[i], 'hex'),
                             'sha256'), 'hex'), 1, 16);
    IF fp <> chain[i] THEN
      RAISE EXCEPTION 'member_catalog_token: key % of % given is not the key of set % (its fingerprint is %, the set''s is %)',
                      i, n, quote_literal(set_name), fp, chain[i]
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF i = 1 THEN
      t := encode(hmac(convert_to(item, 'UTF8') || '\x00'::bytea || convert_to(scope, 'UTF8'),
                       decode(keys_hex[1], 'hex'), 'sha256'), 'hex');
    ELSE
      t := i::text || ':' ||
           encode(hmac(convert_to(t, 'UTF8'), decode(keys_hex[i], 'hex'), 'sha256'), 'hex');
    END IF;
  END LOOP;
  RETURN t;
END
$body$"
    )
}

/// Installs `member_catalog_token()` and the form check's functions in the current schema
/// unless this version is already there, and the form triggers on tokenized sets made before
/// them. Run under the catalog's advisory lock, with the catalog DDL. pgcrypto need not be
/// installed: the token function says so when called without it.
pub fn install_function(tx: &mut Transaction) -> Result<(), postgres::Error> {
    let current: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_proc WHERE proname = 'member_catalog_token'
                              AND pronamespace = current_schema()::regnamespace
                              AND prosrc LIKE '%' || $1 || '%')",
            &[&VERSION_MARK],
        )?
        .get(0);
    if !current {
        tx.batch_execute(&function_ddl())?;
    }
    let current: bool = tx
        .query_one(
            "SELECT count(*) = 2 FROM pg_proc
              WHERE proname IN ('member_check_token_form', 'member_check_token_row')
                AND pronamespace = current_schema()::regnamespace
                AND prosrc LIKE '%' || $1 || '%'",
            &[&CHECK_MARK],
        )?
        .get(0);
    if !current {
        tx.batch_execute(&check_ddl())?;
    }
    for row in tx.query(MISSING_FORM, &[])? {
        tx.batch_execute(&form_triggers_ddl(row.get(0)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_function_carries_the_label_and_its_version() {
        let ddl = function_ddl();
        assert!(ddl.contains(VERSION_MARK));
        assert!(ddl.contains("'libmember token key fingerprint v1'"));
        assert!(ddl.contains("string_to_array(token_key_fp, '>')"));
        let check = check_ddl();
        assert_eq!(check.matches(CHECK_MARK).count(), 2);
        assert_eq!(check.matches("quote_literal(TG_ARGV[0])").count(), 2);
        let triggers = form_triggers_ddl("cards");
        assert!(FORM_TRIGGERS.iter().all(|t| triggers.contains(t)));
        assert!(FORM_TRIGGERS.iter().all(|t| MISSING_FORM.contains(t)));
    }
}
