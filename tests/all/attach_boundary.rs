//! The boundary of attached sets (docs/attach.md, issue 24): which tables may be attached
//! (`member.attach-allow`, never the module's own relations), and names: no set name reaches
//! the triggers of another set or of the module, before or after its DROP.
use crate::support;

use std::time::Duration;

use redis::Connection;
use support::member::*;
use support::source::{app_schema, app_sql};
use support::wait_until;

/// Long enough for a sync pass (and a rebuild) on a busy machine (the interval is 1 s).
const SYNCED: Duration = Duration::from_secs(30);

const NOT_ALLOWED: &str = "not allowed by member.attach-allow";
const MODULE_OWN: &str = "one of the module's own relations";

/// Polls EXISTS until it answers 1.
fn eventually_member(c: &mut Connection, set: &str, item: &str) {
    assert!(
        wait_until(SYNCED, || int(c, &["MEMBER.EXISTS", set, item]) == 1),
        "MEMBER.EXISTS {set} {item} never answered 1: {:?}",
        explain(c, set, item)
    );
}

/// No catalog row of `set`, and the node does not know it.
fn assert_nothing_created(env: &Env, c: &mut Connection, set: &str) {
    let rows: i64 = env
        .pg()
        .query_one(
            "SELECT count(*) FROM member_catalog WHERE name = $1",
            &[&set],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "{set}: a catalog row was created");
    assert!(err(c, &["MEMBER.INFO", set]).contains("no such set"));
}

/// `(name, function, first argument)` of the triggers on `table` (a qualified name).
fn triggers(env: &Env, table: &str) -> Vec<(String, String, String)> {
    env.pg()
        .query(
            "SELECT g.tgname::text, p.proname::text,
                    split_part(encode(g.tgargs, 'escape'), '\\000', 1)
               FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid
              WHERE g.tgrelid = $1::text::regclass AND NOT g.tgisinternal
              ORDER BY 1",
            &[&table],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// An application table keyed like a set table, open to the module's triggers (with
/// `owned`, the module's role owns it, so it may also drop them).
fn app_table(env: &Env, schema: &str, owned: bool) {
    app_schema(
        &env.db,
        schema,
        &format!(
            "CREATE TABLE {schema}.t (entity_id text NOT NULL, scope text NOT NULL DEFAULT '',
                                      PRIMARY KEY (entity_id, scope));
             GRANT SELECT, TRIGGER ON {schema}.t TO member_mod"
        ),
    );
    if owned {
        env.pg()
            .batch_execute(&format!("ALTER TABLE {schema}.t OWNER TO member_mod"))
            .unwrap();
    }
}

#[test]
fn attaching_is_refused_until_the_operator_allows_the_table() {
    let env = Env::least_privilege(&[]);
    let c = &mut conn_of(&env);
    app_table(&env, "app", false);
    app_table(&env, "other", false);
    let create = |set: &'static str, table: &'static str| {
        vec![
            "MEMBER.CREATE",
            set,
            "SOURCE",
            table,
            "COLUMN",
            "entity_id",
            "SCOPE-COLUMN",
            "scope",
            "SYNC",
            "log",
        ]
    };
    assert_eq!(
        cmd(c, &["CONFIG", "GET", "member.attach-allow"]).unwrap(),
        redis::Value::Array(vec![
            redis::Value::BulkString(b"member.attach-allow".to_vec()),
            redis::Value::BulkString(vec![]),
        ])
    );
    // Empty by default: nothing may be attached, and nothing is created.
    let e = err(c, &create("a", "app.t"));
    assert!(e.contains(NOT_ALLOWED), "{e}");
    assert_nothing_created(&env, c, "a");
    // The operator allows one table (and a pattern): only those.
    ok(
        c,
        &["CONFIG", "SET", "member.attach-allow", "app.t, nothing.*"],
    );
    ok(c, &create("a", "app.t"));
    let e = err(c, &create("o", "other.t"));
    assert!(e.contains(NOT_ALLOWED), "{e}");
    assert_nothing_created(&env, c, "o");
    ok(c, &["CONFIG", "SET", "member.attach-allow", "app.t oth*.*"]);
    ok(c, &create("o", "other.t"));
    // Malformed values and control bytes are refused, and the list stays.
    for bad in ["app", "app.", ".t", "app.t\0x", "app.t\nother.t"] {
        let e = err(c, &["CONFIG", "SET", "member.attach-allow", bad]);
        assert!(e.contains("member.attach-allow must be"), "{bad:?}: {e}");
    }
    // A set attached while allowed keeps serving once its table is no longer listed; a new
    // CREATE of it is refused.
    ok(c, &["CONFIG", "SET", "member.attach-allow", ""]);
    app_sql(&env.db, "INSERT INTO app.t (entity_id) VALUES ('late')");
    eventually_member(c, "a", "late");
    let e = err(c, &create("a", "app.t"));
    assert!(e.contains(NOT_ALLOWED), "{e}");
}

#[test]
fn allowed_from_the_command_line() {
    let env = Env::least_privilege(&[("member.attach-allow", "app.*")]);
    let c = &mut conn_of(&env);
    app_table(&env, "app", false);
    ok(
        c,
        &[
            "MEMBER.CREATE",
            "a",
            "SOURCE",
            "app.t",
            "COLUMN",
            "entity_id",
            "SCOPE-COLUMN",
            "scope",
            "SYNC",
            "log",
        ],
    );
}

#[test]
fn the_modules_own_relations_are_never_attached() {
    let env = Env::least_privilege(&[("member.attach-allow", "*.*")]);
    let c = &mut conn_of(&env);
    ok(c, &["MEMBER.CREATE", "b"]);
    let schema: String = env
        .pg()
        .query_one(
            "SELECT schemaname::text FROM pg_tables WHERE tablename = 'member_catalog'",
            &[],
        )
        .unwrap()
        .get(0);
    for (set, table, column) in [
        ("log", "member_b", "entity_id"),
        ("cat", "member_catalog", "name"),
        ("chg", "member_changes", "entity_id"),
        ("flo", "member_changes_floor", "floor"),
    ] {
        let source = format!("{schema}.{table}");
        for sync in [&["SYNC", "log"][..], &["UPDATED-COLUMN", "updated_at"]] {
            let mut args = vec!["MEMBER.CREATE", set, "SOURCE", &source, "COLUMN", column];
            args.extend_from_slice(sync);
            let e = err(c, &args);
            assert!(e.contains(MODULE_OWN), "{args:?}: {e}");
            assert_nothing_created(&env, c, set);
        }
    }
    // A set's table stays the module's by its catalog row, even without its triggers.
    env.pg()
        .batch_execute("ALTER TABLE member_b DISABLE TRIGGER USER")
        .unwrap();
    let source = format!("{schema}.member_b");
    let e = err(
        c,
        &[
            "MEMBER.CREATE",
            "log",
            "SOURCE",
            &source,
            "COLUMN",
            "entity_id",
            "SYNC",
            "log",
        ],
    );
    assert!(e.contains(MODULE_OWN), "{e}");
    assert_nothing_created(&env, c, "log");
    // An application's own table named `member_…` beside the module's is not reserved by its
    // name: the operator allowed it, it attaches.
    env.pg()
        .batch_execute(&format!(
            "CREATE TABLE {schema}.member_accounts (login text PRIMARY KEY);
             GRANT SELECT, TRIGGER ON {schema}.member_accounts TO member_mod;
             INSERT INTO {schema}.member_accounts VALUES ('ann')"
        ))
        .unwrap();
    let source = format!("{schema}.member_accounts");
    ok(
        c,
        &[
            "MEMBER.CREATE",
            "accounts_app",
            "SOURCE",
            &source,
            "COLUMN",
            "login",
            "SYNC",
            "log",
        ],
    );
    eventually_member(c, "accounts_app", "ann");
}

/// Issue 24, item 1: a set named like the set tables' own triggers (`member_log_*`) once took
/// them from set `b` (attached to `member_b`), and its DROP deleted them.
#[test]
fn a_set_named_log_never_touches_another_sets_triggers() {
    let env = Env::least_privilege(&[("member.attach-allow", "*.*")]);
    let c = &mut conn_of(&env);
    let mut pg = env.pg();
    let outside = |pg: &mut postgres::Client, item: &str| {
        pg.execute("INSERT INTO member_b (entity_id) VALUES ($1)", &[&item])
            .unwrap();
    };
    ok(c, &["MEMBER.CREATE", "b"]);
    outside(&mut pg, "before");
    eventually_member(c, "b", "before");
    let own = triggers(&env, "member_b");
    // The hostile CREATE on b's table is refused; the same name attached elsewhere works.
    let e = err(
        c,
        &[
            "MEMBER.CREATE",
            "log",
            "SOURCE",
            "public.member_b",
            "COLUMN",
            "entity_id",
            "SCOPE-COLUMN",
            "scope",
            "SYNC",
            "log",
        ],
    );
    assert!(e.contains(MODULE_OWN), "{e}");
    app_table(&env, "app", true);
    ok(
        c,
        &[
            "MEMBER.CREATE",
            "log",
            "SOURCE",
            "app.t",
            "COLUMN",
            "entity_id",
            "SCOPE-COLUMN",
            "scope",
            "SYNC",
            "log",
        ],
    );
    let names: Vec<String> = triggers(&env, "app.t").into_iter().map(|t| t.0).collect();
    assert_eq!(
        names,
        ["member_log$del", "member_log$ins", "member_log$upd"]
    );
    assert_eq!(triggers(&env, "member_b"), own);
    outside(&mut pg, "after-create");
    eventually_member(c, "b", "after-create");
    pg.batch_execute("INSERT INTO app.t (entity_id) VALUES ('x')")
        .unwrap();
    eventually_member(c, "log", "x");
    ok(c, &["MEMBER.DROP", "log"]);
    assert_eq!(triggers(&env, "app.t"), []);
    assert_eq!(triggers(&env, "member_b"), own);
    outside(&mut pg, "after-drop");
    eventually_member(c, "b", "after-drop");
}

/// A database an earlier version left: an attached set's triggers under the old names
/// (`member_<set>_<op>`), an application trigger that only looks like one, and a set table
/// whose trigger of the right name another set took.
#[test]
fn triggers_left_by_an_earlier_version_are_renamed_or_replaced() {
    let env = Env::least_privilege(&[("member.attach-allow", "app.t")]);
    let c = &mut conn_of(&env);
    let mut pg = env.pg();
    app_table(&env, "app", false);
    let attach = |set: &'static str| {
        vec![
            "MEMBER.CREATE",
            set,
            "SOURCE",
            "app.t",
            "COLUMN",
            "entity_id",
            "SCOPE-COLUMN",
            "scope",
            "SYNC",
            "log",
        ]
    };
    ok(c, &attach("m"));
    for op in ["ins", "upd", "del"] {
        pg.batch_execute(&format!(
            "ALTER TRIGGER \"member_m${op}\" ON app.t RENAME TO member_m_{op}"
        ))
        .unwrap();
    }
    // The application's own trigger, named like the old name of set z's.
    app_sql(
        &env.db,
        "CREATE FUNCTION app.noop() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RETURN NULL; END $$;
         CREATE TRIGGER member_z_ins AFTER INSERT ON app.t
           FOR EACH STATEMENT EXECUTE FUNCTION app.noop()",
    );
    ok(c, &attach("z"));
    let want = |set: &str, op: &str| {
        (
            format!("member_{set}${op}"),
            "member_log_source".to_string(),
            set.to_string(),
        )
    };
    let mut expected = vec![
        want("m", "del"),
        want("m", "ins"),
        want("m", "upd"),
        want("z", "del"),
        want("z", "ins"),
        want("z", "upd"),
        ("member_z_ins".into(), "noop".into(), String::new()),
    ];
    expected.sort();
    // m no longer looks fed (its triggers' names are not the current ones): it is rebuilt,
    // which installs the new names. Its old ones stay while the module's role may not drop
    // them (not the table's owner); the application's trigger stays whatever its name.
    let with_old = {
        let mut v = expected.clone();
        v.extend(["del", "ins", "upd"].map(|op| {
            (
                format!("member_m_{op}"),
                "member_log_source".to_string(),
                "m".to_string(),
            )
        }));
        v.sort();
        v
    };
    let now = || triggers(&env, "app.t");
    assert!(wait_until(SYNCED, || now() == with_old), "{:?}", now());
    pg.batch_execute("ALTER TABLE app.t OWNER TO member_mod")
        .unwrap();
    // (Once the rebuild that installed the new names has ended.)
    let rebuild = &["MEMBER.REBUILD", "m", "SYNC"];
    assert!(wait_until(SYNCED, || cmd(c, rebuild).is_ok()));
    assert_eq!(now(), expected);
    pg.batch_execute("INSERT INTO app.t (entity_id) VALUES ('new')")
        .unwrap();
    eventually_member(c, "m", "new");
    ok(c, &["MEMBER.DROP", "z"]);
    assert!(triggers(&env, "app.t")
        .iter()
        .any(|t| t.0 == "member_z_ins"));
    // Set b's table, as the attack of issue 24 left it: its trigger member_log_ins runs the
    // attached-set function for set `log`. b must not believe it is fed: it is rebuilt,
    // which puts its own trigger back, and sees outside writes again.
    ok(c, &["MEMBER.CREATE", "b"]);
    pg.execute("INSERT INTO member_b (entity_id) VALUES ('pre')", &[])
        .unwrap();
    eventually_member(c, "b", "pre");
    // b's filter is trusted: an absent item is answered from it.
    assert!(wait_until(SYNCED, || explain(c, "b", "never").1 == "bloom-negative"));
    pg.batch_execute(
        "DROP TRIGGER member_log_ins ON member_b;
         CREATE TRIGGER member_log_ins AFTER INSERT ON member_b REFERENCING NEW TABLE AS new_rows
           FOR EACH STATEMENT EXECUTE FUNCTION member_log_source('log', 'entity_id', 'scope', 'none')",
    )
    .unwrap();
    pg.execute("INSERT INTO member_b (entity_id) VALUES ('outside')", &[])
        .unwrap();
    eventually_member(c, "b", "outside");
    assert!(wait_until(SYNCED, || triggers(&env, "member_b")
        .iter()
        .any(|t| t.0 == "member_log_ins" && t.1 == "member_log_change")));
}

fn conn_of(env: &Env) -> Connection {
    env.conn()
}
