//! Rebuilds that read a streaming standby (`member.pg-rebuild-url`; docs/sync.md, "Rebuilding
//! from a standby"): the standby's connection, refused unless it is in recovery; its snapshot,
//! taken once it shows the set's table with its change-log triggers; and the catch-up on the
//! primary that adds every change the standby had not replayed. On the rebuild's thread.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use postgres::Client;

use super::snapshot_rows::{copy_rows, snapshot};
use super::sql::{blind_reason, table, LOG_TRIGGERS};
use super::{classify, link, DbErr};
use crate::config::pg_link::Link;
use crate::model::canon;
use crate::model::set_def::SetDef;
use crate::model::slotset::SlotSet;

/// How often the snapshot is taken again while the standby does not show the set's table
/// and triggers yet.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// Opens the rebuild source `link` and checks that it is a standby (`pg_is_in_recovery()`).
/// Its failures name `member.pg-rebuild-url` (passwords masked) and are kept for INFO's
/// `rebuild_link_error`.
pub fn connect(link: &Link, lock_timeout_ms: u64) -> Result<Client, DbErr> {
    let name = link.name;
    let whose = |m: &str| format!("{name} ({}): {m}", link.masked);
    let (mut c, session) = super::open_link(link, (0, lock_timeout_ms), false, "libmember-rebuild")
        .map_err(|e| match e {
            DbErr::Unavailable(m) => DbErr::Unavailable(whose(&m)),
            other => other,
        })?;
    super::session::unbounded_build_session(&mut c, session).map_err(|e| match classify(&e) {
        DbErr::Unavailable(m) => DbErr::Unavailable(whose(&m)),
        other => other,
    })?;
    // Unnamed, in one round trip: the connection may be a pooler's.
    let in_recovery: bool = c
        .query_typed_one("SELECT pg_is_in_recovery()", &[])
        .map_err(|e| match classify(&e) {
            DbErr::Unavailable(m) => DbErr::Unavailable(whose(&m)),
            DbErr::Failed(m) => DbErr::Failed(whose(&m)),
            other => other,
        })?
        .get(0);
    if !in_recovery {
        let msg = whose(
            "not a standby (pg_is_in_recovery() is false): rebuilds read a streaming standby \
             of member.pg-url there, or member.pg-url itself when it is empty; the previous \
             filter keeps serving",
        );
        link::set_rebuild_error(Some(msg.clone()));
        return Err(DbErr::Invalid(msg));
    }
    Ok(c)
}

/// The set's table and the change-log triggers on it, as the snapshot sees them (plain reads
/// of the catalogs go through the transaction's snapshot), and the `slot` column when slots
/// are read: none of the writes this snapshot misses may have bypassed the log.
fn ready_sql(set: &str) -> String {
    format!(
        "SELECT (SELECT count(*) FROM pg_trigger g
                  WHERE g.tgrelid = t.oid AND g.tgenabled <> 'D'
                    AND g.tgfoid = to_regproc('member_log_change')
                    AND g.tgname IN ('{}', '{}', '{}')) = 3
                AND (NOT $1 OR EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = t.oid
                                          AND a.attname = 'slot' AND NOT a.attisdropped))
           FROM pg_class t
          WHERE t.relname = '{}' AND t.relkind = 'r'
            AND t.relnamespace = current_schema()::regnamespace",
        LOG_TRIGGERS[0],
        LOG_TRIGGERS[1],
        LOG_TRIGGERS[2],
        table(set)
    )
}

/// The set's active rows of `slots`, read on the standby `c` in one snapshot, and that
/// snapshot's xmin X_s. The snapshot is taken again (every 100 ms, for as long as a rebuild
/// waits for a lock) until it shows the table with its change-log triggers (installed on the
/// primary just before): a write the snapshot misses then went through the triggers, so it is
/// in the primary's change log, at an xid ≥ X_s.
///
/// `before_copy` gets X_s once the snapshot is ready, and may refuse it.
pub fn read_hashes(
    c: &mut Client,
    link: &Link,
    def: &SetDef,
    slots: Option<&SlotSet>,
    (progress, estimate): (&AtomicU64, Option<&AtomicU64>),
    before_copy: impl FnOnce(i64) -> Result<(), DbErr>,
) -> Result<(crate::filter::rows::Rows, i64), DbErr> {
    let wait = Duration::from_millis(crate::config::db_timeout_ms().saturating_mul(5))
        .max(Duration::from_secs(10));
    let deadline = Instant::now() + wait;
    let sql = ready_sql(&def.name);
    loop {
        let (mut tx, xmin) = snapshot(c, def)?;
        let ready = tx
            .query_opt(sql.as_str(), &[&slots.is_some()])
            .map_err(|e| classify(&e))?
            .is_some_and(|r| r.get::<_, bool>(0));
        let follows = follows_primary(&mut tx, link)?;
        if ready && follows {
            before_copy(xmin)?;
            let rows = copy_rows(&mut tx, link, def, slots, progress, estimate)?;
            tx.commit().map_err(|e| classify(&e))?;
            return Ok((rows, xmin));
        }
        drop(tx);
        if Instant::now() >= deadline {
            return Err(DbErr::Unavailable(format!(
                "the standby (member.pg-rebuild-url) has not replayed {}{}, its change-log \
                 triggers or its slot column within {} s (replication lag, or replay paused); \
                 the previous filter keeps serving",
                table(&def.name),
                if follows {
                    ""
                } else {
                    " or the primary's history row (a standby that follows another history \
                     than the primary: not re-pointed after a failover; docs/failover.md)"
                },
                wait.as_secs()
            )));
        }
        std::thread::sleep(RETRY_EVERY);
    }
}

/// Whether the standby's snapshot shows the history row of the primary's timeline with the
/// primary's token (docs/failover.md, "The rebuild source"): false while it has not replayed
/// the row (waited for like the set's table); a refusal when it shows another token, so
/// follows another history than the primary. Without a known primary history (the role may
/// not read timelines) there is nothing to compare, and the standby is taken as it is.
fn follows_primary(tx: &mut postgres::Transaction<'_>, link: &Link) -> Result<bool, DbErr> {
    let Some(primary) = super::identity::history() else {
        return Ok(true);
    };
    let has_table: bool = tx
        .query_one(
            "SELECT to_regclass('member_catalog_history') IS NOT NULL",
            &[],
        )
        .map_err(|e| classify(&e))?
        .get(0);
    if !has_table {
        return Ok(false);
    }
    let token: Option<String> = tx
        .query_opt(
            "SELECT token FROM member_catalog_history WHERE timeline = $1",
            &[&primary.timeline],
        )
        .map_err(|e| classify(&e))?
        .map(|r| r.get(0));
    match token {
        None => Ok(false),
        Some(t) if t == primary.token => Ok(true),
        Some(_) => {
            let msg = format!(
                "{} ({}): follows another history than the primary (its timeline {} is not the \
                 primary's: promoted on its own, or restored apart; docs/failover.md); the \
                 previous filter keeps serving",
                link.name, link.masked, primary.timeline
            );
            super::link::set_rebuild_error(Some(msg.clone()));
            Err(DbErr::Invalid(msg))
        }
    }
}

/// Refuses a standby snapshot whose xmin `from` is below the change log's `floor`: rows it
/// has not replayed may be gone from the log.
fn above_floor(from: i64, floor: i64) -> Result<(), DbErr> {
    if from >= floor {
        return Ok(());
    }
    Err(DbErr::Invalid(format!(
        "the standby's snapshot (xmin {from}) is older than the change log's floor ({floor}): \
         member.pg-rebuild-url lags by more than member.change-retention-s, so rows it has not \
         replayed may be gone from the log; the previous filter keeps serving"
    )))
}

/// On the primary `c`, before the COPY: the same floor check as [`catch_up`] (the floor only
/// rises, so that one decides), so that a standby lagging past the retention fails at once
/// instead of after streaming the whole table.
pub fn check_floor(c: &mut Client, from: i64) -> Result<(), DbErr> {
    let floor: Option<i64> = c
        .query_typed_opt("SELECT floor::text::int8 FROM member_changes_floor", &[])
        .map_err(|e| classify(&e))?
        .map(|r| r.get(0));
    above_floor(from, floor.unwrap_or(0))
}

/// On the primary `c`: every key of the set (of `slots`) whose latest change logged by a
/// transaction with xid ≥ `from` (the xmin of the standby's snapshot, or of the primary's after
/// its COPY: `build::catch_up_own`, which reads only the changes its snapshot `seen` did not
/// see) left it active, and the xmin
/// of this statement's snapshot, which the new filter then covers. One statement, like a sync
/// pass limited to one set. Refused when the log was pruned past `from` (the standby lags by
/// more than `member.change-retention-s`) or the table does not feed the log.
pub fn catch_up(
    c: &mut Client,
    def: &SetDef,
    slots: Option<&SlotSet>,
    from: i64,
    seen: Option<&str>,
) -> Result<(Vec<u128>, i64), DbErr> {
    // `from` is an integer written into the text (an xid8 cannot be bound from here).
    let sql = format!(
        r"SELECT h.horizon, h.floor, h.triggers, c.entity_id, c.scope
            FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8 AS horizon,
                         (SELECT floor::text::int8 FROM member_changes_floor) AS floor,
                         (SELECT count(*) FROM pg_trigger g
                           WHERE g.tgrelid = to_regclass($1) AND g.tgenabled <> 'D'
                             AND g.tgfoid = to_regproc('member_log_change')
                             AND g.tgname IN ('{ins}', '{upd}', '{del}')) AS triggers) h
            LEFT JOIN (SELECT DISTINCT ON (entity_id, scope) entity_id, scope, alive
                         FROM member_changes WHERE set_name = $2 AND xid >= '{from}'::xid8
                          AND ($3::text IS NULL
                               OR NOT pg_visible_in_snapshot(xid, $3::text::pg_snapshot))
                        ORDER BY entity_id, scope, seq DESC) c ON c.alive",
        ins = LOG_TRIGGERS[0],
        upd = LOG_TRIGGERS[1],
        del = LOG_TRIGGERS[2],
        from = from.max(0)
    );
    // A build's statement: none of the DBA's transaction-wide timeouts (a role's 100 ms
    // `transaction_timeout` ended it on a busy server, and with it the rebuild); the
    // connection's statement timeout still bounds it.
    let mut tx = c.transaction().map_err(|e| classify(&e))?;
    tx.batch_execute(super::UNBOUNDED_TRANSACTION)
        .map_err(|e| classify(&e))?;
    let rows = tx
        .query_typed(
            sql.as_str(),
            &[
                (&table(&def.name), postgres::types::Type::TEXT),
                (&def.name, postgres::types::Type::TEXT),
                (&seen, postgres::types::Type::TEXT),
            ],
        )
        .map_err(|e| classify(&e))?;
    tx.commit().map_err(|e| classify(&e))?;
    let first = rows
        .first()
        .ok_or_else(|| DbErr::Failed("catch-up read no row".into()))?;
    let horizon: i64 = first.get(0);
    let floor = first.get::<_, Option<i64>>(1).unwrap_or(0);
    let triggers: i64 = first.get(2);
    above_floor(from, floor)?;
    if triggers < 3 {
        return Err(DbErr::Failed(blind_reason(&def.name, "triggers missing")));
    }
    let mut hashes = Vec::new();
    for r in &rows {
        let (Some(entity), Some(scope)) =
            (r.get::<_, Option<&str>>(3), r.get::<_, Option<&str>>(4))
        else {
            continue;
        };
        let Ok(k) = canon::canonicalize(def.normalize, entity.as_bytes(), scope.as_bytes()) else {
            continue;
        };
        if let Some(slots) = slots {
            if !slots.contains(crate::model::slot::keyslot(k.entity.as_bytes())) {
                continue;
            }
        }
        hashes.push(k.hash);
    }
    Ok((hashes, horizon))
}
