//! Valkey lifecycle: stop (SIGKILL or SHUTDOWN), start again on the same dir and port, start
//! expecting a failure.

use std::ffi::OsString;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::process::{set_pdeathsig, spawn, wait_child};
use super::valkey::{server_binary, Valkey};

impl Valkey {
    /// The server's working directory (`dump.rdb`, `appendonlydir/`, `valkey.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server with SIGKILL (no save, no shutdown work) and waits for it to die.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `SHUTDOWN <args>` (e.g. `["NOSAVE"]`) and waits up to 20 s for the process to exit.
    pub fn shutdown(&mut self, args: &[&str]) {
        if let Ok(mut con) = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        {
            // The server closes the connection instead of replying.
            let _ = redis::cmd("SHUTDOWN")
                .arg(args)
                .query::<redis::Value>(&mut con);
        }
        assert!(
            wait_child(&mut self.child, Duration::from_secs(20)),
            "valkey-server did not exit after SHUTDOWN {args:?}; log tail:\n{}",
            self.log_tail()
        );
    }

    /// As [`Valkey::start_expecting_exit`], with the command line changed by `edit` for this
    /// one start (say, a refused config added); the next restart uses the original again.
    pub fn start_edited_expecting_exit(
        &mut self,
        edit: impl FnOnce(&mut Vec<OsString>),
        timeout: Duration,
    ) -> Option<std::process::ExitStatus> {
        let original = self.argv.clone();
        edit(&mut self.argv);
        let status = self.start_expecting_exit(timeout);
        self.argv = original;
        status
    }

    /// Spawns the same command line (same dir, port, module and configs) again. The old
    /// process must have exited.
    fn respawn(&mut self) {
        assert!(
            !self.is_running(),
            "respawn: the old valkey-server is still running"
        );
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdout.log"))
            .unwrap();
        let mut cmd = Command::new(server_binary());
        cmd.args(&self.argv)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        set_pdeathsig(&mut cmd, libc::SIGKILL);
        self.child = spawn(cmd).expect("spawn valkey-server");
    }

    /// Starts the stopped server again on the same dir and port and waits until it answers
    /// PING (which it does only once the RDB or AOF is loaded). Panics with the log tail if
    /// it exits or does not answer within 30 s.
    pub fn restart(&mut self) {
        self.respawn();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "valkey-server exited during restart ({st}); log tail:\n{}",
                    self.log_tail()
                );
            }
            if self.try_ping() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "restarted valkey-server did not answer PING within 30 s; log tail:\n{}",
                self.log_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, then [`Valkey::restart`] on the same dir.
    pub fn kill9_and_restart(&mut self) {
        self.kill9();
        self.restart();
    }

    /// Starts the stopped server again on the same dir for a start-up that is expected to
    /// fail (say, a corrupt data file): waits up to `timeout` for the process to exit and
    /// returns its status, or `None` if it is still running then (it is killed on drop).
    pub fn start_expecting_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.respawn();
        if wait_child(&mut self.child, timeout) {
            self.child.try_wait().ok().flatten()
        } else {
            None
        }
    }
}
