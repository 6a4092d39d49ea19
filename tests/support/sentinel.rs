//! Debian's `valkey-sentinel` watching one primary (quorum 1): it promotes a replica when the
//! primary stops answering, and turns the old primary into a replica when it comes back.
//! Killed on drop.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::process::{free_port, make_temp_dir, set_pdeathsig, spawn, tail, wait_until};

/// The name the primary is monitored under.
pub const NAME: &str = "member";

pub struct Sentinel {
    dir: PathBuf,
    port: u16,
    child: Child,
}

impl Sentinel {
    /// Watches the primary at `127.0.0.1:primary`, calling it down after `down_ms` without an
    /// answer. Returns once the sentinel answers and knows `replicas` replicas of it.
    pub fn start(primary: u16, down_ms: u64, replicas: usize) -> Sentinel {
        let dir = make_temp_dir("member-sentinel", None);
        let port = free_port();
        let conf = dir.join("sentinel.conf");
        fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {}\n\
                 logfile {}\n\
                 sentinel monitor {NAME} 127.0.0.1 {primary} 1\n\
                 sentinel down-after-milliseconds {NAME} {down_ms}\n\
                 sentinel failover-timeout {NAME} 10000\n\
                 sentinel parallel-syncs {NAME} 2\n",
                dir.display(),
                dir.join("sentinel.log").display()
            ),
        )
        .expect("write sentinel.conf");
        let mut cmd = Command::new("valkey-sentinel");
        cmd.arg(&conf)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        set_pdeathsig(&mut cmd, libc::SIGKILL);
        let child = spawn(cmd).expect("spawn valkey-sentinel (scripts/install-deps.sh)");
        let mut s = Sentinel { dir, port, child };
        assert!(
            wait_until(Duration::from_secs(30), || s.replicas() == Some(replicas)),
            "the sentinel never saw {replicas} replicas: {:?}\n{}",
            s.replicas(),
            s.log()
        );
        s
    }

    fn conn(&self) -> Option<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).ok()?;
        let c = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        Some(c)
    }

    /// The port of the primary the sentinel names now.
    pub fn primary(&self) -> Option<u16> {
        let mut c = self.conn()?;
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(NAME)
            .query(&mut c)
            .ok()?;
        addr.get(1)?.parse().ok()
    }

    fn replicas(&mut self) -> Option<usize> {
        let mut c = self.conn()?;
        let v: Vec<redis::Value> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(NAME)
            .query(&mut c)
            .ok()?;
        Some(v.len())
    }

    pub fn log(&self) -> String {
        tail(&self.dir.join("sentinel.log"), 40)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
