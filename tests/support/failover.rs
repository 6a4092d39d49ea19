//! `PgPair`: a dedicated primary and its asynchronous streaming standby (`pg_basebackup -R`),
//! for the failover tests (docs/failover.md): the standby is stopped so that it misses
//! transactions, the primary is killed, and the standby is started again and promoted. Each
//! test that fails over gets its own pair (a failover ends the primary's history); both are
//! killed and removed on drop.

use std::fs;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use super::pg_cluster::{postgres_ids, Cluster};
use super::process::make_temp_dir;
use super::{pg_bin, wait_until, OwnPg};

pub struct PgPair {
    primary: Cluster,
    standby: Cluster,
}

/// A second standby of the pair's primary, which nothing promotes: after the failover it
/// still follows the old history. Killed and removed on drop.
pub struct OtherStandby(Cluster);

impl OtherStandby {
    pub fn url(&self) -> String {
        self.0.url("postgres")
    }
}

impl Drop for OtherStandby {
    fn drop(&mut self) {
        self.0.kill();
        let _ = fs::remove_dir_all(&self.0.base);
    }
}

/// `pg_basebackup -R` of the server at `port` into a new dir, started: a streaming standby
/// of it (here, and the shared one of `standby.rs`).
pub(super) fn standby_of(port: u16) -> Cluster {
    let (uid, gid) = postgres_ids();
    // The prefix of `OwnPg` dirs: a dir left by a killed test process is swept.
    let base = make_temp_dir("member-ownpg", Some((uid, gid)));
    let out = Command::new(pg_bin("pg_basebackup"))
        .arg("-D")
        .arg(base.join("data"))
        .args(["-R", "-X", "stream", "--no-sync", "--checkpoint=fast"])
        .args(["-h", "127.0.0.1", "-U", "postgres", "-p"])
        .arg(port.to_string())
        .current_dir(&base)
        .uid(uid)
        .gid(gid)
        .output()
        .expect("run pg_basebackup (is PostgreSQL installed? scripts/install-deps.sh)");
    assert!(
        out.status.success(),
        "pg_basebackup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop_sslnegotiation(&base.join("data").join("postgresql.auto.conf"));
    let mut standby = Cluster {
        base,
        port: 0,
        child: None,
        extra: Vec::new(),
    };
    // A port picked by free_port() can be taken before postgres binds it.
    for attempt in 0.. {
        standby.port = super::free_port();
        match standby.try_start() {
            Ok(()) => break,
            Err(e) if attempt < 3 && e.contains("ould not") && e.contains("bind") => {}
            Err(e) => {
                let _ = fs::remove_dir_all(&standby.base);
                panic!("standby: {e}");
            }
        }
    }
    standby
}

/// `pg_basebackup -R` of 18 writes `sslnegotiation=postgres` (the default) into
/// `primary_conninfo`, which a 16 standby's libpq refuses: it starts, promotes, and never
/// streams (docs/operations.md). The default is dropped, as an operator must do there.
fn drop_sslnegotiation(auto_conf: &std::path::Path) {
    let Ok(text) = fs::read_to_string(auto_conf) else {
        return;
    };
    if text.contains("sslnegotiation=postgres") {
        let fixed = text
            .replace(" sslnegotiation=postgres", "")
            .replace("sslnegotiation=postgres ", "");
        fs::write(auto_conf, fixed).expect("rewrite postgresql.auto.conf");
    }
}

impl PgPair {
    /// A new primary, and a standby streaming from it, both running.
    pub fn start() -> PgPair {
        let primary = Cluster::create("member-ownpg");
        let standby = standby_of(primary.port);
        PgPair { primary, standby }
    }

    /// Another standby of the primary (before the failover).
    pub fn other_standby(&self) -> OtherStandby {
        OtherStandby(standby_of(self.primary.port))
    }

    /// The ports of the primary and of the standby.
    pub fn ports(&self) -> (u16, u16) {
        (self.primary.port, self.standby.port)
    }

    /// The libpq way to follow a failover: both hosts, and only the one that takes writes.
    pub fn url(&self) -> String {
        self.url_as("postgres", "postgres")
    }

    /// [`PgPair::url`] for database `db` as role `user`.
    pub fn url_as(&self, db: &str, user: &str) -> String {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user={user} dbname={db} \
             target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// A least-privilege role for the module, made on the primary (the standby replays it):
    /// it may log in and owns database `db`, nothing more. Returns [`PgPair::url_as`] for it.
    pub fn least_privilege(&self, db: &str) -> String {
        let mut p = self.primary();
        p.batch_execute(&format!("CREATE ROLE {db} LOGIN")).unwrap();
        p.batch_execute(&format!("CREATE DATABASE {db} OWNER {db}"))
            .unwrap();
        self.url_as(db, db)
    }

    /// A connection to the primary (before the failover), to database `postgres`.
    pub fn primary(&self) -> postgres::Client {
        self.primary.client("postgres")
    }

    /// A connection to database `db` of the primary, as the superuser.
    pub fn primary_db(&self, db: &str) -> postgres::Client {
        self.primary.client(db)
    }

    /// A connection to the standby (after the failover: the new primary).
    pub fn standby(&self) -> postgres::Client {
        self.standby.client("postgres")
    }

    /// A connection to database `db` of the standby, as the superuser.
    pub fn standby_db(&self, db: &str) -> postgres::Client {
        self.standby.client(db)
    }

    /// Waits until the standby has replayed every commit the primary made so far.
    pub fn wait_caught_up(&self) {
        wait_replayed(&mut self.primary(), &self.standby);
    }

    /// Stops the standby (fast shutdown): from now on it misses what the primary commits, as
    /// a disconnected or lagging standby does.
    pub fn stop_standby(&mut self) {
        self.standby.stop();
    }

    /// Kills the primary (immediate shutdown, like a crash), starts the standby again if it
    /// was stopped, and promotes it; returns once it takes writes on a new timeline.
    pub fn fail_over(&mut self) {
        self.primary.kill();
        promote(&mut self.standby);
    }
}

/// Waits until `standby` has replayed every commit `primary` made so far.
fn wait_replayed(primary: &mut postgres::Client, standby: &Cluster) {
    // Every commit made so far is before the insert position; the test clusters commit
    // asynchronously (`synchronous_commit=off`), so the WAL writer flushes, and the
    // walsender ships, that far within its `wal_writer_delay`.
    let lsn: String = primary
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .unwrap()
        .get(0);
    let mut s = standby.client("postgres");
    assert!(
        wait_until(Duration::from_secs(30), || {
            s.query_one(
                "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                &[&lsn],
            )
            .map(|r| r.get::<_, bool>(0))
            .unwrap_or(false)
        }),
        "the standby did not replay up to {lsn} within 30 s"
    );
}

/// Starts `standby` if it was stopped and promotes it; returns once it takes writes on a new
/// timeline.
fn promote(standby: &mut Cluster) {
    if standby.child.is_none() {
        if let Err(e) = standby.try_start() {
            panic!("restart the standby: {e}");
        }
    }
    let mut s = standby.client("postgres");
    let promoted: bool = s
        .query_one("SELECT pg_promote(true, 60)", &[])
        .unwrap()
        .get(0);
    assert!(promoted, "pg_promote() did not finish within 60 s");
    assert!(
        wait_until(Duration::from_secs(30), || {
            s.query_one("SELECT NOT pg_is_in_recovery()", &[])
                .map(|r| r.get::<_, bool>(0))
                .unwrap_or(false)
        }),
        "the promoted standby still in recovery"
    );
}

/// A streaming standby of an [`OwnPg`] (the chaos run's "pg-promote-behind" fault): stopped
/// so that it falls behind, then promoted in the place of the killed primary. Killed and
/// removed on drop unless promoted.
pub struct Standby(Option<Cluster>);

impl Standby {
    pub fn of(pg: &OwnPg) -> Standby {
        Standby(Some(standby_of(pg.port())))
    }

    /// Waits until it has replayed every commit of `primary` so far.
    pub fn wait_caught_up(&self, primary: &OwnPg) {
        wait_replayed(&mut primary.client(), self.0.as_ref().unwrap());
    }

    /// Fast shutdown: from now on it misses what the primary commits.
    pub fn stop(&mut self) {
        self.0.as_mut().unwrap().stop();
    }

    /// Starts it again and promotes it: the new primary, as an [`OwnPg`].
    pub fn promote(mut self) -> OwnPg {
        let mut c = self.0.take().unwrap();
        promote(&mut c);
        OwnPg::adopt(c)
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            c.kill();
            let _ = fs::remove_dir_all(&c.base);
        }
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for c in [&mut self.primary, &mut self.standby] {
            c.kill();
            let _ = fs::remove_dir_all(&c.base);
        }
    }
}
