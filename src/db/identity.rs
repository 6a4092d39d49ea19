//! The identity of a database and of the history of it a node follows (`filter_origin`,
//! docs/failover.md): read by each worker when it opens its connection and by every sync pass,
//! and kept as this node's (`NodeDb`), against which the main thread judges the filters it
//! loads; read by each rebuild on its own connection, and stamped on the filter. A change of
//! it moves [`generation`], which the main thread answers by believing nothing it derived from
//! the old history (`upkeep/history.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use postgres::types::Type;
use postgres::Client;

use crate::filter::origin::NodeDb;

/// The history of the database a node follows: the server's current timeline and the token
/// the module wrote for it in `member_catalog_history` (docs/failover.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History {
    pub timeline: i32,
    pub token: String,
}

/// What the node knows, and how often and when it changed.
struct Node {
    db: NodeDb,
    /// `None`: not read yet, or the role may not read the timeline (`unreadable`).
    history: Option<History>,
    /// The role was refused the timeline functions.
    history_refused: bool,
    changes: u64,
    changed_at: Option<SystemTime>,
    /// How far the node has seen the history it follows go: it only moves forward within one
    /// history, so a reading below it means the server was put back in time (docs/failover.md,
    /// "A database that went back in time").
    high: High,
    /// Times the node saw the database go back in time without a new timeline.
    pub rollbacks: u64,
    /// Tokens of histories this node left on the same timeline (a restore seen): a read
    /// that still shows one began before the new token was written, and is stale.
    retired: Vec<(i32, String)>,
}

static NODE: Mutex<Node> = Mutex::new(Node {
    db: NodeDb::NotYet,
    history: None,
    history_refused: false,
    changes: 0,
    changed_at: None,
    high: High {
        flushed: None,
        horizon: None,
        flushed_at: 0,
        horizon_at: 0,
    },
    rollbacks: 0,
    retired: Vec::new(),
});

/// The furthest points of one history the node has read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct High {
    /// The highest flushed WAL position read (`pg_current_wal_flush_lsn()`, bytes). Flushed
    /// WAL survives a crash, so within one history it never goes back.
    flushed: Option<i64>,
    /// When (in [`SEQ`]'s order) each of the two was last raised: a reading that began before
    /// then ran beside the one that raised it, and proves nothing against it ([`High::before`]).
    flushed_at: u64,
    horizon_at: u64,
    /// The highest sync horizon a pass adopted as watermark (a snapshot's xmin). Every
    /// transaction below it had ended, so within one history the next transaction id never
    /// falls below it again; if it did, new rows would get ids under the watermarks and no
    /// pass would ever read them.
    horizon: Option<i64>,
}

/// One reading of how far the server is: its flushed WAL position (`None`: the role may not
/// read it) and its next transaction id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reading {
    flushed: Option<i64>,
    next_xid: i64,
}

/// Orders readings against the highs they are compared with: taken when a reading begins, and
/// when a reading or a pass raises a high. Workers read the server side by side, so a reading
/// that began earlier may be folded in after a later one raised a high; only a high raised
/// before a reading began must be below it on the same history.
static SEQ: AtomicU64 = AtomicU64::new(1);

fn next_seq() -> u64 {
    SEQ.fetch_add(1, Ordering::AcqRel)
}

impl High {
    /// What was read before `began` (a reading's [`SEQ`]): the highs raised since are left
    /// out. Pure.
    fn before(self, began: u64) -> High {
        High {
            flushed: self.flushed.filter(|_| self.flushed_at < began),
            horizon: self.horizon.filter(|_| self.horizon_at < began),
            ..self
        }
    }
}

/// Whether `now` shows a server behind what the node already read of the same history (`high`
/// as it stood when the reading began: [`High::before`]). Pure.
fn went_back(high: High, now: Reading) -> bool {
    let wal = matches!((high.flushed, now.flushed), (Some(h), Some(n)) if n < h);
    let xid = high.horizon.is_some_and(|h| now.next_xid < h);
    wal || xid
}

/// The token a node writes for a history it saw go back in time: the `restored-` prefix makes
/// it count on timeline 1 too ([`compose`]).
const RESTORED: &str = "restored-";

/// Moves every time the identity a worker reads differs from the one the node held.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The timeline the server writes WAL on now: the first 8 hex digits of the current WAL
/// file's name. It moves at the promotion itself (`pg_control_checkpoint()` only after the
/// next checkpoint). Both functions may be called by any role.
pub(crate) const TIMELINE: &str =
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int4";

/// The module's record of the histories it met, `member_catalog_history`: one row per
/// timeline, its token random. Named `catalog_…`, which no set may take
/// (`sql::reserved_set_name`).
const HISTORY_DDL: &str = "CREATE TABLE IF NOT EXISTS member_catalog_history (
    timeline integer PRIMARY KEY,
    token text NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now()
)";

/// What this node knows of its database now.
pub fn node() -> NodeDb {
    lock().db
}

/// The history the node follows (`None`: unknown or unreadable).
pub fn history() -> Option<History> {
    lock().history.clone()
}

/// The role was refused the timeline functions: promotions cannot be seen.
pub fn history_refused() -> bool {
    lock().history_refused
}

/// Changes of identity seen so far; the main thread compares it with the last one it
/// answered.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// INFO's view: the history followed (`timeline 2 (token 1a2b3c4d)`, `unknown`, or
/// `unreadable`), how many times the identity changed, and when it last did.
pub fn shown() -> (String, u64, Option<SystemTime>) {
    let n = lock();
    let h = match (&n.history, n.history_refused) {
        (Some(h), _) => {
            // A restored history's token shows its prefix and the start of its own part.
            let shown = RESTORED.len() * (h.token.starts_with(RESTORED) as usize) + 8;
            format!(
                "timeline {} (token {})",
                h.timeline,
                h.token.get(..shown).unwrap_or(&h.token)
            )
        }
        (None, true) => "unreadable".into(),
        (None, false) => "unknown".into(),
    };
    (h, n.changes, n.changed_at)
}

/// INFO's fields of the history followed (MEMBER.INFO and `INFO member`): `db_history`,
/// `db_history_changes` (changes of database or history this node saw since it started),
/// `db_history_changed_at` (unix seconds of the last one, 0 for none) and
/// `db_history_rollbacks` (those it saw as the database going back in time on one timeline).
pub fn info_fields() -> [(&'static str, String); 4] {
    let (history, changes, at) = shown();
    let at = at
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    [
        ("db_history", history),
        ("db_history_changes", changes.to_string()),
        ("db_history_changed_at", at.to_string()),
        ("db_history_rollbacks", rollbacks().to_string()),
    ]
}

fn lock() -> std::sync::MutexGuard<'static, Node> {
    NODE.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the module's role may read here, asked first so that no statement of [`learn`]
/// fails on a refusal: a failed statement would abort the transaction a pooled connection
/// runs it in (docs/pooler.md), and the server checks a function's privilege when it plans a
/// statement, whatever branch would call it.
struct Probe {
    /// `pg_control_system()`: the cluster's system identifier (the same on its physical
    /// standbys, another on any other cluster, including one restored from a logical dump).
    sysid: bool,
    /// `pg_walfile_name()` and `pg_current_wal_lsn()`: the timeline.
    timeline: bool,
    in_recovery: bool,
    /// `member_catalog_history` exists.
    table: bool,
    /// `pg_current_wal_flush_lsn()` may be called.
    flushed: bool,
    /// The role may UPDATE `member_catalog_history` (to write a new token after a restore).
    rewrite: bool,
}

const PROBE: &str = "SELECT has_function_privilege('pg_control_system()', 'EXECUTE'),
        has_function_privilege('pg_walfile_name(pg_lsn)', 'EXECUTE')
          AND has_function_privilege('pg_current_wal_lsn()', 'EXECUTE'),
        pg_is_in_recovery(),
        to_regclass('member_catalog_history') IS NOT NULL,
        has_function_privilege('pg_current_wal_flush_lsn()', 'EXECUTE'),
        CASE WHEN to_regclass('member_catalog_history') IS NULL THEN false
             ELSE has_table_privilege('member_catalog_history', 'UPDATE') END";

fn probe(c: &mut Client) -> Result<Probe, postgres::Error> {
    let r = c.query_typed_one(PROBE, &[])?;
    Ok(Probe {
        sysid: r.get(0),
        timeline: r.get(1),
        in_recovery: r.get(2),
        table: r.get(3),
        flushed: r.get(4),
        rewrite: r.get(5),
    })
}

/// What one read of the identity found: the base identity (`None`: the role may not read
/// the system identifier), the timeline (`None`: may not read it) and its token, if written,
/// and how far the server is.
type Read = (Option<String>, Option<(i32, Option<String>)>, Reading);

/// The identity's parts in one statement, only those `p` says the role may read. The
/// database's oid distinguishes every database of the cluster.
fn read_parts(c: &mut Client, p: &Probe) -> Result<Read, postgres::Error> {
    let sysid = if p.sysid {
        "(SELECT system_identifier::text FROM pg_control_system())"
    } else {
        "NULL::text"
    };
    let timeline = if p.timeline { TIMELINE } else { "NULL::int4" };
    let token = if p.timeline && p.table {
        "(SELECT token FROM member_catalog_history WHERE timeline = t.tl)"
    } else {
        "NULL::text"
    };
    let flushed = if p.flushed {
        "(pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::int8"
    } else {
        "NULL::int8"
    };
    let sql = format!(
        "SELECT {sysid}, (SELECT oid FROM pg_database WHERE datname = current_database())::int8,
                t.tl, {token}, {flushed},
                pg_snapshot_xmax(pg_current_snapshot())::text::int8
           FROM (SELECT {timeline} AS tl) t"
    );
    let r = c.query_typed_one(&sql, &[])?;
    let sysid: Option<String> = r.get(0);
    let oid: i64 = r.get(1);
    let tl: Option<i32> = r.get(2);
    let token: Option<String> = r.get(3);
    let reading = Reading {
        flushed: r.get(4),
        next_xid: r.get(5),
    };
    Ok((
        sysid.map(|s| format!("postgresql:{s}:{oid}")),
        tl.map(|t| (t, token)),
        reading,
    ))
}

/// The token of `timeline`, written first (with the table, if `table` says it is missing)
/// when no node has yet. Statements that work inside a caller's transaction or alone; two
/// nodes writing the first row at once both end up with the one that won.
fn write_token(c: &mut Client, timeline: i32, table: bool) -> Result<String, postgres::Error> {
    if !table {
        c.batch_execute(HISTORY_DDL)?;
    }
    for _ in 0..3 {
        let token: Option<String> = c
            .query_typed_one(
                "WITH ins AS (INSERT INTO member_catalog_history (timeline, token)
                              VALUES ($1, gen_random_uuid()::text)
                              ON CONFLICT (timeline) DO NOTHING RETURNING token)
                 SELECT coalesce((SELECT token FROM ins),
                                 (SELECT token FROM member_catalog_history
                                   WHERE timeline = $1))",
                &[(&timeline, Type::INT4)],
            )?
            .get(0);
        // None: another node's row committed while this statement ran, unseen by its
        // snapshot; the next statement sees it.
        if let Some(t) = token {
            return Ok(t);
        }
    }
    Ok(String::new())
}

/// Writes a new token for `timeline` in place of `seen`, the one the node followed when it
/// saw the server go back in time, and returns the token there now: the new one, or the one
/// another node that saw it too wrote first. Every node reads it at its next pass, so they all
/// leave the old history, even one that was not connected when the server went back.
fn rewrite_token(c: &mut Client, timeline: i32, seen: &str) -> Result<String, postgres::Error> {
    c.execute_typed(
        "UPDATE member_catalog_history SET token = $3 || gen_random_uuid()::text,
                first_seen = now()
          WHERE timeline = $1 AND token = $2",
        &[
            (&timeline, Type::INT4),
            (&seen, Type::TEXT),
            (&RESTORED, Type::TEXT),
        ],
    )?;
    let token: Option<String> = c
        .query_typed_one(
            "SELECT (SELECT token FROM member_catalog_history WHERE timeline = $1)",
            &[(&timeline, Type::INT4)],
        )?
        .get(0);
    Ok(token.unwrap_or_default())
}

/// The identity a node holds for base identity `base` (or this process's stand-in for it)
/// and `history`. On timeline 1 it is what versions before histories stamped, so their
/// filters stay trusted where they were made, unless the history was seen to go back in time
/// (a `restored-` token); on any later timeline the timeline and its token are part of it.
fn compose(base: &str, history: Option<&History>) -> u128 {
    let text = match history {
        Some(h) if h.timeline != 1 || h.token.starts_with(RESTORED) => {
            format!("{base}:tl{}:{}", h.timeline, h.token)
        }
        _ => base.to_string(),
    };
    xxhash_rust::xxh3::xxh3_128(text.as_bytes())
}

/// On a connection just opened to `member.pg-url`, and at every sync pass: reads the
/// database's identity and the history it follows, and keeps them. Another database or
/// another history replaces what the node held and moves [`generation`], so filters, cache
/// entries and marks made from the old one are no longer believed. A role that may not read
/// the system identifier makes the node stand in this process's own identity ([`local`]) for
/// it; one that may not read the timeline leaves the history `unreadable`. A server in
/// recovery (a standby), or any failure (a timeout, a lost connection), changes nothing, and
/// the next connection or pass tries again. Safe inside a caller's transaction: no statement
/// of it fails on a refusal. Two round trips; a third and fourth only on a new timeline.
pub(super) fn learn(c: &mut Client) {
    let began = next_seq();
    let Ok(p) = probe(c) else { return };
    if p.in_recovery {
        return;
    }
    let Ok((base, mut tl, reading)) = read_parts(c, &p) else {
        return;
    };
    // The same history as the node follows, but behind what the node read of it: a restore
    // from a storage snapshot, a cold copy or a VM image. It becomes a new history.
    let back = {
        let node = lock();
        if let Some((t, Some(tok))) = &tl {
            if node.retired.iter().any(|(rt, rtok)| rt == t && rtok == tok) {
                // Read before another worker of this node wrote the new token: stale.
                return;
            }
        }
        let same = matches!((&node.history, &tl), (Some(h), Some((t, Some(tok))))
            if h.timeline == *t && h.token == *tok);
        same && went_back(node.high.before(began), reading)
    };
    if back {
        let Some((timeline, Some(seen))) = tl.clone() else {
            return;
        };
        if !p.rewrite {
            return;
        }
        match rewrite_token(c, timeline, &seen) {
            Ok(token) if !token.is_empty() && token != seen => {
                tl = Some((timeline, Some(token)));
            }
            _ => return,
        }
    }
    let history = match tl {
        Some((timeline, Some(token))) => Some(History { timeline, token }),
        Some((timeline, None)) => match write_token(c, timeline, p.table) {
            Ok(token) if !token.is_empty() => Some(History { timeline, token }),
            _ => return,
        },
        None => None,
    };
    let history_refused = !p.timeline;
    let mut node = lock();
    let db = match &base {
        Some(b) => NodeDb::Known(compose(b, history.as_ref())),
        // A refusal after the identity was read once (a revoke while running) keeps it.
        None if matches!(node.db, NodeDb::Known(_)) => return,
        // The stand-in is the process's own, but another history still moves it.
        None => NodeDb::Unreadable(compose(
            &format!("local:{:032x}", local()),
            history.as_ref(),
        )),
    };
    if node.db != NodeDb::NotYet && node.db != db {
        node.changes += 1;
        node.changed_at = Some(SystemTime::now());
        GENERATION.fetch_add(1, Ordering::AcqRel);
        node.high = High::default();
        // The same timeline under a new token: the history went back in time (this node or
        // another wrote the token). Counted once, and the old token is never followed again.
        if let (Some(old), Some(new)) = (&node.history, &history) {
            if old.timeline == new.timeline && old.token != new.token {
                let retired = (old.timeline, old.token.clone());
                node.retired.push(retired);
                node.rollbacks += 1;
            }
        }
    }
    // Another history (or the first): how far it is counts from this reading.
    if node.history != history {
        node.high = High::default();
    }
    if reading.flushed > node.high.flushed {
        node.high.flushed = reading.flushed;
        node.high.flushed_at = next_seq();
    }
    node.db = db;
    node.history = history;
    node.history_refused = history_refused;
}

/// This process's stand-in identity for a database whose own it may not read: random per
/// process, so a filter stamped with it is trusted only by the process that built it.
pub fn local() -> u128 {
    static LOCAL: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    *LOCAL.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let seed = format!("local:{t}:{}:{:p}", std::process::id(), &NODE);
        xxhash_rust::xxh3::xxh3_128(seed.as_bytes())
    })
}

/// A sync pass read in generation `generation` adopted `horizon` as its watermark: the next
/// transaction id of this history must never fall below it again (see [`High`]).
pub fn passed(generation: u64, horizon: i64) {
    let mut node = lock();
    if generation == GENERATION.load(Ordering::Acquire) && Some(horizon) > node.high.horizon {
        node.high.horizon = Some(horizon);
        node.high.horizon_at = next_seq();
    }
}

/// Times this node saw the database go back in time without a new timeline (INFO).
pub fn rollbacks() -> u64 {
    lock().rollbacks
}

/// On a connection about to build a filter (a rebuild's, not the main thread): learns the
/// database's identity there, and returns what the filter it builds carries: the database's
/// identity, this process's stand-in where the role may not read it, or nothing when it
/// could not be read now (the filter is then rebuilt, never trusted).
pub fn stamp(c: &mut Client) -> Option<u128> {
    learn(c);
    match node() {
        NodeDb::Known(id) | NodeDb::Unreadable(id) => Some(id),
        NodeDb::NotYet => None,
    }
}

/// At the start of every sync pass, on the pass's worker: learns the identity again. Behind a
/// pooler the module's connection outlives a failover, so a new connection alone would not
/// tell (docs/failover.md, "When a node reads it"). Returns the generation the pass runs in.
pub fn learn_for_pass(db: &mut super::Db) -> u64 {
    let _ = db.run(|c, _| {
        learn(c);
        Ok(())
    });
    generation()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(timeline: i32, token: &str) -> History {
        History {
            timeline,
            token: token.into(),
        }
    }

    #[test]
    fn timeline_one_keeps_the_identity_earlier_versions_stamped() {
        let base = "postgresql:7312:16384";
        let before = xxhash_rust::xxh3::xxh3_128(base.as_bytes());
        assert_eq!(compose(base, None), before);
        assert_eq!(compose(base, Some(&h(1, "a"))), before);
        assert_eq!(compose(base, Some(&h(1, "b"))), before);
    }

    #[test]
    fn a_history_seen_going_back_is_another_identity_on_timeline_one_too() {
        let base = "postgresql:7312:16384";
        let before = compose(base, Some(&h(1, "a")));
        let restored = compose(base, Some(&h(1, "restored-b")));
        assert_ne!(before, restored);
        assert_ne!(restored, compose(base, Some(&h(1, "restored-c"))));
    }

    #[test]
    fn only_a_server_behind_what_was_read_went_back() {
        let r = |flushed, next_xid| Reading { flushed, next_xid };
        let none = High::default();
        assert!(!went_back(none, r(Some(1), 1)), "nothing read yet");
        let high = High {
            flushed: Some(1000),
            horizon: Some(50),
            ..High::default()
        };
        assert!(!went_back(high, r(Some(1000), 50)), "where it was");
        assert!(!went_back(high, r(Some(2000), 90)), "further on");
        assert!(went_back(high, r(Some(999), 90)), "WAL behind");
        assert!(went_back(high, r(Some(2000), 49)), "ids below a watermark");
        assert!(
            !went_back(high, r(None, 50)),
            "a role refused the WAL position is judged by ids alone"
        );
        assert!(went_back(high, r(None, 10)));
    }

    #[test]
    fn a_reading_that_began_before_a_high_was_raised_proves_nothing() {
        let r = |flushed, next_xid| Reading { flushed, next_xid };
        // Raised at 10 (WAL) and 20 (a pass's horizon).
        let high = High {
            flushed: Some(1000),
            horizon: Some(50),
            flushed_at: 10,
            horizon_at: 20,
        };
        // Begun before both: a slower worker's older reading, not a server gone back.
        assert!(!went_back(high.before(5), r(Some(900), 40)));
        // Begun between: judged by the WAL position only.
        assert!(!went_back(high.before(15), r(Some(1000), 40)));
        assert!(went_back(high.before(15), r(Some(900), 90)));
        // Begun after both: judged by both.
        assert!(went_back(high.before(25), r(Some(1000), 40)));
        assert!(!went_back(high.before(25), r(Some(1000), 50)));
    }

    #[test]
    fn every_later_history_is_another_identity() {
        let base = "postgresql:7312:16384";
        let one = compose(base, Some(&h(1, "a")));
        let two_a = compose(base, Some(&h(2, "a")));
        let two_b = compose(base, Some(&h(2, "b")));
        let three_a = compose(base, Some(&h(3, "a")));
        assert_ne!(one, two_a);
        assert_ne!(two_a, two_b, "two promotions to the same timeline number");
        assert_ne!(two_a, three_a);
        assert_ne!(two_a, compose("postgresql:7313:16384", Some(&h(2, "a"))));
    }
}
