//! The token in PostgreSQL: `member_catalog_token(set, item, scope, VARIADIC keys)`, the form
//! an outside writer stores for a tokenized set now (docs/security.md, "Outside writers
//! store tokens"). It reads the set's chain from the catalog, checks each key given against
//! the chain's fingerprint before it uses it, and computes the token with pgcrypto's `hmac()`
//! exactly as `model::token` and `model::token_chain` do. The keys are its arguments only:
//! nothing of them is stored, and no error shows one.

use postgres::Transaction;

use crate::model::token::{CHAIN_SEPARATOR, FINGERPRINT_LABEL};

/// Marker in the function's body: a body without it (absent, or an older one) is replaced.
const VERSION_MARK: &str = "member_catalog_token v1";
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

/// Installs `member_catalog_token()` in the current schema unless this version is already
/// there, then the form check (`token_form`). Run under the catalog's advisory lock, with the
/// catalog DDL. pgcrypto need not be installed: the function says so when called without it.
pub fn install_function(tx: &mut Transaction) -> Result<(), postgres::Error> {
    super::sql::install_functions(tx, &["member_catalog_token"], VERSION_MARK, function_ddl)?;
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
