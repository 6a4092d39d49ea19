//! The identity of a database (`filter_origin`): read by each worker when it opens its
//! connection and kept as this node's (`NodeDb`), against which the main thread judges the
//! filters it loads; read by each rebuild on its own connection, and stamped on the filter.

use std::sync::Mutex;

use postgres::Client;

use crate::filter_origin::NodeDb;

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
/// it, so filters made from the old one are no longer trusted. A refusal by the server is
/// recorded as unreadable unless an identity is already known; a lost connection changes
/// nothing.
pub(super) fn learn(c: &mut Client) {
    let read = read(c);
    let mut node = NODE.lock().unwrap_or_else(|e| e.into_inner());
    match read {
        Ok(id) => *node = NodeDb::Known(id),
        // The server answered with a refusal (a revoked function, not PostgreSQL): it will
        // answer the same next time.
        Err(e) if e.as_db_error().is_some() && *node == NodeDb::NotYet => {
            *node = NodeDb::Unreadable
        }
        Err(_) => {}
    }
}
