//! One PostgreSQL cluster process: initdb into a temp dir, start as the `postgres` user on a free
//! port (fsync off), connect, stop. The shared cluster (`pg`) and `OwnPg` are built on it.

use std::ffi::CString;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use super::process::{free_port, make_temp_dir, set_pdeathsig, signal, spawn, tail, wait_child};

/// uid/gid of the `postgres` system user.
pub(super) fn postgres_ids() -> (u32, u32) {
    static IDS: OnceLock<(u32, u32)> = OnceLock::new();
    *IDS.get_or_init(|| {
        let name = CString::new("postgres").unwrap();
        // SAFETY: getpwnam returns NULL or a pointer to a static passwd struct; we copy the ids
        // out immediately (under the OnceLock, so not concurrently with ourselves).
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        assert!(
            !pw.is_null(),
            "no `postgres` user: run scripts/install-deps.sh"
        );
        unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
    })
}

/// Path of a PostgreSQL binary: the first of `MEMBER_PG_BIN`'s dirs (colon-separated: `make
/// test`'s passes on PostgreSQL 16-18 name a pinned server's bin dir, then the pinned client
/// tools', scripts/postgres.sh) that has it, else the newest
/// /usr/lib/postgresql/<v>/bin/<name>, else PATH.
pub fn pg_bin(name: &str) -> PathBuf {
    if let Some(dirs) = std::env::var_os("MEMBER_PG_BIN") {
        for d in std::env::split_paths(&dirs) {
            let p = d.join(name);
            if p.exists() {
                return p;
            }
        }
    }
    let mut best: Option<(u32, PathBuf)> = None;
    if let Ok(rd) = fs::read_dir("/usr/lib/postgresql") {
        for e in rd.flatten() {
            let v: u32 = e.file_name().to_string_lossy().parse().unwrap_or(0);
            let p = e.path().join("bin").join(name);
            if p.exists() && best.as_ref().is_none_or(|(bv, _)| v > *bv) {
                best = Some((v, p));
            }
        }
    }
    best.map(|(_, p)| p).unwrap_or_else(|| PathBuf::from(name))
}

/// One PostgreSQL cluster: data in `<base>/data`, unix socket and log in `<base>`.
pub(super) struct Cluster {
    pub(super) base: PathBuf,
    pub(super) port: u16,
    pub(super) child: Option<Child>,
    /// Extra `postgres` arguments (from a [`Setup`]).
    pub(super) extra: Vec<String>,
}

/// Prepares a new cluster's data dir before its first start (certificates, pg_hba.conf) and
/// returns extra `postgres` arguments. Files it writes are handed to the `postgres` user.
pub type Setup = fn(&Path) -> Vec<String>;

impl Cluster {
    /// initdb + start on a free port.
    pub(super) fn create(prefix: &str) -> Cluster {
        Self::create_with(prefix, |_| Vec::new())
    }

    /// initdb, `setup`, then start on a free port.
    pub(super) fn create_with(prefix: &str, setup: Setup) -> Cluster {
        let (uid, gid) = postgres_ids();
        let base = make_temp_dir(prefix, Some((uid, gid)));
        let data = base.join("data");
        let out = Command::new(pg_bin("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .current_dir(&base)
            .uid(uid)
            .gid(gid)
            .output()
            .expect("run initdb (is PostgreSQL installed? scripts/install-deps.sh)");
        if !out.status.success() {
            let _ = fs::remove_dir_all(&base);
            panic!(
                "initdb failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let extra = setup(&data);
        for entry in fs::read_dir(&data).unwrap().flatten() {
            let _ = std::os::unix::fs::chown(entry.path(), Some(uid), Some(gid));
        }
        let mut c = Cluster {
            base,
            port: 0,
            child: None,
            extra,
        };
        // A port picked by free_port() can be taken by a concurrent test before postgres binds it.
        for attempt in 0.. {
            c.port = free_port();
            match c.try_start() {
                Ok(()) => return c,
                Err(e) if attempt < 3 && e.contains("ould not") && e.contains("bind") => continue,
                Err(e) => {
                    let _ = fs::remove_dir_all(&c.base);
                    panic!("{e}");
                }
            }
        }
        unreachable!()
    }

    pub(super) fn log_path(&self) -> PathBuf {
        self.base.join("postgres.log")
    }

    pub(super) fn try_start(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "postgres already running");
        let (uid, gid) = postgres_ids();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let mut cmd = Command::new(pg_bin("postgres"));
        cmd.arg("-D")
            .arg(self.base.join("data"))
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.base)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ])
            .args(&self.extra)
            .current_dir(&self.base)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .uid(uid)
            .gid(gid);
        set_pdeathsig(&mut cmd, libc::SIGQUIT);
        let child = spawn(cmd).map_err(|e| format!("spawn postgres: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(st)) = self.child.as_mut().unwrap().try_wait() {
                self.child = None;
                return Err(format!(
                    "postgres exited early ({st}); log tail:\n{}",
                    tail(&self.log_path(), 30)
                ));
            }
            if self.try_client("postgres").is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "postgres did not accept connections within 30 s; log tail:\n{}",
                    tail(&self.log_path(), 30)
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    pub(super) fn url(&self, dbname: &str) -> String {
        self.url_as(dbname, "postgres")
    }

    pub(super) fn url_as(&self, dbname: &str, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname={dbname}",
            self.port
        )
    }

    pub(super) fn try_client(&self, dbname: &str) -> Result<postgres::Client, postgres::Error> {
        let mut cfg: postgres::Config = self.url(dbname).parse()?;
        cfg.connect_timeout(Duration::from_secs(5));
        cfg.connect(postgres::NoTls)
    }

    pub(super) fn client(&self, dbname: &str) -> postgres::Client {
        self.try_client(dbname)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url(dbname)))
    }

    /// Fast shutdown (SIGINT), escalating to SIGQUIT and SIGKILL.
    pub(super) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            for (sig, secs) in [(libc::SIGINT, 10), (libc::SIGQUIT, 5), (libc::SIGKILL, 5)] {
                signal(child.id(), sig);
                if wait_child(&mut child, Duration::from_secs(secs)) {
                    break;
                }
            }
            let _ = child.wait();
        }
    }

    /// Immediate shutdown (SIGQUIT), escalating to SIGKILL.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGQUIT);
            if !wait_child(&mut child, Duration::from_secs(5)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}
