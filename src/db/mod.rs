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
use std::time::{Duration, Instant};

use postgres::{Client, Statement};

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

/// Opens a connection to `member.pg-url` with the given server-side statement and lock
/// timeouts (0 = none). Connecting is bounded by `member.db-timeout-ms`.
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
) -> Result<(Client, u64), DbErr> {
    let (link_settings, generation) = config::pg_link();
    let client = open_link(
        &link_settings,
        (statement_timeout_ms, lock_timeout_ms),
        generic_plans,
        "libmember",
    )?;
    Ok((client, generation))
}

/// The lock timeout of a build's connections: a build streams a whole table, but does not
/// queue forever behind a lock (ALTER TABLE, VACUUM FULL).
pub fn build_lock_timeout_ms() -> u64 {
    config::db_timeout_ms().saturating_mul(5).max(10_000)
}

/// Opens a connection with `link` (the primary's, or the rebuild source's), the server-side
/// statement and lock timeouts `(statement, lock)` and `application_name` `app`.
pub fn open_link(
    link: &crate::config::pg_link::Link,
    (statement_timeout_ms, lock_timeout_ms): (u64, u64),
    generic_plans: bool,
    app: &str,
) -> Result<Client, DbErr> {
    link::open(link, |cfg| {
        tune(
            cfg,
            (statement_timeout_ms, lock_timeout_ms),
            generic_plans,
            app,
        )
    })
}

/// The session settings every connection of the module gets: connect bounded by
/// `member.db-timeout-ms`, keepalives, the server-side timeouts `(statement, lock)` (0 =
/// none), `application_name` `app`, and generic plans when asked (see `connect`).
pub(crate) fn tune(
    cfg: &mut tokio_postgres::Config,
    (statement_timeout_ms, lock_timeout_ms): (u64, u64),
    generic_plans: bool,
    app: &str,
) {
    cfg.connect_timeout(Duration::from_millis(config::db_timeout_ms()))
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .application_name(app)
        .options(format!(
            "-c statement_timeout={statement_timeout_ms} -c lock_timeout={lock_timeout_ms}{}",
            if generic_plans {
                " -c plan_cache_mode=force_generic_plan"
            } else {
                ""
            }
        ));
}

/// A worker's connection, opened lazily and reopened after a failure or a change of
/// `member.pg-url`, with its prepared statements.
#[derive(Default)]
pub struct Db {
    conn: Option<(Client, u64)>,
    stmts: HashMap<String, Statement>,
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
            self.stmts.clear();
            let (mut c, generation) = connect(Self::statement_timeout_ms(), 0, true)?;
            identity::learn(&mut c);
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
    pub fn run<T>(
        &mut self,
        mut f: impl FnMut(&mut Client, &mut HashMap<String, Statement>) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        let reused = self.conn.is_some();
        match self.attempt(&mut f) {
            Err((_, true)) if reused => {
                self.reset();
                self.attempt(&mut f).map_err(|(e, _)| e)
            }
            other => other.map_err(|(e, _)| e),
        }
    }

    /// Runs a write once: if the connection died mid-call the write may or may not have
    /// committed, and retrying could turn a 1 into a 0. The client gets UNAVAILABLE instead
    /// (a timed-out write's usual contract); idle connections are checked before use.
    pub fn run_once<T>(
        &mut self,
        mut f: impl FnMut(&mut Client, &mut HashMap<String, Statement>) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.attempt(&mut f).map_err(|(e, _)| e)
    }

    /// One call; the error says whether the connection itself failed.
    fn attempt<T>(
        &mut self,
        f: &mut impl FnMut(&mut Client, &mut HashMap<String, Statement>) -> Result<T, postgres::Error>,
    ) -> Result<T, (DbErr, bool)> {
        self.client().map_err(|e| (e, false))?;
        let client = &mut self.conn.as_mut().expect("connected above").0;
        match f(client, &mut self.stmts) {
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
        self.stmts.clear();
    }
}

/// Prepares `sql` once per connection.
pub fn prepared(
    client: &mut Client,
    stmts: &mut HashMap<String, Statement>,
    sql: &str,
) -> Result<Statement, postgres::Error> {
    if let Some(s) = stmts.get(sql) {
        return Ok(s.clone());
    }
    let s = client.prepare(sql)?;
    stmts.insert(sql.to_string(), s.clone());
    Ok(s)
}
