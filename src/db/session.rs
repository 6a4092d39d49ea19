//! How a connection holds its settings and statements (docs/pooler.md): directly, one session
//! for its life, or behind a pooler; which one a connection gets, detected when it connects.

use std::sync::Mutex;
use std::time::Duration;

use postgres::Client;

use super::{classify, link, DbErr};
use crate::config;

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

/// The statement that sets the DBA's transaction-wide timeouts to 0, for the transaction
/// (`"true"`) or the session (`"false"`): `set_config`'s `is_local`.
macro_rules! lift_timeouts {
    ($is_local:literal) => {
        concat!(
            "SELECT set_config(name, '0', ",
            $is_local,
            ") FROM pg_settings \
             WHERE name IN ('transaction_timeout', 'idle_in_transaction_session_timeout')"
        )
    };
}

/// What a build's long transactions run after their statement and lock timeouts: no
/// `transaction_timeout` (PostgreSQL 17 and later: a role's or a database's setting would end
/// a rebuild's, a slot fill's or a standby rebuild's COPY) and no
/// `idle_in_transaction_session_timeout` (the transaction that exported the snapshot waits
/// while its COPY streams on another connection). Read from `pg_settings`, so one statement
/// runs on every major, and only for this transaction: every other transaction of the module
/// keeps the DBA's settings, but those of a build's own direct connection
/// ([`unbounded_build_session`]; docs/operations.md).
pub const UNBOUNDED_TRANSACTION: &str = lift_timeouts!("true");

/// [`UNBOUNDED_TRANSACTION`] for a whole session: a build's own connection, direct, whose
/// every transaction belongs to the build (the checks before its snapshot, the trigger DDL,
/// the snapshot's first statements). Each of them is short, but a DBA's 100 ms
/// `transaction_timeout` on a loaded server ended one now and then, and with it the
/// rebuild. Behind a pooler the server connection is shared, so only the build's long
/// transactions lift them, for themselves.
pub fn unbounded_build_session(c: &mut Client, session: Session) -> Result<(), postgres::Error> {
    if session == Session::Pooled {
        return Ok(());
    }
    c.batch_execute(lift_timeouts!("false"))
}

/// How the last connection to `member.pg-url` was opened: 0 none yet, 1 direct, 2 pooled
/// (`INFO member`'s `db_session`).
static LAST: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// `INFO member`'s `db_session`: `direct` or `pooled`, as the last connection the workers
/// opened to `member.pg-url` was, or `unknown` before the first.
pub fn shown() -> &'static str {
    match LAST.load(std::sync::atomic::Ordering::Relaxed) {
        1 => "direct",
        2 => "pooled",
        _ => "unknown",
    }
}

/// Records how a worker's connection was opened, for [`shown`].
pub fn opened(session: Session) {
    let v = match session {
        Session::Direct => 1,
        Session::Pooled => 2,
    };
    LAST.store(v, std::sync::atomic::Ordering::Relaxed);
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
                // A session that ends while it is asked (a DBA's transaction_timeout on a busy
                // server) is an error to retry, not a pooler.
                if want == Pooler::No || options_took(&mut c, timeouts).map_err(|e| classify(&e))? {
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
fn options_took(
    c: &mut Client,
    (statement_timeout_ms, lock_timeout_ms): (u64, u64),
) -> Result<bool, postgres::Error> {
    let msgs = c.simple_query(
        "SELECT setting FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout') \
         ORDER BY name",
    )?;
    let values: Vec<String> = msgs
        .iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    Ok(values
        == [
            lock_timeout_ms.to_string(),
            statement_timeout_ms.to_string(),
        ])
}

/// A transaction of two messages, which a pooler in statement pooling mode refuses: pgbouncer
/// says so and closes the connection (the driver may see it closed before it reads why).
fn transactions_allowed(link: &crate::config::pg_link::Link, c: &mut Client) -> Result<(), DbErr> {
    match c
        .batch_execute("BEGIN")
        .and_then(|()| c.batch_execute("COMMIT"))
    {
        Ok(()) => Ok(()),
        // A server's own reason (a transaction timeout that ended the session) is that
        // reason; pgbouncer's, or a close before any reason could be read, is the refusal.
        Err(e)
            if e.as_db_error()
                .map_or(e.is_closed(), |d| d.message().contains("statement pooling")) =>
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

#[cfg(test)]
mod tests {
    use super::*;

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
