-- The floor of an online key rotation's writes, in PostgreSQL alone (docs/security.md,
-- "The 2× target"): the single UPDATE the target is measured against, beside the statements
-- each design of the rotation has to run, on a table shaped as a tokenized set's (its key,
-- its generated slot, its indexes, its change-log and form triggers). No rest, no module:
-- what each design costs at best.
--
--   make run
--   psql -X "host=127.0.0.1 port=5433 user=postgres" -v rows=200000 -f bench/rotation-floor.sql
--
-- Needs a database the module has started in (member_keyslot, member_log_change,
-- member_check_token_form, member_changes) and pgcrypto. Leaves nothing behind: its table
-- and its change-log rows are dropped at the end.
\set ON_ERROR_STOP on
\if :{?rows}
\else
  \set rows 200000
\endif
\set k1 '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'
\set k2 '1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100'
\set QUIET on
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pgcrypto;

-- A tokenized set's table, its rows under k1, and its triggers (the set name floor_rot is
-- never one of the module's: its change-log rows are read by no node).
CREATE OR REPLACE PROCEDURE floor_load(n int, triggers bool) LANGUAGE plpgsql AS $$
BEGIN
  DROP TABLE IF EXISTS floor_rot;
  CREATE TABLE floor_rot (
      entity_id text NOT NULL,
      scope text NOT NULL DEFAULT '',
      status smallint NOT NULL DEFAULT 1,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz,
      slot smallint GENERATED ALWAYS AS (member_keyslot(entity_id)) STORED,
      PRIMARY KEY (entity_id, scope));
  CREATE INDEX floor_rot_updated_at ON floor_rot (updated_at);
  CREATE INDEX floor_rot_slot ON floor_rot (slot);
  INSERT INTO floor_rot (entity_id)
    SELECT encode(hmac(convert_to('r' || g, 'UTF8') || '\x00'::bytea,
                       decode(current_setting('floor.k1'), 'hex'), 'sha256'), 'hex')
      FROM generate_series(1, n) g;
  IF triggers THEN
    CREATE TRIGGER member_log_ins AFTER INSERT ON floor_rot REFERENCING NEW TABLE AS new_rows
      FOR EACH STATEMENT EXECUTE FUNCTION member_log_change('floor_rot', 'slot');
    CREATE TRIGGER member_log_upd AFTER UPDATE ON floor_rot REFERENCING NEW TABLE AS new_rows
      FOR EACH STATEMENT EXECUTE FUNCTION member_log_change('floor_rot', 'slot');
    CREATE TRIGGER member_log_del AFTER DELETE ON floor_rot REFERENCING OLD TABLE AS old_rows
      FOR EACH STATEMENT EXECUTE FUNCTION member_log_change('floor_rot', 'slot');
    CREATE TRIGGER member_form_ins AFTER INSERT ON floor_rot
      REFERENCING NEW TABLE AS member_form_rows
      FOR EACH STATEMENT EXECUTE FUNCTION member_check_token_form('floor_rot', '1', '2');
    CREATE TRIGGER member_form_upd AFTER UPDATE ON floor_rot
      REFERENCING NEW TABLE AS member_form_rows
      FOR EACH STATEMENT EXECUTE FUNCTION member_check_token_form('floor_rot', '1', '2');
  END IF;
END $$;

-- The wrapped form of a chain-1 token, as the module computes it (here in SQL).
CREATE OR REPLACE FUNCTION floor_wrap(t text) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT '2:' || encode(hmac(convert_to(t, 'UTF8'), decode(current_setting('floor.k2'), 'hex'),
                             'sha256'), 'hex') $$;

-- Copy and drain (built): each old row gets a twin row, then the old rows are deleted.
CREATE OR REPLACE PROCEDURE floor_copy() LANGUAGE plpgsql AS $$
BEGIN
  ALTER TABLE floor_rot ADD COLUMN twin text;
  CREATE INDEX floor_rot_twin ON floor_rot (twin) WHERE twin IS NOT NULL;
  COMMIT;
  INSERT INTO floor_rot (entity_id, scope, status, created_at, updated_at, expires_at, twin)
    SELECT floor_wrap(entity_id), '', status, created_at, updated_at, expires_at, entity_id
      FROM floor_rot FOR KEY SHARE;
  COMMIT;
  DELETE FROM floor_rot WHERE twin IS NULL;
  COMMIT;
END $$;

-- In place, batches of `batch` rows by key: the next window of keys from the primary key,
-- each row rewritten to its wrapped form with its old form kept beside it.
CREATE OR REPLACE PROCEDURE floor_in_place_keys(batch int) LANGUAGE plpgsql AS $$
DECLARE c text := ''; k text[];
BEGIN
  ALTER TABLE floor_rot ADD COLUMN twin text;
  COMMIT;
  LOOP
    SELECT array_agg(entity_id ORDER BY entity_id) INTO k FROM (
      SELECT entity_id FROM floor_rot WHERE scope = '' AND entity_id > c AND twin IS NULL
       ORDER BY entity_id LIMIT batch) s;
    EXIT WHEN k IS NULL;
    c := k[array_length(k, 1)];
    UPDATE floor_rot m SET entity_id = floor_wrap(m.entity_id), twin = m.entity_id
     WHERE m.entity_id = ANY(k) AND m.scope = '';
    COMMIT;
  END LOOP;
END $$;

-- In place, batches of `blocks` heap pages: a TID range scan (PostgreSQL 14+) reads each page
-- once, with no index probe; new row versions land past the walk's end or carry a twin.
CREATE OR REPLACE PROCEDURE floor_in_place_blocks(blocks int) LANGUAGE plpgsql AS $$
DECLARE b bigint := 0; total bigint;
BEGIN
  ALTER TABLE floor_rot ADD COLUMN twin text;
  COMMIT;
  total := pg_relation_size('floor_rot') / current_setting('block_size')::int;
  WHILE b < total LOOP
    UPDATE floor_rot m SET entity_id = floor_wrap(m.entity_id), twin = m.entity_id
     WHERE m.ctid >= format('(%s,0)', b)::tid AND m.ctid < format('(%s,0)', b + blocks)::tid
       AND m.twin IS NULL AND m.scope = '' AND octet_length(m.entity_id) = 64;
    b := b + blocks;
    COMMIT;
  END LOOP;
END $$;

SELECT set_config('floor.k1', :'k1', false), set_config('floor.k2', :'k2', false) \gset
\echo rows: :rows

CALL floor_load(:rows, false);
VACUUM (ANALYZE) floor_rot;
CHECKPOINT;
SELECT clock_timestamp() AS t0 \gset
UPDATE floor_rot SET entity_id = floor_wrap(entity_id);
SELECT round(extract(epoch FROM clock_timestamp() - :'t0')::numeric, 2) AS update_s \gset
\echo the single UPDATE, no triggers (what the target is measured against): :update_s s

CALL floor_load(:rows, true);
VACUUM (ANALYZE) floor_rot;
CHECKPOINT;
SELECT clock_timestamp() AS t0 \gset
CALL floor_copy();
SELECT round(extract(epoch FROM clock_timestamp() - :'t0')::numeric, 2) AS s \gset
SELECT round(:s / :update_s, 2) AS r \gset
\echo copy and drain (built), one INSERT and one DELETE: :s s, :r x

CALL floor_load(:rows, true);
VACUUM (ANALYZE) floor_rot;
CHECKPOINT;
SELECT clock_timestamp() AS t0 \gset
CALL floor_in_place_keys(10000);
SELECT round(extract(epoch FROM clock_timestamp() - :'t0')::numeric, 2) AS s \gset
SELECT round(:s / :update_s, 2) AS r \gset
\echo in place, by windows of 10000 keys: :s s, :r x

CALL floor_load(:rows, true);
VACUUM (ANALYZE) floor_rot;
CHECKPOINT;
SELECT clock_timestamp() AS t0 \gset
CALL floor_in_place_blocks(300);
SELECT round(extract(epoch FROM clock_timestamp() - :'t0')::numeric, 2) AS s \gset
SELECT round(:s / :update_s, 2) AS r \gset
SELECT count(*) FILTER (WHERE twin IS NULL) AS left FROM floor_rot \gset
\echo in place, by ranges of 300 pages: :s s, :r x (rows left in the old form: :left)

DROP TABLE floor_rot;
DELETE FROM member_changes WHERE set_name = 'floor_rot';
DROP PROCEDURE floor_load, floor_copy, floor_in_place_keys, floor_in_place_blocks;
DROP FUNCTION floor_wrap;
