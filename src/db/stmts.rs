//! The one path a worker's statements take (`Db::run` and its kin hand `Stmts` to every call):
//! prepared once on a direct connection, unnamed or written into one message behind a pooler,
//! and the transactions that carry the timeouts there (docs/pooler.md).

use std::collections::HashMap;
use std::fmt::Write as _;

use postgres::types::{ToSql, Type};
use postgres::{Client, Row, SimpleQueryMessage, SimpleQueryRow, Statement, Transaction};

use super::{begin_sql, Session};

/// How long the database may run a worker's statements, in ms (`statement_timeout`), from
/// the configuration when each call starts ([`Bounds::now`]), so that `CONFIG SET` reaches the
/// next statement of every connection (docs/operations.md, "Timeouts").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    /// A lookup's: its client waits `member.db-timeout-ms`, and a lookup writes nothing that
    /// must land after its client gave up.
    pub lookup_ms: u64,
    /// Every other statement's: a write its client gave up on still gets this long to land
    /// (an ADD that commits late still reaches the filter), then the server cancels it.
    pub other_ms: u64,
}

impl Bounds {
    /// The bounds for `member.db-timeout-ms` = `timeout_ms`. Pure.
    pub fn of(timeout_ms: u64) -> Bounds {
        Bounds {
            lookup_ms: timeout_ms.max(1),
            other_ms: timeout_ms.saturating_mul(4).max(1000),
        }
    }

    /// The bounds the configuration asks for now.
    pub fn now() -> Bounds {
        Bounds::of(crate::config::db_timeout_ms())
    }
}

/// Which of the [`Bounds`] a call's statements run under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Lookup,
    Other,
}

/// A worker's statements: how its connection holds them ([`Session`]) and, on a direct one,
/// those prepared so far. Every statement of the hot path goes through here, so the pooled
/// way is decided in one place; so are the statement timeouts.
#[derive(Default)]
pub struct Stmts {
    cache: HashMap<String, Statement>,
    pooled: bool,
    /// The current call's `statement_timeout`.
    call_ms: u64,
    /// A direct session's `statement_timeout` now: its startup option, then the last `SET`.
    session_ms: u64,
}

impl Stmts {
    /// The statements of a new connection in `session`, opened with `statement_timeout` =
    /// `session_ms` (a direct one; a pooled one carries each call's in its transactions).
    pub(super) fn new(session: Session, session_ms: u64) -> Stmts {
        Stmts {
            cache: HashMap::new(),
            pooled: session == Session::Pooled,
            call_ms: Bounds::now().other_ms,
            session_ms,
        }
    }

    /// Starts a call under `bound`, with the bounds the configuration gives now: on a direct
    /// session whose `statement_timeout` differs, one `SET` first (outside any transaction,
    /// so no rollback undoes it); a pooled one carries it in each transaction it opens.
    pub(super) fn start_call(
        &mut self,
        c: &mut Client,
        bound: Bound,
    ) -> Result<(), postgres::Error> {
        let bounds = Bounds::now();
        self.call_ms = match bound {
            Bound::Lookup => bounds.lookup_ms,
            Bound::Other => bounds.other_ms,
        };
        if !self.pooled && self.session_ms != self.call_ms {
            // Forgotten first: should the SET fail, the session's value is unknown.
            self.session_ms = 0;
            c.batch_execute(&format!("SET statement_timeout = {}", self.call_ms))?;
            self.session_ms = self.call_ms;
        }
        Ok(())
    }

    /// What opens a transaction of the current call behind a pooler ([`begin_sql`]).
    pub(super) fn opening(&self) -> String {
        begin_sql((self.call_ms, 0))
    }

    /// Whether the connection is a pooler's ([`Session::Pooled`]).
    pub fn pooled(&self) -> bool {
        self.pooled
    }

    /// Rows of `sql` with typed parameters: on a direct connection through a statement
    /// prepared once and kept; on a pooled one an unnamed statement, parsed, bound and run in
    /// one round trip, that nothing refers to afterwards.
    pub fn query(
        &mut self,
        c: &mut Client,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, postgres::Error> {
        if self.pooled {
            return c.query_typed(sql, params);
        }
        let st = match self.cache.get(sql) {
            Some(s) => s.clone(),
            None => {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let s = c.prepare_typed(sql, &types)?;
                self.cache.insert(sql.to_string(), s.clone());
                s
            }
        };
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        c.query(&st, &values)
    }

    /// A hot-path statement of a set's own table (a lookup, an insert, a delete): on a direct
    /// connection `query`'s prepared statement; on a pooled one a single message of the
    /// simple protocol, `SET LOCAL` of the timeouts then the statement with its values written
    /// in as literals, which PostgreSQL runs as one transaction: one round trip, as on a
    /// direct connection, instead of three (`BEGIN`, the statement, `COMMIT`).
    ///
    /// `sql` is the module's own text (no quotes, no name from outside); its `$n` become the
    /// literals of `params[n - 1]`.
    pub fn hot(
        &mut self,
        c: &mut Client,
        sql: &str,
        params: &[Param],
    ) -> Result<Rows, postgres::Error> {
        debug_assert!(
            !sql.contains(['\'', '"']),
            "not a hot-path statement: {sql}"
        );
        if !self.pooled {
            let typed: Vec<(&(dyn ToSql + Sync), Type)> = params.iter().map(Param::typed).collect();
            return self.query(c, sql, &typed).map(Rows::Typed);
        }
        // A value holding a NUL (never: canonical items are text) makes the driver refuse
        // the message with an error, as PostgreSQL would refuse the value.
        let mut text = String::with_capacity(sql.len() + 64 + params.len() * 64);
        let _ = write!(text, "SET LOCAL statement_timeout = {}; ", self.call_ms);
        inline(sql, params, &mut text);
        let rows = c
            .simple_query(&text)?
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .collect();
        Ok(Rows::Text(rows))
    }

    /// `query` for at most one row.
    pub fn query_opt(
        &mut self,
        c: &mut Client,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Option<Row>, postgres::Error> {
        let mut rows = self.query(c, sql, params)?;
        if rows.len() > 1 {
            rows.truncate(1);
        }
        Ok(rows.pop())
    }

    /// A transaction of the caller's own (in `Db::run_own`), which starts with the
    /// connection's timeouts when pooled.
    pub fn begin<'c>(&self, c: &'c mut Client) -> Result<Transaction<'c>, postgres::Error> {
        let mut tx = c.transaction()?;
        self.timeouts(&mut tx)?;
        Ok(tx)
    }

    /// `begin` for a read-only REPEATABLE READ transaction: one snapshot for every statement.
    pub fn begin_snapshot<'c>(
        &self,
        c: &'c mut Client,
    ) -> Result<Transaction<'c>, postgres::Error> {
        let mut tx = c
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        self.timeouts(&mut tx)?;
        Ok(tx)
    }

    fn timeouts(&self, tx: &mut Transaction) -> Result<(), postgres::Error> {
        if self.pooled {
            // `begin_sql` less its BEGIN: the driver's transaction has begun.
            tx.batch_execute(self.opening().trim_start_matches("BEGIN; "))?;
        }
        Ok(())
    }
}

/// A value of a hot-path statement ([`Stmts::hot`]).
pub enum Param<'a> {
    Text(&'a str),
    Texts(&'a [&'a str]),
    Floats(&'a [Option<f64>]),
    /// Memberships to insert, `(entity, scope, expiry)`, written as the rows of a `VALUES`
    /// list: behind a pooler only (a direct connection binds arrays instead).
    Members(&'a [(&'a str, &'a str, Option<f64>)]),
}

impl Param<'_> {
    fn typed(&self) -> (&(dyn ToSql + Sync), Type) {
        match self {
            Param::Text(s) => (s, Type::TEXT),
            Param::Texts(s) => (s, Type::TEXT_ARRAY),
            Param::Floats(s) => (s, Type::FLOAT8_ARRAY),
            Param::Members(_) => unreachable!("a VALUES list is written in, never bound"),
        }
    }

    /// The value as an SQL literal of its type.
    fn write(&self, out: &mut String) {
        match self {
            Param::Text(s) => text_literal(s, out),
            Param::Texts(v) => {
                out.push_str("ARRAY[");
                for (i, s) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    text_literal(s, out);
                }
                out.push_str("]::text[]");
            }
            Param::Floats(v) => {
                out.push_str("ARRAY[");
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    match x {
                        Some(x) => float_literal(*x, out),
                        None => out.push_str("NULL"),
                    }
                }
                out.push_str("]::float8[]");
            }
            Param::Members(v) => {
                for (i, (e, s, x)) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push('(');
                    text_literal(e, out);
                    out.push(',');
                    text_literal(s, out);
                    out.push_str(",1,");
                    match x {
                        Some(x) => {
                            out.push_str("to_timestamp(");
                            float_literal(*x, out);
                            out.push(')');
                        }
                        None => out.push_str("NULL"),
                    }
                    out.push(')');
                }
            }
        }
    }
}

/// A float8 literal that means exactly `x`: its shortest round-trip digits, or for an
/// infinity or NaN the quoted text PostgreSQL reads as one (`'inf'`, `'NaN'`).
fn float_literal(x: f64, out: &mut String) {
    use std::fmt::Write as _;
    let _ = if x.is_finite() {
        write!(out, "{x:?}")
    } else {
        write!(out, "'{x}'")
    };
}

/// A text literal that means exactly `s` whatever `standard_conforming_strings` says (the
/// escape form, where only a backslash and a quote need escaping).
fn text_literal(s: &str, out: &mut String) {
    out.push_str("E'");
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            c => out.push(c),
        }
    }
    out.push('\'');
}

/// `sql` with each `$n` replaced by the literal of `params[n - 1]`, onto `out`.
fn inline(sql: &str, params: &[Param], out: &mut String) {
    let b = sql.as_bytes();
    let mut i = 0;
    let mut from = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() && b[i + 1].is_ascii_digit() {
            let start = i;
            i += 1;
            let mut n = 0usize;
            while i < b.len() && b[i].is_ascii_digit() {
                n = n * 10 + usize::from(b[i] - b'0');
                i += 1;
            }
            out.push_str(&sql[from..start]);
            match n.checked_sub(1).and_then(|k| params.get(k)) {
                Some(p) => p.write(out),
                None => out.push_str("NULL"),
            }
            from = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&sql[from..]);
}

/// The rows of a hot-path statement: the driver's (direct) or the simple protocol's text
/// (pooled), read the same way.
pub enum Rows {
    Typed(Vec<Row>),
    Text(Vec<SimpleQueryRow>),
}

impl Rows {
    pub fn len(&self) -> usize {
        match self {
            Rows::Typed(r) => r.len(),
            Rows::Text(r) => r.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Column `col` of row `row`, a text (None: NULL).
    pub fn text(&self, row: usize, col: usize) -> Option<&str> {
        match self {
            Rows::Typed(r) => r[row].get(col),
            Rows::Text(r) => r[row].get(col),
        }
    }

    /// Column `col` of row `row`, a float8 (None: NULL).
    pub fn float(&self, row: usize, col: usize) -> Option<f64> {
        match self {
            Rows::Typed(r) => r[row].get(col),
            Rows::Text(r) => r[row].get(col).and_then(|v| v.parse().ok()),
        }
    }

    /// Column `col` of row `row`, a boolean (NULL: false).
    pub fn flag(&self, row: usize, col: usize) -> bool {
        match self {
            Rows::Typed(r) => r[row].get::<_, Option<bool>>(col).unwrap_or(false),
            Rows::Text(r) => r[row].get(col) == Some("t"),
        }
    }
}

/// Runs `f` in a transaction that starts with `begin` ([`begin_sql`]) and commits when it
/// succeeds (rolls back when it fails): how a pooled connection runs anything.
pub(super) fn in_transaction<T>(
    c: &mut Client,
    begin: &str,
    f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
) -> Result<T, postgres::Error> {
    c.batch_execute(begin)?;
    match f(c) {
        Ok(v) => c.batch_execute("COMMIT").map(|()| v),
        Err(e) => {
            if !c.is_closed() {
                let _ = c.batch_execute("ROLLBACK");
            }
            Err(e)
        }
    }
}

/// Runs `f` in a transaction of its own that carries the timeouts `(statement, lock)`,
/// whatever the connection's mode: for the statements a rebuild or the listener runs outside
/// their transactions, on connections a pooler may share (rare calls: the extra round trips
/// cost nothing that matters).
pub fn pinned<T>(
    c: &mut Client,
    timeouts: (u64, u64),
    f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
) -> Result<T, postgres::Error> {
    in_transaction(c, &begin_sql(timeouts), f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_is_bounded_by_its_clients_timeout_and_every_other_statement_lands_later() {
        assert_eq!(
            Bounds::of(2000),
            Bounds {
                lookup_ms: 2000,
                other_ms: 8000
            }
        );
        // At least a second to land; a lookup never unbounded (0 would be "none").
        assert_eq!(
            Bounds::of(100),
            Bounds {
                lookup_ms: 100,
                other_ms: 1000
            }
        );
        assert_eq!(Bounds::of(0).lookup_ms, 1);
    }

    fn inlined(sql: &str, params: &[Param]) -> String {
        let mut out = String::new();
        inline(sql, params, &mut out);
        out
    }

    #[test]
    fn values_become_literals_that_mean_exactly_them() {
        assert_eq!(
            inlined(
                "SELECT * FROM unnest($1::text[], $2::text[]) WHERE x = $3 AND y = $10",
                &[
                    Param::Texts(&["a'b", "c\\d", "é$1"]),
                    Param::Texts(&[]),
                    Param::Text("'); DROP TABLE t; --"),
                ],
            ),
            "SELECT * FROM unnest(ARRAY[E'a''b',E'c\\\\d',E'é$1']::text[]::text[], \
             ARRAY[]::text[]::text[]) WHERE x = E'''); DROP TABLE t; --' AND y = NULL"
        );
        assert_eq!(
            inlined(
                "$1",
                &[Param::Floats(&[
                    Some(1.5),
                    None,
                    Some(1e20),
                    Some(f64::INFINITY)
                ])]
            ),
            "ARRAY[1.5,NULL,1e20,'inf']::float8[]"
        );
    }
}
