//! Database side: one connection per worker thread, error classification, and the job queue.
//! Nothing here runs on the server's main thread.

pub mod build;
pub mod combine;
pub mod copy_stream;
pub mod identity;
pub mod keyslot;
pub mod link;
pub mod members;
#[cfg(test)]
mod names_tests;
pub mod pool;
pub mod snapshot_rows;
pub mod source;
pub mod source_check;
pub mod source_triggers;
pub mod sql;
pub mod standby;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::types::{ToSql, Type};
use postgres::{Client, Row, SimpleQueryMessage, SimpleQueryRow, Statement, Transaction};

use crate::{config, model::error};

/// Why a database call failed, with the reply text for the client.
#[derive(Clone, Debug, PartialEq)]
pub enum DbErr {
    /// Unreachable, shutting down, or too slow: `UNAVAILABLE ...`.
    Unavailable(String),
    /// The database answered with an error: `ERR database error: ...`.
    Failed(String),
    /// A refusal with a fixed reply (for example a CREATE that conflicts).
    Refused(&'static str),
    /// A request the module refuses with a composed reason (`ERR <reason>`), such as a filter
    /// larger than `member.max-filter-bytes`.
    Invalid(String),
}

impl DbErr {
    pub fn reply_text(&self) -> String {
        match self {
            DbErr::Unavailable(m) => error::db_error(true, m),
            DbErr::Failed(m) => error::db_error(false, m),
            DbErr::Refused(m) => (*m).to_string(),
            DbErr::Invalid(m) => format!("ERR {m}"),
        }
    }
}

/// Sorts a driver error into "unavailable" (connection, shutdown, timeout) or "failed".
pub fn classify(e: &postgres::Error) -> DbErr {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            // 57014 query_canceled (statement_timeout), 57P0x shutdown/crash, 53xxx resources,
            // 08xxx connection exceptions, 40001/40P01 retryable conflicts.
            if code == "57014"
                || code.starts_with("57P")
                || code.starts_with("53")
                || code.starts_with("08")
            {
                DbErr::Unavailable(db.message().to_string())
            } else {
                DbErr::Failed(db.message().to_string())
            }
        }
        None => DbErr::Unavailable(e.to_string()),
    }
}

/// True when the error means the session is gone (closed socket, server shutdown or
/// termination), as opposed to a statement that failed on a live session.
fn connection_lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            code.starts_with("57P") || code.starts_with("08")
        }
        None => true,
    }
}

/// How a connection holds its settings and statements (docs/pooler.md), decided when it
/// connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Session {
    /// One session for the connection's life: the timeouts are startup options, and workers
    /// prepare their statements once and keep them.
    Direct,
    /// Behind a pooler that may hand each transaction to another server connection: every
    /// transaction starts with the timeouts (`SET LOCAL`), and no statement outlives the
    /// transaction that made it.
    Pooled,
}

/// The reply text when `member.pg-url` leads to a pooler in statement pooling mode.
pub const STATEMENT_POOLING: &str = "member.pg-url reaches a pooler in statement pooling mode, \
     which libmember cannot use: it needs transactions (use session or transaction pooling)";

/// What a pooled connection sends to open a transaction: `BEGIN` and the server-side timeouts
/// `(statement, lock)` in milliseconds, in one round trip. A statement timeout of 0 is sent
/// (none: a rebuild's COPY must not meet a server default); a lock timeout only when there is
/// one (the workers have none, and their statement timeout bounds every wait: one statement
/// less in each of their lookups' and ADDs' messages).
pub fn begin_sql((statement_timeout_ms, lock_timeout_ms): (u64, u64)) -> String {
    let mut s = format!("BEGIN; SET LOCAL statement_timeout = {statement_timeout_ms}");
    if lock_timeout_ms > 0 {
        s.push_str(&format!("; SET LOCAL lock_timeout = {lock_timeout_ms}"));
    }
    s
}

/// Opens a connection to `member.pg-url` with the given server-side statement and lock
/// timeouts (0 = none). Connecting is bounded by `member.db-timeout-ms`. Also returns the
/// link's generation and the session mode it got (`member.pg-pooler`, docs/pooler.md).
///
/// `generic_plans` makes prepared statements keep one generic plan. The workers' statements
/// are key lookups and inserts whose plan never depends on the values, but PostgreSQL's
/// default (`plan_cache_mode = auto`) keeps planning array-parameter lookups afresh on every
/// call, because a plan for 2 items looks cheaper than a generic one for an unknown array:
/// that planning was half of each lookup's cost in the database.
pub fn connect(
    statement_timeout_ms: u64,
    lock_timeout_ms: u64,
    generic_plans: bool,
) -> Result<(Client, u64, Session), DbErr> {
    let (link_settings, generation) = config::pg_link();
    let (client, session) = open_link(
        &link_settings,
        (statement_timeout_ms, lock_timeout_ms),
        generic_plans,
        "libmember",
    )?;
    Ok((client, generation, session))
}

/// The lock timeout of a build's connections: a build streams a whole table, but does not
/// queue forever behind a lock (ALTER TABLE, VACUUM FULL).
pub fn build_lock_timeout_ms() -> u64 {
    config::db_timeout_ms().saturating_mul(5).max(10_000)
}

/// Links (by their masked text) found behind a pooler: later connections there go straight
/// to the pooled way instead of being refused their startup options first.
static POOLED_LINKS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn known_pooled(link: &crate::config::pg_link::Link) -> bool {
    POOLED_LINKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&link.masked)
}

fn remember_pooled(link: &crate::config::pg_link::Link) {
    let mut known = POOLED_LINKS.lock().unwrap_or_else(|e| e.into_inner());
    if !known.contains(&link.masked) {
        if known.len() >= 16 {
            known.clear();
        }
        known.push(link.masked.clone());
        let msg = format!(
            "libmember: {} ({}) leads to a connection pooler: every transaction carries its \
             timeouts and no statement outlives its transaction (docs/pooler.md)",
            link.name, link.masked
        );
        crate::server::mainq::post(Box::new(move |ctx| {
            crate::server::reply::log(ctx, crate::server::reply::Level::Notice, &msg)
        }));
    }
}

/// Opens a connection with `link` (the primary's, or the rebuild source's), the server-side
/// statement and lock timeouts `(statement, lock)` and `application_name` `app`, in the
/// session mode `member.pg-pooler` asks for or, with `auto`, the one detected: a server that
/// refuses the startup options, or whose session does not show the timeouts sent in them,
/// is a pooler. A pooled connection opens one transaction before it is handed out, so a
/// pooler in statement pooling mode is refused here ([`STATEMENT_POOLING`]).
pub fn open_link(
    link: &crate::config::pg_link::Link,
    timeouts: (u64, u64),
    generic_plans: bool,
    app: &str,
) -> Result<(Client, Session), DbErr> {
    use crate::config::Pooler;
    let want = config::PG_POOLER.get();
    let direct_first = match want {
        Pooler::No => true,
        Pooler::Yes => false,
        Pooler::Auto => !known_pooled(link),
    };
    if direct_first {
        match link::open(link, |cfg| tune(cfg, timeouts, generic_plans, app, true)) {
            Ok(mut c) => {
                if want == Pooler::No || options_took(&mut c, timeouts) {
                    return Ok((c, Session::Direct));
                }
                remember_pooled(link);
                transactions_allowed(link, &mut c)?;
                return Ok((c, Session::Pooled));
            }
            Err(DbErr::Unavailable(m))
                if want == Pooler::Auto && m.contains("unsupported startup parameter") =>
            {
                remember_pooled(link);
            }
            Err(e) => return Err(e),
        }
    }
    let mut c = link::open(link, |cfg| tune(cfg, timeouts, generic_plans, app, false))?;
    transactions_allowed(link, &mut c)?;
    Ok((c, Session::Pooled))
}

/// Whether the session shows the timeouts its startup options set (a pooler that drops
/// `options`, as pgbouncer's `ignore_startup_parameters` does, leaves the server's).
fn options_took(c: &mut Client, (statement_timeout_ms, lock_timeout_ms): (u64, u64)) -> bool {
    let shown = c.simple_query(
        "SELECT setting FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout') \
         ORDER BY name",
    );
    let Ok(msgs) = shown else { return false };
    let values: Vec<String> = msgs
        .iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    values
        == [
            lock_timeout_ms.to_string(),
            statement_timeout_ms.to_string(),
        ]
}

/// A transaction of two messages, which a pooler in statement pooling mode refuses: pgbouncer
/// says so and closes the connection (the driver may see it closed before it reads why).
fn transactions_allowed(link: &crate::config::pg_link::Link, c: &mut Client) -> Result<(), DbErr> {
    match c
        .batch_execute("BEGIN")
        .and_then(|()| c.batch_execute("COMMIT"))
    {
        Ok(()) => Ok(()),
        Err(e)
            if e.is_closed()
                || e.as_db_error()
                    .is_some_and(|d| d.message().contains("statement pooling")) =>
        {
            link::refused(link, STATEMENT_POOLING);
            Err(DbErr::Unavailable(STATEMENT_POOLING.to_string()))
        }
        Err(e) => Err(classify(&e)),
    }
}

/// The session settings every connection of the module gets: connect bounded by
/// `member.db-timeout-ms`, keepalives, `application_name` `app`, and with `options` (a
/// direct connection) the server-side timeouts `(statement, lock)` (0 = none) and generic
/// plans when asked (see `connect`). A pooled connection sends its timeouts with every
/// transaction instead ([`begin_sql`]).
pub(crate) fn tune(
    cfg: &mut tokio_postgres::Config,
    (statement_timeout_ms, lock_timeout_ms): (u64, u64),
    generic_plans: bool,
    app: &str,
    options: bool,
) {
    cfg.connect_timeout(Duration::from_millis(config::db_timeout_ms()))
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .application_name(app);
    if options {
        cfg.options(format!(
            "-c statement_timeout={statement_timeout_ms} -c lock_timeout={lock_timeout_ms}{}",
            if generic_plans {
                " -c plan_cache_mode=force_generic_plan"
            } else {
                ""
            }
        ));
    }
}

/// A worker's statements: how its connection holds them ([`Session`]) and, on a direct one,
/// those prepared so far. Every statement of the hot path goes through here, so the pooled
/// way is decided in one place.
#[derive(Default)]
pub struct Stmts {
    cache: HashMap<String, Statement>,
    pooled: bool,
    /// `begin_sql` for this connection's timeouts.
    begin: Arc<str>,
}

impl Stmts {
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
        let typed: Vec<(&(dyn ToSql + Sync), Type)> = params.iter().map(Param::typed).collect();
        if !self.pooled {
            return self.query(c, sql, &typed).map(Rows::Typed);
        }
        if params.iter().any(Param::has_nul) {
            // Never the case (canonical items are text); PostgreSQL says why, as it would.
            let begin = self.begin.clone();
            return in_transaction(c, &begin, |c| c.query_typed(sql, &typed)).map(Rows::Typed);
        }
        let mut text = String::with_capacity(sql.len() + 64 + params.len() * 64);
        text.push_str(self.begin.trim_start_matches("BEGIN; "));
        text.push_str("; ");
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
            tx.batch_execute(self.begin.trim_start_matches("BEGIN; "))?;
        }
        Ok(())
    }
}

/// A value of a hot-path statement ([`Stmts::hot`]).
pub enum Param<'a> {
    Text(&'a str),
    Texts(&'a [&'a str]),
    Floats(&'a [Option<f64>]),
}

impl Param<'_> {
    fn typed(&self) -> (&(dyn ToSql + Sync), Type) {
        match self {
            Param::Text(s) => (s, Type::TEXT),
            Param::Texts(s) => (s, Type::TEXT_ARRAY),
            Param::Floats(s) => (s, Type::FLOAT8_ARRAY),
        }
    }

    fn has_nul(&self) -> bool {
        match self {
            Param::Text(s) => s.contains('\0'),
            Param::Texts(v) => v.iter().any(|s| s.contains('\0')),
            Param::Floats(_) => false,
        }
    }

    /// The value as an SQL literal of its type.
    fn write(&self, out: &mut String) {
        use std::fmt::Write as _;
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
                        Some(x) if x.is_finite() => {
                            let _ = write!(out, "{x:?}");
                        }
                        Some(x) => {
                            let _ = write!(out, "'{x}'");
                        }
                        None => out.push_str("NULL"),
                    }
                }
                out.push_str("]::float8[]");
            }
        }
    }
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
fn in_transaction<T>(
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

/// A worker's connection, opened lazily and reopened after a failure or a change of
/// `member.pg-url`, with its prepared statements.
#[derive(Default)]
pub struct Db {
    conn: Option<(Client, u64)>,
    stmts: Stmts,
    last_used: Option<Instant>,
}

/// A connection idle longer than this is checked (one empty round trip) before a job uses
/// it: the server may have closed it meanwhile, and a write is not retried. It must be
/// shorter than any stop and start of PostgreSQL (a connection last used just before a
/// fast restart otherwise fails the first write after it), and a busy worker never waits
/// this long between jobs, so the check costs nothing under load.
const IDLE_CHECK_AFTER: Duration = Duration::from_millis(100);

impl Db {
    /// Statements a client already gave up on still get this long to land (an ADD that
    /// commits late still reaches the filter), then the server cancels them.
    fn statement_timeout_ms() -> u64 {
        config::db_timeout_ms().saturating_mul(4).max(1000)
    }

    pub fn client(&mut self) -> Result<&mut Client, DbErr> {
        let generation = config::pg_link_gen();
        let stale = match &self.conn {
            Some((c, g)) => *g != generation || c.is_closed(),
            None => true,
        };
        let idle = self
            .last_used
            .is_some_and(|t| t.elapsed() > IDLE_CHECK_AFTER);
        let dead = !stale
            && idle
            && self.conn.as_mut().is_some_and(|(c, _)| {
                c.is_valid(Duration::from_millis(config::db_timeout_ms()))
                    .is_err()
            });
        if stale || dead {
            self.conn = None;
            self.stmts = Stmts::default();
            let timeouts = (Self::statement_timeout_ms(), 0);
            let (mut c, generation, session) = connect(timeouts.0, timeouts.1, true)?;
            let pooled = session == Session::Pooled;
            self.stmts.pooled = pooled;
            self.stmts.begin = begin_sql(timeouts).into();
            // Behind a pooler the identity's statement runs in a transaction of its own.
            if pooled {
                let _ = c.batch_execute(&self.stmts.begin);
            }
            identity::learn(&mut c);
            if pooled {
                let _ = c.batch_execute("COMMIT");
            }
            self.conn = Some((c, generation));
        }
        self.last_used = Some(Instant::now());
        Ok(&mut self.conn.as_mut().unwrap().0)
    }

    /// Runs `f` on the connection; on failure drops a broken connection so the next job
    /// reconnects (the database coming back is noticed by itself).
    ///
    /// A connection that sat idle may have been closed by the server (a restart, a
    /// failover, `idle_session_timeout`); the synchronous driver only notices on the next
    /// call. A read that fails that way is retried once on a fresh connection, so a database
    /// that is back answers the very next request. Writes use `run_once`.
    ///
    /// Behind a pooler the call is one transaction that starts with the connection's
    /// timeouts; `f` must not open transactions of its own (use `run_own`).
    pub fn run<T>(
        &mut self,
        f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.retried(f, true)
    }

    /// `run` for a call that opens its own transactions, with `Stmts::begin` or
    /// `Stmts::begin_snapshot` (they carry the timeouts behind a pooler); `f` runs nothing
    /// outside them.
    pub fn run_own<T>(
        &mut self,
        f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.retried(f, false)
    }

    fn retried<T>(
        &mut self,
        mut f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
        wrap: bool,
    ) -> Result<T, DbErr> {
        let reused = self.conn.is_some();
        match self.attempt(&mut f, wrap) {
            Err((_, true)) if reused => {
                self.reset();
                self.attempt(&mut f, wrap).map_err(|(e, _)| e)
            }
            other => other.map_err(|(e, _)| e),
        }
    }

    /// Runs a write once: if the connection died mid-call the write may or may not have
    /// committed, and retrying could turn a 1 into a 0. The client gets UNAVAILABLE instead
    /// (a timed-out write's usual contract); idle connections are checked before use. Behind
    /// a pooler, as `run`.
    pub fn run_once<T>(
        &mut self,
        mut f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.attempt(&mut f, true).map_err(|(e, _)| e)
    }

    /// `run_once` for a write that opens its own transactions (as `run_own`).
    pub fn run_once_own<T>(
        &mut self,
        mut f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.attempt(&mut f, false).map_err(|(e, _)| e)
    }

    /// One call, in a transaction of its own on a pooled connection when `wrap`; the error
    /// says whether the connection itself failed.
    fn attempt<T>(
        &mut self,
        f: &mut impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
        wrap: bool,
    ) -> Result<T, (DbErr, bool)> {
        self.client().map_err(|e| (e, false))?;
        let client = &mut self.conn.as_mut().expect("connected above").0;
        let stmts = &mut self.stmts;
        let result = if wrap && stmts.pooled {
            let begin = stmts.begin.clone();
            in_transaction(client, &begin, |c| f(c, stmts))
        } else {
            f(client, stmts)
        };
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                let err = classify(&e);
                let lost =
                    connection_lost(&e) || self.conn.as_ref().is_none_or(|(c, _)| c.is_closed());
                if lost || matches!(err, DbErr::Unavailable(_)) {
                    self.reset();
                }
                Err((err, lost))
            }
        }
    }

    /// Forgets the connection (after a panic mid-call, its state is unknown).
    pub fn reset(&mut self) {
        self.conn = None;
        self.stmts = Stmts::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_transaction_begins_with_the_timeouts_it_has() {
        assert_eq!(
            begin_sql((8000, 0)),
            "BEGIN; SET LOCAL statement_timeout = 8000"
        );
        assert_eq!(
            begin_sql((0, 10000)),
            "BEGIN; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 10000"
        );
    }
}
