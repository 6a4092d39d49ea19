//! Database side: one connection per worker thread, error classification, and the job queue.
//! Nothing here runs on the server's main thread.

pub mod build;
pub mod combine;
pub mod copy_stream;
pub mod identity;
pub mod in_flight;
pub mod keyslot;
pub mod link;
pub mod members;
#[cfg(test)]
mod names_tests;
pub mod pool;
mod session;
pub mod snapshot_rows;
pub mod source;
pub mod source_check;
pub mod source_triggers;
pub mod sql;
pub mod standby;
mod stmts;
pub mod token_form;
pub mod token_sql;

use std::time::{Duration, Instant};

use postgres::Client;

use crate::{config, model::error};

pub(crate) use session::tune;
pub use session::{
    begin_sql, open_link, shown as session_shown, Session, STATEMENT_POOLING, UNBOUNDED_TRANSACTION,
};
use stmts::in_transaction;
pub use stmts::{pinned, Bound, Bounds, Param, Rows, Stmts};

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
            // 08xxx connection exceptions, 40001/40P01 retryable conflicts, 25P03/25P04 a
            // session the DBA's idle-in-transaction or transaction timeout (17+) ended.
            if code == "57014"
                || ENDED_BY_TIMEOUT.contains(&code)
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

/// The sessions PostgreSQL ends for a timeout a DBA set: 25P03
/// `idle_in_transaction_session_timeout`, 25P04 `transaction_timeout` (17 and later). The
/// database did not answer in time, and the session is gone.
const ENDED_BY_TIMEOUT: [&str; 2] = ["25P03", "25P04"];

/// True when the error means the session is gone (closed socket, server shutdown or
/// termination), as opposed to a statement that failed on a live session.
fn connection_lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            code.starts_with("57P") || code.starts_with("08") || ENDED_BY_TIMEOUT.contains(&code)
        }
        None => true,
    }
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

/// A build's own connection to `member.pg-url` (a rebuild's, a slot fill's): no statement
/// timeout, the build's lock timeout, and on a direct session none of the DBA's
/// transaction-wide timeouts (`session::unbounded_build_session`).
pub fn connect_build() -> Result<Client, DbErr> {
    let (mut c, _, session) = connect(0, build_lock_timeout_ms(), false)?;
    session::unbounded_build_session(&mut c, session).map_err(|e| classify(&e))?;
    Ok(c)
}

/// The lock timeout of a build's connections: a build streams a whole table, but does not
/// queue forever behind a lock (ALTER TABLE, VACUUM FULL).
pub fn build_lock_timeout_ms() -> u64 {
    config::db_timeout_ms().saturating_mul(5).max(10_000)
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
            // A direct session starts with the lookups' bound: they are most of its calls
            // (`Stmts::start_call` moves it when a call needs another).
            let lookup_ms = Bounds::now().lookup_ms;
            let (mut c, generation, session) = connect(lookup_ms, 0, true)?;
            self.stmts = Stmts::new(session, lookup_ms);
            session::opened(session);
            let pooled = session == Session::Pooled;
            // Behind a pooler the identity's statement runs in a transaction of its own.
            if pooled {
                let _ = c.batch_execute(&self.stmts.opening());
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
        self.retried(f, true, Bound::Other)
    }

    /// `run` for a lookup: its statements end in the database within `member.db-timeout-ms`
    /// ([`Bounds::lookup_ms`]), when its client stops waiting.
    pub fn run_lookup<T>(
        &mut self,
        f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.retried(f, true, Bound::Lookup)
    }

    /// `run_own` for a lookup (bounded as [`Db::run_lookup`]).
    pub fn run_lookup_own<T>(
        &mut self,
        f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.retried(f, false, Bound::Lookup)
    }

    /// `run` for a call that opens its own transactions, with `Stmts::begin` or
    /// `Stmts::begin_snapshot` (they carry the timeouts behind a pooler); `f` runs nothing
    /// outside them.
    pub fn run_own<T>(
        &mut self,
        f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.retried(f, false, Bound::Other)
    }

    fn retried<T>(
        &mut self,
        mut f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
        wrap: bool,
        bound: Bound,
    ) -> Result<T, DbErr> {
        let reused = self.conn.is_some();
        match self.attempt(&mut f, wrap, bound) {
            Err((_, true)) if reused => {
                self.reset();
                self.attempt(&mut f, wrap, bound).map_err(|(e, _)| e)
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
        self.attempt(&mut f, true, Bound::Other).map_err(|(e, _)| e)
    }

    /// `run_once` for a write that opens its own transactions (as `run_own`).
    pub fn run_once_own<T>(
        &mut self,
        mut f: impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
    ) -> Result<T, DbErr> {
        self.attempt(&mut f, false, Bound::Other)
            .map_err(|(e, _)| e)
    }

    /// One call under `bound`, in a transaction of its own on a pooled connection when
    /// `wrap`; the error says whether the connection itself failed.
    fn attempt<T>(
        &mut self,
        f: &mut impl FnMut(&mut Client, &mut Stmts) -> Result<T, postgres::Error>,
        wrap: bool,
        bound: Bound,
    ) -> Result<T, (DbErr, bool)> {
        self.client().map_err(|e| (e, false))?;
        let client = &mut self.conn.as_mut().expect("connected above").0;
        let stmts = &mut self.stmts;
        let result = stmts.start_call(client, bound).and_then(|()| {
            if wrap && stmts.pooled() {
                let begin = stmts.opening();
                in_transaction(client, &begin, |c| f(c, stmts))
            } else {
                f(client, stmts)
            }
        });
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
