//! `member_nodes`: what each node says of itself to the database every node of a deployment
//! shares (its run id, port, role and ring of keys by `id:fingerprint`), so that any node can
//! tell which nodes hold a key before a rotation needs it everywhere (docs/security.md, "Key
//! rings"). A node not heard from for a while is not counted.

use std::time::Duration;

use postgres::types::Type;

use crate::db::{Db, DbErr};

/// The table, made with the catalog (under its advisory lock).
pub(super) const NODES_DDL: &str = "CREATE TABLE IF NOT EXISTS member_nodes (
    node text PRIMARY KEY,
    port integer NOT NULL,
    role text NOT NULL,
    ring text NOT NULL,
    serving text NOT NULL DEFAULT '',
    seen_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE member_nodes ADD COLUMN IF NOT EXISTS covered text NOT NULL DEFAULT '',
                         ADD COLUMN IF NOT EXISTS draining text NOT NULL DEFAULT '',
                         ADD COLUMN IF NOT EXISTS cluster_id text NOT NULL DEFAULT '',
                         ADD COLUMN IF NOT EXISTS rotation_level integer NOT NULL DEFAULT 0";

/// What this build does while a set's key rotates, in its report: 1 since a lookup asks the
/// database for both forms of an item, a filter build reads the old form from `twin` and an
/// ADD stores one row of the new form (docs/rotation-in-place.md, steps 1 to 3). A build
/// before wrote no level (0): it asks for the old form alone, and would miss an item a newer
/// node added during a rotation, so a rotation does not start while such a node reports.
/// 2 since a rotation rewrites rows in place (its phase `rewriting`, which a build of level
/// 1 does not know: it would serve the old form alone, and miss every row rewritten).
pub const ROTATION_LEVEL: i32 = 2;

/// Reports older than this are deleted by the next report of any node.
const FORGOTTEN_AFTER_S: f64 = 86_400.0;

/// What a node says of itself.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeReport {
    /// The server's run id (`INFO server`): new at every start.
    pub node: String,
    /// In a cluster, the node's id there (`CLUSTER MYID`), which a restart keeps: the report
    /// replaces the one the node made before it (a killed node's report would otherwise be
    /// counted, as a node that lacks what a rotation waits for, until it grows stale). Empty
    /// outside a cluster.
    pub cluster_id: String,
    pub port: i32,
    /// `primary` or `replica`.
    pub role: &'static str,
    /// The ring's keys in its order, as `(id, fingerprint)`.
    pub ring: Vec<(String, String)>,
    /// The sets whose key rotates, with the length of the chain this node computes for each:
    /// a rotation drains the old forms once every node computes the new one.
    pub serving: Vec<(String, usize)>,
    /// The rotating sets whose filter here covers the rotation's end, with the new chain's
    /// length: in a cluster, nodes switch once every node's does (docs/security.md).
    pub covered: Vec<(String, usize)>,
    /// The rotating sets whose drain this node follows (its writes store the new form
    /// alone), with the new chain's length: the drain ends (the twin column dropped, old
    /// forms refused) once every node's report names the set here.
    pub draining: Vec<(String, usize)>,
}

/// A report as read back, with how long ago the database took it.
#[derive(Clone, Debug)]
pub struct NodeSeen {
    pub node: String,
    pub port: i32,
    pub role: String,
    pub ring: Vec<(String, String)>,
    pub seen_ms_ago: i64,
}

/// Writes this node's report (the database's clock stamps it) in place of the one its cluster
/// id made before a restart, and forgets reports a day old.
pub fn report(db: &mut Db, r: &NodeReport) -> Result<(), DbErr> {
    let ring = ring_text(&r.ring);
    let serving = forms_text(&r.serving);
    let covered = forms_text(&r.covered);
    let draining = forms_text(&r.draining);
    db.run(|c, st| {
        st.query(
            c,
            "WITH gone AS (DELETE FROM member_nodes
                            WHERE seen_at < now() - make_interval(secs => $5)
                               OR ($9 <> '' AND cluster_id = $9 AND node <> $1))
             INSERT INTO member_nodes (node, port, role, ring, serving, covered, draining,
                                       cluster_id, rotation_level, seen_at)
             VALUES ($1, $2, $3, $4, $6, $7, $8, $9, $10, now())
             ON CONFLICT (node) DO UPDATE
                SET port = EXCLUDED.port, role = EXCLUDED.role, ring = EXCLUDED.ring,
                    cluster_id = EXCLUDED.cluster_id,
                    serving = EXCLUDED.serving, covered = EXCLUDED.covered,
                    draining = EXCLUDED.draining, rotation_level = EXCLUDED.rotation_level,
                    seen_at = EXCLUDED.seen_at",
            &[
                (&r.node, Type::TEXT),
                (&r.port, Type::INT4),
                (&r.role, Type::TEXT),
                (&ring, Type::TEXT),
                (&FORGOTTEN_AFTER_S, Type::FLOAT8),
                (&serving, Type::TEXT),
                (&covered, Type::TEXT),
                (&draining, Type::TEXT),
                (&r.cluster_id, Type::TEXT),
                (&ROTATION_LEVEL, Type::INT4),
            ],
        )
    })
    .map(drop)
}

/// The nodes heard from within `fresh`, by run id.
pub fn nodes(db: &mut Db, fresh: Duration) -> Result<Vec<NodeSeen>, DbErr> {
    let secs = fresh.as_secs_f64();
    let rows = db.run(|c, st| {
        st.query(
            c,
            "SELECT node, port, role, ring,
                    (EXTRACT(EPOCH FROM (now() - seen_at)) * 1000)::int8
               FROM member_nodes
              WHERE seen_at >= now() - make_interval(secs => $1)
              ORDER BY node",
            &[(&secs, Type::FLOAT8)],
        )
    })?;
    Ok(rows
        .iter()
        .map(|r| NodeSeen {
            node: r.get(0),
            port: r.get(1),
            role: r.get(2),
            ring: parse_ring(r.get(3)),
            seen_ms_ago: r.get::<_, i64>(4).max(0),
        })
        .collect())
}

/// What a node's report must name for [`nodes_lacking`].
pub enum Needed<'a> {
    /// The key of this fingerprint in its ring.
    Key(&'a str),
    /// This chain length for this set (a rotating set's form it computes).
    Form(&'a str, usize),
    /// A filter that covers the end of this set's rotation to this chain length.
    Covered(&'a str, usize),
    /// The drain of this set's rotation to this chain length followed.
    Draining(&'a str, usize),
}

/// The nodes heard from within `fresh` whose report does not name `needed`, by run id.
pub fn nodes_lacking(db: &mut Db, needed: Needed, fresh: Duration) -> Result<Vec<String>, DbErr> {
    let secs = fresh.as_secs_f64();
    let (column, pattern) = match needed {
        Needed::Key(fp) => ("ring", format!("%:{fp},%")),
        Needed::Form(set, n) => ("serving", format!("%,{set}:{n},%")),
        Needed::Covered(set, n) => ("covered", format!("%,{set}:{n},%")),
        Needed::Draining(set, n) => ("draining", format!("%,{set}:{n},%")),
    };
    let sql = format!(
        "SELECT node FROM member_nodes
          WHERE seen_at >= now() - make_interval(secs => $1)
            AND NOT (',' || {column} || ',') LIKE $2
          ORDER BY node"
    );
    let rows =
        db.run(|c, st| st.query(c, &sql, &[(&secs, Type::FLOAT8), (&pattern, Type::TEXT)]))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The nodes heard from within `fresh` whose build is older than [`ROTATION_LEVEL`], by run id.
pub fn nodes_older(db: &mut Db, fresh: Duration) -> Result<Vec<String>, DbErr> {
    let secs = fresh.as_secs_f64();
    let rows = db.run(|c, st| {
        st.query(
            c,
            "SELECT node FROM member_nodes
              WHERE seen_at >= now() - make_interval(secs => $1) AND rotation_level < $2
              ORDER BY node",
            &[(&secs, Type::FLOAT8), (&ROTATION_LEVEL, Type::INT4)],
        )
    })?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// `set:n,set:n` (set names hold neither `:` nor `,`).
fn forms_text(forms: &[(String, usize)]) -> String {
    forms
        .iter()
        .map(|(set, n)| format!("{set}:{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `id:fp,id:fp` (ids and fingerprints hold neither `:` nor `,`: token_ring.rs).
fn ring_text(ring: &[(String, String)]) -> String {
    ring.iter()
        .map(|(id, fp)| format!("{id}:{fp}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_ring(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|e| e.split_once(':'))
        .map(|(id, fp)| (id.to_string(), fp.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_reads_back_as_written() {
        let ring = vec![
            ("k2".to_string(), "9f1c0a0b0c0d0e0f".to_string()),
            ("default".to_string(), "65f7a7b40fd60798".to_string()),
        ];
        assert_eq!(
            ring_text(&ring),
            "k2:9f1c0a0b0c0d0e0f,default:65f7a7b40fd60798"
        );
        assert_eq!(parse_ring(&ring_text(&ring)), ring);
        assert!(parse_ring(&ring_text(&[])).is_empty());
    }
}
