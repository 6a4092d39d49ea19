//! `Valkey`: one valkey-server (or `MEMBER_SERVER`) per test with libmember loaded, in a temp dir
//! of its own; killed and removed on drop. Restarting it is in `valkey_lifecycle.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::process::{free_port, make_temp_dir, set_pdeathsig, spawn, tail};

/// The module the tests load: `MEMBER_MODULE` when set (`make test` points it at the release
/// build, the one the package ships), else [`debug_module_path`].
pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMBER_MODULE") {
        return PathBuf::from(p);
    }
    debug_module_path()
}

/// `libmember.so` of the profile that built this test binary, which is
/// `target/<profile>/deps/<test>-<hash>`: `cargo build` writes the cdylib as
/// `target/<profile>/deps/libmember.so` and copies it up to `target/<profile>/libmember.so`;
/// the deps one is preferred. For the tests that need what only a debug build has (the
/// failpoints of `src/db/sql`), whatever `MEMBER_MODULE` says.
pub fn debug_module_path() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a parent dir");
    let beside = deps.join("libmember.so");
    if beside.exists() {
        return beside;
    }
    deps.parent().unwrap_or(deps).join("libmember.so")
}

/// The server binary the tests run: `valkey-server`, or `MEMBER_SERVER` (for example
/// `redis-server`, the second target).
pub fn server_binary() -> String {
    std::env::var("MEMBER_SERVER").unwrap_or_else(|_| "valkey-server".to_string())
}

/// The server under test as it says of itself in `INFO server`: Valkey (which shows
/// `valkey_version`; its `redis_version` is a fixed compatibility number) or Redis, and the
/// version. Tests that do not apply to every server decide from this, never from the reply
/// they are about to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerVersion {
    pub valkey: bool,
    /// (major, minor, patch)
    pub version: (u32, u32, u32),
}

impl ServerVersion {
    /// Redis at `at` or later (false on Valkey).
    pub fn redis_at_least(&self, at: (u32, u32, u32)) -> bool {
        !self.valkey && self.version >= at
    }
    /// Valkey at `at` or later (false on Redis).
    pub fn valkey_at_least(&self, at: (u32, u32, u32)) -> bool {
        self.valkey && self.version >= at
    }
}

impl std::fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.version;
        let name = if self.valkey { "Valkey" } else { "Redis" };
        write!(f, "{name} {a}.{b}.{c}")
    }
}

/// Reads [`ServerVersion`] from `INFO server` (panics, naming the field, when it cannot).
pub fn server_version(c: &mut redis::Connection) -> ServerVersion {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(c)
        .unwrap_or_else(|e| panic!("INFO server: {e}"));
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_string())
    };
    let (valkey, text) = match field("valkey_version") {
        Some(v) => (true, v),
        None => (
            false,
            field("redis_version")
                .expect("INFO server shows neither valkey_version nor redis_version"),
        ),
    };
    let n: Vec<u32> = text
        .split('.')
        .map(|p| {
            p.parse()
                .unwrap_or_else(|e| panic!("version {text:?}: {e}"))
        })
        .collect();
    assert_eq!(n.len(), 3, "version {text:?}");
    ServerVersion {
        valkey,
        version: (n[0], n[1], n[2]),
    }
}

/// One valkey-server for one test. Killed and its dir removed on drop.
pub struct Valkey {
    pub(super) child: Child,
    pub(super) port: u16,
    pub(super) dir: PathBuf,
    /// The full command line, so the server can be started again on the same dir and port.
    pub(super) argv: Vec<std::ffi::OsString>,
}

/// Starts valkey-server with libmember loaded, `member.pg-url` = `pg_url` and the `extra` configs.
pub fn start_with(pg_url: &str, extra: &[(&str, &str)]) -> Valkey {
    let mut cfg = vec![("member.pg-url", pg_url)];
    cfg.extend_from_slice(extra);
    Valkey::start(&cfg)
}

impl Valkey {
    /// valkey-server with libmember loaded and `configs` passed as `--name value`.
    pub fn start(configs: &[(&str, &str)]) -> Valkey {
        Self::start_module(&module_path(), configs)
    }

    /// valkey-server with the libmember at `module` loaded.
    pub fn start_module(module: &Path, configs: &[(&str, &str)]) -> Valkey {
        assert!(
            module.exists(),
            "{} not found: run `cargo build` first (make test does)",
            module.display()
        );
        Self::launch(Some(module), configs)
    }

    /// valkey-server without the module (harness self-test).
    pub fn start_plain() -> Valkey {
        Self::launch(None, &[])
    }

    /// valkey-server without the module, with `configs` passed as `--name value`.
    pub fn start_plain_with(configs: &[(&str, &str)]) -> Valkey {
        Self::launch(None, configs)
    }

    fn launch(module: Option<&Path>, configs: &[(&str, &str)]) -> Valkey {
        let mut last_err = String::new();
        for _attempt in 0..3 {
            match Self::try_launch(module, configs) {
                Ok(v) => return v,
                // Lost a race for the port: pick another.
                Err(e) if e.contains("Address already in use") => last_err = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last_err}")
    }

    fn try_launch(module: Option<&Path>, configs: &[(&str, &str)]) -> Result<Valkey, String> {
        let dir = make_temp_dir("member-valkey", None);
        let port = free_port();
        let logfile = dir.join("valkey.log");
        let out = fs::File::create(dir.join("stdout.log")).unwrap();
        let mut cmd = Command::new(server_binary());
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(&logfile);
        if let Some(m) = module {
            cmd.arg("--loadmodule").arg(m);
        }
        for (name, value) in configs {
            cmd.arg(format!("--{name}")).arg(value);
        }
        cmd.current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        set_pdeathsig(&mut cmd, libc::SIGKILL);
        let argv: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_owned()).collect();
        let child = match spawn(cmd) {
            Ok(c) => c,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(format!("spawn valkey-server (installed?): {e}"));
            }
        };
        let mut v = Valkey {
            child,
            port,
            dir,
            argv,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = v.child.try_wait() {
                return Err(format!(
                    "valkey-server exited early ({st}); output:\n{}\nlog tail:\n{}",
                    tail(&v.dir.join("stdout.log"), 20),
                    tail(&logfile, 40)
                ));
            }
            if v.try_ping() {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "valkey-server did not answer PING within 20 s; log tail:\n{}",
                    tail(&logfile, 40)
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn try_ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
            return false;
        };
        let _ = con.set_read_timeout(Some(Duration::from_secs(2)));
        redis::cmd("PING").query::<String>(&mut con).is_ok()
    }

    /// A new connection (60 s read/write timeout so a stuck command fails instead of hanging).
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).unwrap();
        let con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to valkey: {e}\nlog tail:\n{}", self.log_tail()));
        con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        con.set_write_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        con
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The whole server log (for assertion messages, and the checks that it names no crash).
    /// Panics when the log cannot be read: an empty string would pass every such check. Bytes
    /// that are not UTF-8 (a hostile name the server logged) are kept as U+FFFD, not dropped.
    pub fn log(&self) -> String {
        let path = self.dir.join("valkey.log");
        let bytes = fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub(super) fn log_tail(&self) -> String {
        tail(&self.dir.join("valkey.log"), 40)
    }

    /// True while the server process is alive (false after a crash).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Valkey {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
