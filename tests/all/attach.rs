//! Attached sets (docs/attach.md): membership served from a table the application owns,
//! `MEMBER.CREATE … SOURCE <schema>.<table> COLUMN <col> (SYNC log | UPDATED-COLUMN <col>)`.
//! The module runs as the least-privilege role; the tables belong to the application role and
//! are granted to it as each test says. One server for the file; each test has its own schema.
use crate::support;

use std::sync::OnceLock;
use std::time::Duration;

use redis::Connection;
use support::member::*;
use support::source::{app_schema, app_sql, count, quote, users};
use support::{wait_until, Valkey};

/// Long enough for a sync pass on a busy machine (the interval is 1 s).
const SYNCED: Duration = Duration::from_secs(20);

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    // The operator allows every table (docs/attach.md): these tests are about the checks.
    ENV.get_or_init(|| Env::least_privilege(&[("member.attach-allow", "*.*")]))
}

fn conn() -> Connection {
    env().conn()
}

/// Nothing of `set` exists: no catalog row, no filter, and the node does not know it.
fn assert_nothing_created(c: &mut Connection, set: &str) {
    let rows: i64 = env()
        .pg()
        .query_one(
            "SELECT count(*) FROM member_catalog WHERE name = $1",
            &[&set],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "{set}: a catalog row was created");
    let key = format!("member:{set}:bloom");
    assert_eq!(int(c, &["EXISTS", &key]), 0, "{set}: a filter was created");
    let e = err(c, &["MEMBER.INFO", set]);
    assert!(e.contains("no such set"), "{set}: {e}");
}

/// `args` must fail with an error containing `want`, and leave nothing of `set` behind.
fn refused(c: &mut Connection, set: &str, args: &[&str], want: &str) {
    let mut all = vec!["MEMBER.CREATE", set];
    all.extend_from_slice(args);
    let e = err(c, &all);
    assert!(e.contains(want), "{args:?}: got {e:?}, want {want:?}");
    assert_nothing_created(c, set);
}

/// Polls EXISTS until it answers 1.
fn eventually_member(c: &mut Connection, set: &str, item: &str, scope: Option<&str>) {
    let mut args = vec!["MEMBER.EXISTS", set, item];
    if let Some(s) = scope {
        args.extend(["SCOPE", s]);
    }
    assert!(
        wait_until(SYNCED, || int(c, &args) == 1),
        "{args:?} never answered 1"
    );
}

#[test]
fn bad_input_is_refused_and_creates_nothing() {
    let e = env();
    let c = &mut conn();
    users(&e.db, "bad", false);
    app_sql(
        &e.db,
        "CREATE TABLE bad.secret (name text PRIMARY KEY);
         CREATE TABLE bad.plain (name text PRIMARY KEY, at timestamptz, n int);
         GRANT SELECT ON bad.plain TO member_mod;
         CREATE VIEW bad.v AS SELECT username FROM bad.users;
         GRANT SELECT ON bad.v TO member_mod",
    );
    let src = ["SOURCE", "bad.users", "COLUMN", "username"];
    let with = |more: &[&'static str]| -> Vec<&'static str> {
        let mut v = src.to_vec();
        v.extend_from_slice(more);
        v
    };
    // From the arguments alone.
    refused(c, "a1", &src, "needs a sync mode");
    refused(c, "a1", &src, "UPDATED-COLUMN");
    refused(
        c,
        "a1",
        &with(&["SYNC", "log", "UPDATED-COLUMN", "updated_at"]),
        "exclude each other",
    );
    refused(c, "a1", &with(&["SYNC", "poll"]), "SYNC must be log");
    refused(
        c,
        "a1",
        &["COLUMN", "username", "SYNC", "log"],
        "give SOURCE",
    );
    refused(
        c,
        "a1",
        &["SOURCE", "users", "COLUMN", "username", "SYNC", "log"],
        "<schema>.<table>",
    );
    refused(
        c,
        "a1",
        &["SOURCE", "bad.users", "SYNC", "log"],
        "needs COLUMN",
    );
    let upd = ["UPDATED-COLUMN", "updated_at"];
    refused(
        c,
        "a1",
        &with(&[&upd[..], &["NORMALIZE", "username"]].concat()),
        "no SQL form",
    );
    // Against the database's catalog.
    let upd_on = |t: &'static str, col: &'static str| {
        vec!["SOURCE", t, "COLUMN", col, "UPDATED-COLUMN", "updated_at"]
    };
    refused(c, "a2", &upd_on("bad.nosuch", "username"), "does not exist");
    refused(
        c,
        "a2",
        &upd_on("nosuch.users", "username"),
        "does not exist",
    );
    refused(c, "a2", &upd_on("bad.Users", "username"), "does not exist");
    refused(
        c,
        "a2",
        &upd_on("bad.users", "nick"),
        "COLUMN \"nick\" does not exist",
    );
    refused(c, "a2", &upd_on("bad.users", "id"), "is of type bigint");
    refused(
        c,
        "a2",
        &upd_on("bad.users", "created_at"),
        "is of type timestamp with time zone",
    );
    refused(c, "a2", &upd_on("bad.users", "email"), "has no usable key");
    refused(c, "a2", &upd_on("bad.v", "username"), "is not a table");
    refused(
        c,
        "a2",
        &[
            "SOURCE",
            "bad.users",
            "COLUMN",
            "username",
            "UPDATED-COLUMN",
            "email",
        ],
        "UPDATED-COLUMN \"email\" is of type text",
    );
    refused(
        c,
        "a2",
        &[
            "SOURCE",
            "bad.users",
            "COLUMN",
            "username",
            "SCOPE-COLUMN",
            "email",
            "SYNC",
            "log",
        ],
        "has no usable key",
    );
    refused(
        c,
        "a2",
        &["SOURCE", "bad.secret", "COLUMN", "name", "SYNC", "log"],
        "lacks SELECT",
    );
    // SELECT granted, TRIGGER not: SYNC log is refused, naming the alternative.
    refused(
        c,
        "a2",
        &with(&["SYNC", "log"]),
        "must own it or hold TRIGGER",
    );
    refused(
        c,
        "a2",
        &[
            "SOURCE",
            "bad.plain",
            "COLUMN",
            "name",
            "UPDATED-COLUMN",
            "at",
            "NORMALIZE",
            "lower",
        ],
        "NORMALIZE lower needs an index on lower",
    );
    // The same table with a lower(name) index, or without NORMALIZE, is fine.
    ok(
        c,
        &[
            "MEMBER.CREATE",
            "a3",
            "SOURCE",
            "bad.plain",
            "COLUMN",
            "name",
            "UPDATED-COLUMN",
            "at",
        ],
    );
    assert_eq!(
        set_info(c, "a3", "sync_mode").as_deref(),
        Ok("updated-column")
    );
    // An existing set is not attached by a second CREATE, nor re-attached elsewhere.
    ok(c, &["MEMBER.CREATE", "own"]);
    let e2 = err(
        c,
        &[
            "MEMBER.CREATE",
            "own",
            "SOURCE",
            "bad.plain",
            "COLUMN",
            "name",
            "UPDATED-COLUMN",
            "at",
        ],
    );
    assert!(e2.contains("different settings"), "{e2}");
    let e3 = err(
        c,
        &[
            "MEMBER.CREATE",
            "a3",
            "SOURCE",
            "bad.users",
            "COLUMN",
            "username",
            "UPDATED-COLUMN",
            "updated_at",
        ],
    );
    assert!(e3.contains("different settings"), "{e3}");
    ok(c, &["MEMBER.CREATE", "a3"]);
}

/// Seed 000's sign-up flow against a table the application owns, in one sync mode.
fn signup(schema: &str, set: &str, sync: &[&str]) {
    let e = env();
    let c = &mut conn();
    let other = &mut conn();
    users(&e.db, schema, sync == ["SYNC", "log"]);
    let table = format!("{schema}.users");
    app_sql(
        &e.db,
        &format!("INSERT INTO {table} (username) VALUES ('zoe'), ('yann')"),
    );
    let mut create = vec!["MEMBER.CREATE", set, "SOURCE", &table, "COLUMN", "username"];
    create.extend_from_slice(sync);
    ok(c, &create);
    assert_fields(
        c,
        set,
        &[
            ("source", &table),
            ("source_column", "username"),
            ("source_scope_column", ""),
        ],
    );
    // Built from the rows already there.
    assert_eq!(int(other, &["MEMBER.EXISTS", set, "zoe"]), 1);
    assert_eq!(explain(other, set, "nobody"), (0, "bloom-negative".into()));
    // The application commits its row, then tells the module.
    app_sql(
        &e.db,
        &format!("INSERT INTO {table} (username) VALUES ('alice')"),
    );
    assert_eq!(int(c, &["MEMBER.ADD", set, "alice"]), 1);
    assert_eq!(int(other, &["MEMBER.EXISTS", set, "alice"]), 1);
    let e1 = err(c, &["MEMBER.ADD", set, "alice", "TTL", "60"]);
    assert!(e1.contains("cannot be used on an attached set"), "{e1}");
    // ADD of a name without a row: 0, and nothing is inserted.
    let before = count(&e.db, &table);
    assert_eq!(int(c, &["MEMBER.ADD", set, "bob"]), 0);
    assert_eq!(
        count(&e.db, &table),
        before,
        "ADD wrote to the source table"
    );
    assert_eq!(int(other, &["MEMBER.EXISTS", set, "bob"]), 0);
    // A row written without ADD reaches the filter by the set's sync.
    app_sql(
        &e.db,
        &format!("INSERT INTO {table} (username) VALUES ('carol')"),
    );
    eventually_member(other, set, "carol", None);
    // DEL never deletes: it drops the cached answer and removed nothing.
    assert_eq!(int(c, &["MEMBER.DEL", set, "alice"]), 0);
    assert_eq!(count(&e.db, &table), before + 1);
    assert_eq!(int(other, &["MEMBER.EXISTS", set, "alice"]), 1);
    // The application deletes a row: answered 0 once no cached answer says otherwise.
    app_sql(
        &e.db,
        &format!("DELETE FROM {table} WHERE username = 'yann'"),
    );
    assert_eq!(int(c, &["MEMBER.DEL", set, "yann"]), 0);
    assert_eq!(int(other, &["MEMBER.EXISTS", set, "yann"]), 0);
    // REBUILD reads the source.
    assert_eq!(int(c, &["MEMBER.REBUILD", set, "SYNC"]), before + 1 - 1);
    for name in ["zoe", "alice", "carol"] {
        assert_eq!(int(other, &["MEMBER.EXISTS", set, name]), 1, "{name}");
    }
    assert_eq!(explain(other, set, "yann").0, 0);
}

#[test]
fn signup_flow_with_the_change_log() {
    signup("slog", "users_log", &["SYNC", "log"]);
    let c = &mut conn();
    assert_fields(
        c,
        "users_log",
        &[("sync_mode", "log"), ("sync_horizon", "visible")],
    );
}

#[test]
fn signup_flow_with_an_updated_column() {
    signup("supd", "users_upd", &["UPDATED-COLUMN", "updated_at"]);
    let c = &mut conn();
    assert_fields(
        c,
        "users_upd",
        &[
            ("sync_mode", "updated-column"),
            ("source_updated_column", "updated_at"),
        ],
    );
}

/// Each `(field, value)` is what MEMBER.INFO `set` shows.
fn assert_fields(c: &mut Connection, set: &str, want: &[(&str, &str)]) {
    for &(field, value) in want {
        assert_eq!(
            set_info(c, set, field).as_deref(),
            Ok(value),
            "MEMBER.INFO {set} {field}"
        );
    }
}

#[test]
fn normalize_lower_matches_lowercased_rows() {
    let e = env();
    let c = &mut conn();
    users(&e.db, "low", false);
    app_sql(&e.db, "INSERT INTO low.users (username) VALUES ('Alice')");
    ok(
        c,
        &[
            "MEMBER.CREATE",
            "low",
            "SOURCE",
            "low.users",
            "COLUMN",
            "username",
            "NORMALIZE",
            "lower",
            "UPDATED-COLUMN",
            "updated_at",
        ],
    );
    assert_eq!(int(c, &["MEMBER.EXISTS", "low", "ALICE"]), 1);
    assert_eq!(int(c, &["MEMBER.EXISTS", "low", " alice "]), 1);
    app_sql(&e.db, "INSERT INTO low.users (username) VALUES ('BoB')");
    assert_eq!(int(c, &["MEMBER.ADD", "low", "bob"]), 1);
    assert_eq!(int(c, &["MEMBER.EXISTS", "low", "BOB"]), 1);
    assert_eq!(int(c, &["MEMBER.ADD", "low", "carl"]), 0);
}

/// Names no generated statement may take for SQL: quotes, a semicolon, spaces, mixed case.
#[test]
fn hostile_identifiers_are_quoted_everywhere() {
    let e = env();
    let c = &mut conn();
    let schema = "we\"ird; DROP TABLE x --";
    let (t, col, scope) = ("Users", "user name", "Org'); DROP TABLE y; --");
    app_schema(
        &e.db,
        schema,
        &format!(
            "CREATE TABLE {s}.{t} ({col} text NOT NULL, {scope} text NOT NULL, ts timestamptz
               DEFAULT now(), PRIMARY KEY ({scope}, {col}));
             CREATE TABLE {s}.x (a int); CREATE TABLE {s}.y (a int);
             GRANT SELECT, TRIGGER ON {s}.{t} TO member_mod;
             INSERT INTO {s}.{t} VALUES ('Ann', 'acme')",
            s = quote(schema),
            t = quote(t),
            col = quote(col),
            scope = quote(scope)
        ),
    );
    let source = format!("{schema}.{t}");
    // Exact names only: another case is another table.
    let lower = format!("{schema}.users");
    refused(
        c,
        "hostile",
        &[
            "SOURCE",
            &lower,
            "COLUMN",
            col,
            "SCOPE-COLUMN",
            scope,
            "SYNC",
            "log",
        ],
        "does not exist",
    );
    ok(
        c,
        &[
            "MEMBER.CREATE",
            "hostile",
            "SOURCE",
            &source,
            "COLUMN",
            col,
            "SCOPE-COLUMN",
            scope,
            "SYNC",
            "log",
        ],
    );
    let q = |x: &str| format!("{}.{}", quote(schema), quote(x));
    assert_eq!(count(&e.db, &q("x")), 0, "table x still there");
    assert_eq!(
        int(c, &["MEMBER.EXISTS", "hostile", "Ann", "SCOPE", "acme"]),
        1
    );
    assert_eq!(
        int(c, &["MEMBER.EXISTS", "hostile", "Ann", "SCOPE", "other"]),
        0
    );
    assert_eq!(
        int(c, &["MEMBER.EXISTS", "hostile", "ann", "SCOPE", "acme"]),
        0
    );
    app_sql(
        &e.db,
        &format!("INSERT INTO {} VALUES ('Bo', 'acme'), ('Cy', 'beta')", q(t)),
    );
    assert_eq!(int(c, &["MEMBER.ADD", "hostile", "Bo", "SCOPE", "acme"]), 1);
    assert_eq!(int(c, &["MEMBER.ADD", "hostile", "Bo", "SCOPE", "beta"]), 0);
    eventually_member(c, "hostile", "Cy", Some("beta"));
    assert_eq!(int(c, &["MEMBER.REBUILD", "hostile", "SYNC"]), 3);
    assert_fields(
        c,
        "hostile",
        &[("source_scope_column", scope), ("sync_horizon", "visible")],
    );
    // Both decoy tables survived every statement. DROP leaves the source's rows, and (not
    // being its owner) its triggers too, saying so in the log.
    assert_eq!(count(&e.db, &q("y")), 0);
    ok(c, &["MEMBER.DROP", "hostile", "DELETE-DATA"]);
    let log = e.vk.log();
    let said = log
        .lines()
        .rev()
        .find_map(|l| l.split("(only the table's owner may drop them): ").nth(1))
        .expect("the log names the DROP TRIGGER statements")
        .to_string();
    assert!(log.contains("its change-log triggers stay on"));
    let triggers = || -> i64 {
        e.pg()
            .query_one(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass($1)",
                &[&q(t)],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(triggers(), 3);
    assert_eq!(count(&e.db, &q(t)), 3, "DROP touched the source's rows");
    // What the log says to run runs as it is, for the table's owner, and removes them all.
    app_sql(&e.db, &said);
    assert_eq!(triggers(), 0, "after {said}");
    assert_eq!(count(&e.db, &q("x")), 0, "table x still there");
}

#[test]
fn a_replica_learns_an_attached_set() {
    let e = env();
    let c = &mut conn();
    users(&e.db, "rep", false);
    app_sql(&e.db, "INSERT INTO rep.users (username) VALUES ('ann')");
    ok(
        c,
        &[
            "MEMBER.CREATE",
            "rep",
            "SOURCE",
            "rep.users",
            "COLUMN",
            "username",
            "UPDATED-COLUMN",
            "updated_at",
        ],
    );
    let replica = Valkey::start(&[("member.pg-url", &e.db.url_as(support::MODULE_ROLE))]);
    let r = &mut replica.conn();
    ok(r, &["REPLICAOF", "127.0.0.1", &e.vk.port().to_string()]);
    assert!(
        wait_until(SYNCED, || set_info(r, "rep", "source").as_deref()
            == Ok("rep.users")),
        "the replica never learned the set:\n{}",
        replica.log()
    );
    app_sql(&e.db, "INSERT INTO rep.users (username) VALUES ('ben')");
    assert_eq!(int(c, &["MEMBER.ADD", "rep", "ben"]), 1);
    assert!(wait_until(SYNCED, || {
        int(r, &["MEMBER.EXISTS", "rep", "ben"]) == 1
            && int(r, &["MEMBER.EXISTS", "rep", "ann"]) == 1
    }));
    assert_eq!(
        set_info(r, "rep", "sync_mode").as_deref(),
        Ok("updated-column")
    );
    assert_eq!(int(r, &["MEMBER.EXISTS", "rep", "cyd"]), 0);
}

/// A catalog made by a version without attached sets gains their columns when the module
/// starts, and its sets keep working beside a new attached one.
#[test]
fn a_catalog_from_before_attached_sets_keeps_working() {
    let db = support::fresh_db();
    db.client()
        .batch_execute(
            "CREATE TABLE member_catalog (name text PRIMARY KEY,
                error_rate double precision NOT NULL, capacity bigint NOT NULL,
                cache_ttl integer NOT NULL, recent_ttl integer NOT NULL, normalize text NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                tokenize text NOT NULL DEFAULT 'none', token_key_fp text);
             INSERT INTO member_catalog (name, error_rate, capacity, cache_ttl, recent_ttl,
                                         normalize) VALUES ('old', 0.01, 1000, 300, 10, 'none');
             CREATE TABLE public.names (name text PRIMARY KEY,
                                        at timestamptz NOT NULL DEFAULT now());
             INSERT INTO public.names (name) VALUES ('ann')",
        )
        .unwrap();
    let vk = start_loaded(&db.url(), &[("member.attach-allow", "public.names")]);
    let c = &mut vk.conn();
    assert_eq!(set_info(c, "old", "table").as_deref(), Ok("member_old"));
    assert_eq!(set_info(c, "old", "sync_mode").as_deref(), Ok("log"));
    ok(c, &["MEMBER.CREATE", "old"]);
    assert_eq!(int(c, &["MEMBER.ADD", "old", "x"]), 1);
    ok(
        c,
        &[
            "MEMBER.CREATE",
            "names",
            "SOURCE",
            "public.names",
            "COLUMN",
            "name",
            "UPDATED-COLUMN",
            "at",
        ],
    );
    assert_eq!(int(c, &["MEMBER.EXISTS", "names", "ann"]), 1);
    let cols: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM information_schema.columns
              WHERE table_name = 'member_catalog' AND column_name LIKE 'source\\_%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(cols, 6);
}
