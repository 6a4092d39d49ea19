//! The change-log trigger function as outside writers meet it (docs/sync.md, "Write path"):
//! an older version in an existing database is replaced at the next start, a writer's own
//! `search_path` cannot make it run the writer's code with the module's rights, and each row
//! is logged with its cluster slot (a table from before the slot column still feeds the log).
use crate::support;

use std::time::Duration;

use redis::Connection;
use support::member::*;
use support::{start_with, wait_until, APP_ROLE, MODULE_ROLE};

/// The trigger function as version 1 installed it (`SET search_path` on every call).
const V1: &str = r#"CREATE OR REPLACE FUNCTION member_log_change() RETURNS trigger
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
      BEGIN -- member_changes v1: every row written or deleted, alive when status = 1
        IF TG_OP = 'DELETE' THEN
          INSERT INTO public.member_changes (set_name, entity_id, scope, alive)
            SELECT TG_ARGV[0], entity_id, scope, false FROM old_rows;
        ELSE
          INSERT INTO public.member_changes (set_name, entity_id, scope, alive)
            SELECT TG_ARGV[0], entity_id, scope, status = 1 FROM new_rows;
        END IF;
        RETURN NULL;
      END $b$"#;

/// The trigger function's settings and whether its body is the current version (3).
fn function_state(pg: &mut postgres::Client) -> (Option<Vec<String>>, bool) {
    let r = pg
        .query_one(
            "SELECT proconfig, prosrc LIKE '%member_changes v3%' FROM pg_proc
              WHERE proname = 'member_log_change'",
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// A set `set` whose filter is trusted, with INSERT granted to the application role.
fn create_for_app(env: &Env, c: &mut Connection, set: &str) {
    ok(c, &["MEMBER.CREATE", set]);
    wait_trusted(c, set, "the new set's filter never became trusted");
    env.db
        .client_as(MODULE_ROLE)
        .batch_execute(&format!(
            "GRANT SELECT, INSERT ON member_{set} TO {APP_ROLE}"
        ))
        .unwrap();
}

/// EXISTS answers 1 within 10 s.
fn becomes_member(c: &mut Connection, set: &str, item: &str) -> bool {
    wait_until(Duration::from_secs(10), || {
        int(c, &["MEMBER.EXISTS", set, item]) == 1
    })
}

#[test]
fn an_older_trigger_function_is_replaced_at_the_next_start() {
    let mut env = Env::least_privilege(&[]);
    let mut c = env.conn();
    create_for_app(&env, &mut c, "mig");
    let mut pg = env.db.client_as(MODULE_ROLE);
    assert_eq!(
        function_state(&mut pg),
        (None, true),
        "a fresh database has v3"
    );

    // The database as an earlier version of the module left it.
    pg.batch_execute(V1).unwrap();
    assert!(function_state(&mut pg).0.is_some());
    drop(c);
    env.vk = start_with(&env.db.url_as(MODULE_ROLE), &[]);
    let mut c = env.conn();
    assert!(
        wait_until(Duration::from_secs(20), || info_field(
            &mut c,
            "catalog_loaded"
        )
        .as_deref()
            == Ok("1")),
        "catalog never loaded:\n{}",
        env.vk.log()
    );
    assert_eq!(
        function_state(&mut pg),
        (None, true),
        "the start did not replace the v1 trigger function"
    );
    // The set's triggers run the new body: an outside row still reaches the filter.
    env.db
        .client_as(APP_ROLE)
        .batch_execute("INSERT INTO member_mig (entity_id) VALUES ('outside')")
        .unwrap();
    assert!(becomes_member(&mut c, "mig", "outside"), "{}", env.vk.log());
    // The 1 may have come from the database while the start's build ran; the filter holds the
    // row once a sync pass has read it from the log (the build's snapshot may predate it).
    assert!(
        wait_until(Duration::from_secs(10), || explain(
            &mut c, "mig", "outside"
        )
        .1 != "bloom-negative"),
        "the outside row never reached the filter: {}",
        env.vk.log()
    );
}

#[test]
fn a_writers_search_path_does_not_reach_into_the_trigger() {
    let env = Env::least_privilege(&[]);
    let mut c = env.conn();
    create_for_app(&env, &mut c, "sp");
    env.db
        .client()
        .batch_execute(&format!("CREATE SCHEMA evil AUTHORIZATION {APP_ROLE}"))
        .unwrap();
    // The writer's own operators for every comparison the trigger body makes, recording
    // whose rights they ran with.
    let mut app = env.db.client_as(APP_ROLE);
    app.batch_execute(
        "CREATE TABLE evil.seen (who text);
         GRANT INSERT ON evil.seen TO PUBLIC;
         GRANT USAGE ON SCHEMA evil TO PUBLIC;
         CREATE FUNCTION evil.eq_si(smallint, integer) RETURNS boolean LANGUAGE plpgsql AS
           $f$ BEGIN INSERT INTO evil.seen VALUES (current_user);
                     RETURN $1::int OPERATOR(pg_catalog.=) $2; END $f$;
         CREATE OPERATOR evil.= (LEFTARG = smallint, RIGHTARG = integer, FUNCTION = evil.eq_si);
         CREATE FUNCTION evil.eq_tt(text, text) RETURNS boolean LANGUAGE plpgsql AS
           $f$ BEGIN INSERT INTO evil.seen VALUES (current_user);
                     RETURN $1 OPERATOR(pg_catalog.=) $2; END $f$;
         CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eq_tt);
         CREATE FUNCTION evil.gt_ii(integer, integer) RETURNS boolean LANGUAGE plpgsql AS
           $f$ BEGIN INSERT INTO evil.seen VALUES (current_user);
                     RETURN $1 OPERATOR(pg_catalog.>) $2; END $f$;
         CREATE OPERATOR evil.> (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.gt_ii);",
    )
    .unwrap();
    app.batch_execute(
        "SET search_path = evil, pg_catalog, public;
         INSERT INTO public.member_sp (entity_id) VALUES ('outside');
         RESET search_path",
    )
    .unwrap();
    let as_module: i64 = app
        .query_one(
            "SELECT count(*) FROM evil.seen WHERE who = $1",
            &[&MODULE_ROLE],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        as_module, 0,
        "the writer's operator ran with the module's rights inside the trigger"
    );
    assert!(becomes_member(&mut c, "sp", "outside"), "{}", env.vk.log());
}

/// The slots logged for `item` of `set`, oldest first (`None`: logged without one).
fn logged_slots(pg: &mut postgres::Client, set: &str, item: &str) -> Vec<Option<i16>> {
    pg.query(
        "SELECT slot FROM member_changes WHERE set_name = $1 AND entity_id = $2 ORDER BY seq",
        &[&set, &item],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// How many arguments each of the set table's change-log triggers passes.
fn trigger_args(pg: &mut postgres::Client, set: &str) -> Vec<i16> {
    pg.query(
        "SELECT tgnargs FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname LIKE 'member_log_%'
          ORDER BY tgname",
        &[&format!("member_{set}")],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Makes set `ls`'s change-log trigger `name` (on `event`) again as an earlier version made
/// it: one argument, logging no slot.
fn one_argument_trigger(pg: &mut postgres::Client, name: &str, event: &str) {
    pg.batch_execute(&format!(
        "DROP TRIGGER {name} ON member_ls;
         CREATE TRIGGER {name} AFTER {event} ON member_ls REFERENCING NEW TABLE AS new_rows
           FOR EACH STATEMENT EXECUTE FUNCTION member_log_change('ls');"
    ))
    .unwrap();
}

#[test]
fn rows_are_logged_with_their_slot_and_a_table_without_one_still_feeds_the_log() {
    let env = Env::least_privilege(&[]);
    let mut c = env.conn();
    create_for_app(&env, &mut c, "ls");
    let mut pg = env.db.client_as(MODULE_ROLE);
    let mut app = env.db.client_as(APP_ROLE);
    let slot_of = |pg: &mut postgres::Client, item: &str| -> i16 {
        pg.query_one("SELECT member_keyslot($1)", &[&item])
            .unwrap()
            .get(0)
    };
    assert_eq!(trigger_args(&mut pg, "ls"), vec![2, 2, 2]);
    app.batch_execute("INSERT INTO member_ls (entity_id) VALUES ('a')")
        .unwrap();
    let a = slot_of(&mut pg, "a");
    assert_eq!(logged_slots(&mut pg, "ls", "a"), vec![Some(a)]);

    // The table as an earlier version left it: no slot column, triggers with one argument.
    pg.batch_execute("ALTER TABLE member_ls DROP COLUMN slot")
        .unwrap();
    one_argument_trigger(&mut pg, "member_log_ins", "INSERT");
    // Outside writes still succeed and reach the filter, logged without a slot.
    app.batch_execute("INSERT INTO member_ls (entity_id) VALUES ('b')")
        .unwrap();
    assert_eq!(logged_slots(&mut pg, "ls", "b"), vec![None]);
    assert!(becomes_member(&mut c, "ls", "b"), "{}", env.vk.log());

    // The next rebuild gives the table its column back and the triggers their argument.
    int(&mut c, &["MEMBER.REBUILD", "ls", "SYNC"]);
    assert_eq!(trigger_args(&mut pg, "ls"), vec![2, 2, 2]);
    app.batch_execute("INSERT INTO member_ls (entity_id) VALUES ('c')")
        .unwrap();
    let c_slot = slot_of(&mut pg, "c");
    assert_eq!(logged_slots(&mut pg, "ls", "c"), vec![Some(c_slot)]);
    assert!(becomes_member(&mut c, "ls", "c"), "{}", env.vk.log());
    // A delete is logged with its slot too.
    pg.batch_execute("DELETE FROM member_ls WHERE entity_id = 'c'")
        .unwrap();
    assert_eq!(
        logged_slots(&mut pg, "ls", "c"),
        vec![Some(c_slot), Some(c_slot)]
    );

    // The column there but a trigger from before it: a CREATE of the set (which runs its DDL
    // again) leaves the trigger alone, so it cannot race a rebuild's remaking of it; the
    // rebuild remakes it under the column's lock.
    one_argument_trigger(&mut pg, "member_log_upd", "UPDATE");
    ok(&mut c, &["MEMBER.CREATE", "ls"]);
    assert_eq!(trigger_args(&mut pg, "ls"), vec![2, 2, 1]);
    int(&mut c, &["MEMBER.REBUILD", "ls", "SYNC"]);
    assert_eq!(trigger_args(&mut pg, "ls"), vec![2, 2, 2]);
}
