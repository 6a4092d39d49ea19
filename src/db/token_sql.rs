//! The token in PostgreSQL: `member_catalog_token(set, item, scope, VARIADIC keys)`, the form
//! an outside writer stores for a tokenized set now (docs/security.md, "Outside writers
//! store tokens"). It reads the set's chain from the catalog, checks each key given against
//! the chain's fingerprint before it uses it, and computes the token with pgcrypto's `hmac()`
//! exactly as `model::token` and `model::token_chain` do. Beside it,
//! `member_catalog_forms(set, item, scope, VARIADIC keys)`: the forms a row of the item may
//! have now (two while the set's key rotates, for an outside `UPDATE` or `DELETE`:
//! docs/rotation-in-place.md). The keys are their arguments only: nothing of them is stored,
//! and no error shows one.

use postgres::Transaction;

use crate::model::token::{CHAIN_SEPARATOR, FINGERPRINT_LABEL};

/// Marker in the function's body: a body without it (absent, or an older one) is replaced.
const VERSION_MARK: &str = "member_catalog_token v2";
/// The loop both functions share: checks each of `keys_hex` against the fingerprint of
/// `chain`'s key at its place, then computes the token of `item` and `scope` under them, as
/// `t`; where `keep_before` is the chain's length, it keeps the token of the keys before the
/// last in `forms` too.
fn chain_loop(fn_name: &str) -> String {
    let label = std::str::from_utf8(FINGERPRINT_LABEL).expect("the label is ASCII");
    format!(
        r"FOR i IN 1 .. n LOOP
    fp := substr(encode(hmac(convert_to('{label}', 'UTF8'), decode(keys_hex[i], 'hex'),
                             'sha256'), 'hex'), 1, 16);
    IF fp <> chain[i] THEN
      RAISE EXCEPTION '{fn_name}: key % of % given is not the key of set % (its fingerprint is %, the set''s is %)',
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
    IF i = keep_before - 1 THEN
      forms := forms || t;
    END IF;
  END LOOP;"
    )
}

/// The opening both functions share: the set's chain, the count of keys given checked.
fn chain_read(fn_name: &str, hint: &str) -> String {
    format!(
        r"IF chain IS NULL THEN
    RAISE EXCEPTION '{fn_name}: no tokenized set named %', quote_literal(set_name)
      USING ERRCODE = 'undefined_object';
  END IF;
  n := array_length(chain, 1);
  IF coalesce(array_length(keys_hex, 1), 0) <> n THEN
    RAISE EXCEPTION '{fn_name}: set % is tokenized under % key(s), % given',
                    quote_literal(set_name), n, coalesce(array_length(keys_hex, 1), 0)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = '{hint}';
  END IF;
  IF to_regprocedure('hmac(bytea,bytea,text)') IS NULL THEN
    RAISE EXCEPTION '{fn_name} needs pgcrypto''s hmac()'
      USING ERRCODE = 'undefined_function', HINT = 'CREATE EXTENSION pgcrypto';
  END IF;"
    )
}

fn function_ddl() -> String {
    let keys_hint = "pass the keys of MEMBER.INFO''s token_key_id, first to last, in hex";
    let forms_hint = "pass the keys of MEMBER.INFO''s token_key_id, first to last, in hex, \
                      and while the set rotates to a key that is not in it yet, that key last";
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
  keep_before int := 0;
  forms text[] := '{{}}';
BEGIN
  SELECT string_to_array(token_key_fp, '{CHAIN_SEPARATOR}') INTO chain
    FROM member_catalog WHERE name = set_name AND tokenize = 'hmac-sha256';
  {read_token}
  {loop_token}
  RETURN t;
END
$body$;
CREATE OR REPLACE FUNCTION member_catalog_forms(set_name text, item text, scope text,
                                                VARIADIC keys_hex text[])
RETURNS text[] LANGUAGE plpgsql STABLE AS $body$
DECLARE
  -- {VERSION_MARK}: the forms a row of the normalized item and scope may have now: its
  -- token under the set's chain, and while the set's key rotates the one of the chain
  -- without the key it rotates to as well (old first). For WHERE entity_id = ANY(…).
  chain text[];
  phase text;
  target text;
  n int;
  fp text;
  t text;
  keep_before int := 0;
  forms text[] := '{{}}';
BEGIN
  SELECT string_to_array(token_key_fp, '{CHAIN_SEPARATOR}'), rotate_phase, rotate_to
    INTO chain, phase, target
    FROM member_catalog WHERE name = set_name AND tokenize = 'hmac-sha256';
  IF phase IN ('rewriting', 'copying') THEN
    chain := chain || target;
  END IF;
  IF phase IS NOT NULL THEN
    keep_before := array_length(chain, 1);
  END IF;
  {read_forms}
  {loop_forms}
  RETURN forms || t;
END
$body$",
        read_token = chain_read("member_catalog_token", keys_hint),
        loop_token = chain_loop("member_catalog_token"),
        read_forms = chain_read("member_catalog_forms", forms_hint),
        loop_forms = chain_loop("member_catalog_forms"),
    )
}

/// Installs `member_catalog_token()` and `member_catalog_forms()` in the current schema unless this version is already
/// there, then the form check (`token_form`). Run under the catalog's advisory lock, with the
/// catalog DDL. pgcrypto need not be installed: the function says so when called without it.
pub fn install_function(tx: &mut Transaction) -> Result<(), postgres::Error> {
    super::sql::install_functions(
        tx,
        &["member_catalog_token", "member_catalog_forms"],
        VERSION_MARK,
        function_ddl,
    )?;
    crate::db::token_form::install(tx)
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
    }
}
