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
