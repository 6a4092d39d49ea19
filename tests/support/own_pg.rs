//! `OwnPg`: a dedicated PostgreSQL cluster for one test, for fault tests that stop, kill and
//! restart the database.

use std::fs;

use super::pg_cluster::Cluster;

/// A dedicated PostgreSQL cluster for one test (fault tests that stop/start the server).
/// Connect to database `postgres`. Killed and removed on drop.
pub struct OwnPg {
    cluster: Cluster,
}

impl OwnPg {
    pub fn start_new() -> OwnPg {
        OwnPg {
            cluster: Cluster::create("member-ownpg"),
        }
    }

    /// A running cluster made elsewhere (a promoted standby), owned from now on.
    pub(super) fn adopt(cluster: Cluster) -> OwnPg {
        OwnPg { cluster }
    }

    pub fn port(&self) -> u16 {
        self.cluster.port
    }

    pub fn url(&self) -> String {
        self.cluster.url("postgres")
    }

    pub fn client(&self) -> postgres::Client {
        self.cluster.client("postgres")
    }

    /// The last `n` lines of the cluster's log, for a failure's message.
    pub fn log_tail(&self, n: usize) -> String {
        super::process::tail(&self.cluster.log_path(), n)
    }

    pub fn is_running(&self) -> bool {
        self.cluster.child.is_some()
    }

    /// Fast shutdown: SIGINT (clients are disconnected), escalating if needed; waits for exit.
    pub fn stop(&mut self) {
        self.cluster.stop();
    }

    /// Immediate shutdown (SIGQUIT, like a crash); waits for exit.
    pub fn kill(&mut self) {
        self.cluster.kill();
    }

    /// Starts again on the same port and data dir; waits until it accepts connections.
    pub fn start(&mut self) {
        if let Err(e) = self.cluster.try_start() {
            panic!("{e}");
        }
    }
}

impl Drop for OwnPg {
    fn drop(&mut self) {
        self.cluster.kill();
        let _ = fs::remove_dir_all(&self.cluster.base);
    }
}

impl OwnPg {
    /// A connection to database `postgres`, or why not (the cluster may be down).
    pub fn try_client(&self) -> Result<postgres::Client, postgres::Error> {
        self.cluster.try_client("postgres")
    }
}

/// A cold copy of an [`OwnPg`]'s data directory: what a storage snapshot, a VM image or a
/// filesystem snapshot brings back (same system identifier, same timeline, an older state).
pub struct ColdCopy {
    dir: std::path::PathBuf,
}

impl OwnPg {
    /// Stops the server, copies its data directory aside, and starts it again.
    pub fn cold_copy(&mut self) -> ColdCopy {
        self.stop();
        let dir = self.cluster.base.join("cold-copy");
        let _ = fs::remove_dir_all(&dir);
        copy_tree(&self.cluster.base.join("data"), &dir);
        self.start();
        ColdCopy { dir }
    }

    /// Stops the server, puts `copy` in place of its data directory, and starts it again on the
    /// same port: the database restored from a snapshot, with no new timeline.
    pub fn restore(&mut self, copy: &ColdCopy) {
        self.stop();
        let data = self.cluster.base.join("data");
        fs::remove_dir_all(&data).expect("remove the data directory");
        copy_tree(&copy.dir, &data);
        self.start();
    }
}

/// `cp -a`: the files keep their owner (the `postgres` user) and modes.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .expect("run cp");
    assert!(
        out.status.success(),
        "cp -a {from:?} {to:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
