//! Tables an application owns, for attached sets (docs/attach.md): made the way an application
//! makes them, by [`APP_ROLE`] in a schema of its own, with only the grants a test asks for.

use super::{TestDb, APP_ROLE, MODULE_ROLE};

/// Creates schema `schema` owned by [`APP_ROLE`] (as the superuser), lets the module's role
/// use it, then runs `ddl` as [`APP_ROLE`].
pub fn app_schema(db: &TestDb, schema: &str, ddl: &str) {
    let q = quote(schema);
    db.client()
        .batch_execute(&format!(
            "CREATE SCHEMA {q} AUTHORIZATION {APP_ROLE}; GRANT USAGE ON SCHEMA {q} TO {MODULE_ROLE}"
        ))
        .unwrap_or_else(|e| panic!("schema {schema}: {e}"));
    if !ddl.is_empty() {
        app_sql(db, ddl);
    }
}

/// Runs `sql` as [`APP_ROLE`].
pub fn app_sql(db: &TestDb, sql: &str) {
    db.client_as(APP_ROLE)
        .batch_execute(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The usual sign-up table `users` in `schema`, owned by the application, readable by the
/// module (and, with `trigger`, open to its change-log triggers).
pub fn users(db: &TestDb, schema: &str, trigger: bool) {
    let q = quote(schema);
    let grant = if trigger { "SELECT, TRIGGER" } else { "SELECT" };
    app_schema(
        db,
        schema,
        &format!(
            "CREATE TABLE {q}.users (
                id bigserial PRIMARY KEY,
                username text UNIQUE NOT NULL,
                email text,
                created_at timestamptz NOT NULL DEFAULT now(),
                updated_at timestamptz NOT NULL DEFAULT now()
             );
             CREATE UNIQUE INDEX ON {q}.users (lower(username));
             GRANT {grant} ON {q}.users TO {MODULE_ROLE}"
        ),
    );
}

/// Counts the rows of `table` (a quoted, qualified name), as the superuser.
pub fn count(db: &TestDb, table: &str) -> i64 {
    db.client()
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .unwrap()
        .get(0)
}

/// `s` as a quoted SQL identifier.
pub fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}
