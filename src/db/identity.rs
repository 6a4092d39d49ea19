//! The identity of a database (`filter_origin`): read by each worker when it opens its
//! connection and kept as this node's (`NodeDb`), against which the main thread judges the
//! filters it loads; read by each rebuild on its own connection, and stamped on the filter.

use std::sync::Mutex;

use postgres::Client;

use crate::filter::origin::NodeDb;

static NODE: Mutex<NodeDb> = Mutex::new(NodeDb::NotYet);

/// The cluster's system identifier (the same on its physical standbys, another on any other
/// cluster, including one restored from a logical dump) and the database's oid (another for
/// every database of the cluster). `pg_control_system()` may be called by any role unless an
/// administrator revoked it.
const IDENTITY: &str = "SELECT system_identifier::text,
        (SELECT oid FROM pg_database WHERE datname = current_database())::int8
   FROM pg_control_system()";

/// What this node knows of its database now.
pub fn node() -> NodeDb {
    *NODE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The identity of the database `c` is connected to (one round trip; not on the main
/// thread).
pub fn read(c: &mut Client) -> Result<u128, postgres::Error> {
    c.query_one(IDENTITY, &[]).map(|row| {
        let sysid: String = row.get(0);
        let oid: i64 = row.get(1);
        xxhash_rust::xxh3::xxh3_128(format!("postgresql:{sysid}:{oid}").as_bytes())
    })
}

/// Worker thread, on a connection just opened to `member.pg-url`: reads the database's
/// identity and keeps it. A connection to another database (`member.pg-url` changed) replaces
/// it, so filters made from the old one are no longer trusted. A refusal to read it (the
/// function revoked or missing) makes the node stand in this process's own identity
/// ([`local`]) unless one is already known; any other failure (a timeout, a lost connection)
/// changes nothing, and the next connection or rebuild tries again.
pub(super) fn learn(c: &mut Client) {
    let read = read(c);
    let mut node = NODE.lock().unwrap_or_else(|e| e.into_inner());
    match read {
        Ok(id) => *node = NodeDb::Known(id),
        Err(e) if refused(&e) && !matches!(*node, NodeDb::Known(_)) => {
            *node = NodeDb::Unreadable(local())
        }
        Err(_) => {}
    }
}

/// The server refused the statement itself (it will answer the same next time), rather than
/// failing to run it.
fn refused(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::INSUFFICIENT_PRIVILEGE || *c == SqlState::UNDEFINED_FUNCTION
    })
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

/// Learns the identity on a worker's connection if no connection has yet (the first one
/// failed to read it): the sync loop calls it each pass, so a node never stays unsure.
pub fn learn_if_unknown(db: &mut super::Db) {
    if node() == NodeDb::NotYet {
        let _ = db.run(|c, _| {
            learn(c);
            Ok(())
        });
    }
}
