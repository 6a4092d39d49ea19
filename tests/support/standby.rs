//! A streaming standby of the shared test cluster ([`Pg`]): `pg_basebackup -R` into a temp dir,
//! started on a free port once per test process (the first [`Standby::get`]), stopped and
//! removed at exit. It replicates every database the tests create, with the same roles.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::pg_cluster::Cluster;
use super::process::stop_postmaster_at_exit;
use super::{wait_until, Pg};

pub struct Standby {
    cluster: Cluster,
}

/// The running standby's pid and dir, for the exit hook.
static RUNNING: Mutex<Option<(u32, std::path::PathBuf)>> = Mutex::new(None);

extern "C" fn standby_atexit() {
    let Some((pid, base)) = RUNNING.lock().ok().and_then(|mut g| g.take()) else {
        return;
    };
    stop_postmaster_at_exit(pid, &base);
}

impl Standby {
    /// The standby of [`Pg::get`], made and started on first use.
    pub fn get() -> &'static Standby {
        static SB: OnceLock<Standby> = OnceLock::new();
        SB.get_or_init(|| {
            let cluster = super::failover::standby_of(Pg::get().port());
            let pid = cluster.child.as_ref().unwrap().id();
            RUNNING.lock().unwrap().replace((pid, cluster.base.clone()));
            // SAFETY: registering a plain extern "C" fn.
            unsafe {
                libc::atexit(standby_atexit);
            }
            Standby { cluster }
        })
    }

    /// Connection string for a database on the standby.
    pub fn url(&self, dbname: &str) -> String {
        self.cluster.url(dbname)
    }

    pub fn client(&self, dbname: &str) -> postgres::Client {
        self.cluster.client(dbname)
    }

    /// Waits until the standby has replayed everything the primary had inserted into its WAL
    /// when this was called (replay must not be paused).
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        // The walsender ships flushed WAL only, and without a commit the primary flushes
        // whole pages only: the records of a transaction still open (the test's "the standby
        // sees it start") could wait for ever. A transaction that takes an xid and commits
        // flushes everything written before its commit record.
        let mut primary = Pg::get().client("postgres");
        primary
            .batch_execute("SELECT pg_current_xact_id()")
            .unwrap();
        let lsn: String = primary
            .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
            .unwrap()
            .get(0);
        let mut c = self.client("postgres");
        wait_until(timeout, || {
            c.query_one(
                "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                &[&lsn],
            )
            .map(|r| r.get::<_, bool>(0))
            .unwrap_or(false)
        })
    }

    /// Pauses WAL replay and waits until it is paused: from now on the standby's snapshots
    /// see nothing the primary commits.
    pub fn pause(&self) {
        let mut c = self.client("postgres");
        c.batch_execute("SELECT pg_wal_replay_pause()").unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || {
                c.query_one("SELECT pg_get_wal_replay_pause_state()", &[])
                    .map(|r| r.get::<_, String>(0) == "paused")
                    .unwrap_or(false)
            }),
            "standby replay never paused"
        );
    }

    /// Resumes WAL replay.
    pub fn resume(&self) {
        self.client("postgres")
            .batch_execute("SELECT pg_wal_replay_resume()")
            .unwrap();
    }
}
