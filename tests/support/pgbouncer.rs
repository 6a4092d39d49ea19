//! pgbouncer (Debian's, 1.18) in front of the shared test cluster ([`Pg`]), one per pooling
//! mode, started on a free port once per test process (the first [`Pgbouncer::get`] of a mode)
//! as the `postgres` user, and stopped with its directory at exit. Its configuration is the
//! stock one but for what a pooler must be told: where to listen, the server (every database,
//! `* =`), the pooling mode, and a user list for `auth_type = trust` (the cluster trusts
//! 127.0.0.1). `options` is not in `ignore_startup_parameters`: a client that sends startup
//! options is refused, as by any stock pgbouncer. A test that fails its server over starts an
//! [`OwnPgbouncer`] in front of its own pair (with `postgres` as its admin user, for
//! `PAUSE` and `RESUME`) and points it at the promoted standby.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::pg_cluster::postgres_ids;
use super::process::{make_temp_dir, set_pdeathsig, signal, spawn, tail};
use super::{free_port, Pg};

/// pgbouncer's `pool_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Session,
    Transaction,
    Statement,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Transaction => "transaction",
            Mode::Statement => "statement",
        }
    }
}

pub struct Pgbouncer {
    port: u16,
    base: PathBuf,
    pid: u32,
}

/// A pgbouncer of one test's own, in front of a server of its own (a failover pair's
/// primary), which [`OwnPgbouncer::retarget`] points at another server as an operator does
/// after a failover. Stopped, and its directory removed, on drop.
pub struct OwnPgbouncer(Pgbouncer);

/// The running pgbouncers' pids and dirs, for the exit hook.
static RUNNING: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

extern "C" fn pgbouncer_atexit() {
    let all = RUNNING
        .lock()
        .map(|mut g| std::mem::take(&mut *g))
        .unwrap_or_default();
    for (pid, base) in all {
        signal(pid, libc::SIGINT);
        let _ = std::fs::remove_dir_all(base);
    }
}

impl Pgbouncer {
    /// The pgbouncer of `mode` in front of [`Pg::get`], started on first use.
    pub fn get(mode: Mode) -> &'static Pgbouncer {
        static ALL: [OnceLock<Pgbouncer>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        ALL[mode as usize].get_or_init(|| start(mode, "", Pg::get().port(), &[]))
    }

    /// A pgbouncer in transaction pooling that accepts and drops the startup parameter
    /// `options` (`ignore_startup_parameters = options`, the usual workaround for clients
    /// that send it): what a client asked for there silently does not happen.
    pub fn ignoring_options() -> &'static Pgbouncer {
        static ONE: OnceLock<Pgbouncer> = OnceLock::new();
        ONE.get_or_init(|| {
            let extra = "ignore_startup_parameters = options\n";
            start(Mode::Transaction, extra, Pg::get().port(), &[])
        })
    }

    /// Connection string for a database through this pgbouncer, as the superuser.
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={dbname}",
            self.port
        )
    }

    /// The last lines of its log.
    pub fn log(&self) -> String {
        tail(&self.base.join("pgbouncer.log"), 40)
    }
}

impl OwnPgbouncer {
    /// A pgbouncer in `mode` in front of the server at `port`, which also knows the roles
    /// `users` (beside the superuser and the shared cluster's roles).
    pub fn start(mode: Mode, port: u16, users: &[&str]) -> OwnPgbouncer {
        OwnPgbouncer(start(mode, "admin_users = postgres\n", port, users))
    }

    /// Runs `command` on pgbouncer's admin console (`PAUSE`, `RESUME`).
    pub fn admin(&self, command: &str) {
        let mut c = postgres::Client::connect(&self.url("pgbouncer"), postgres::NoTls)
            .unwrap_or_else(|e| panic!("pgbouncer's admin console: {e}"));
        c.simple_query(command)
            .unwrap_or_else(|e| panic!("pgbouncer {command}: {e}\n{}", self.log()));
    }

    pub fn url(&self, dbname: &str) -> String {
        self.0.url(dbname)
    }

    /// [`Pgbouncer::url`] as role `user`.
    pub fn url_as(&self, dbname: &str, user: &str) -> String {
        self.url(dbname)
            .replace("user=postgres", &format!("user={user}"))
    }

    pub fn log(&self) -> String {
        self.0.log()
    }

    /// Points every database at the server on `port` and reloads the configuration (SIGHUP);
    /// returns once pgbouncer has read it. Its clients stay connected; new server
    /// connections go to `port`.
    pub fn retarget(&self, port: u16) {
        let ini = self.0.base.join("pgbouncer.ini");
        let text = std::fs::read_to_string(&ini).unwrap();
        let (head, rest) = text.split_once("\n\n").expect("the [databases] section");
        assert!(head.starts_with("[databases]\n* = "), "{head}");
        std::fs::write(&ini, format!("{}\n\n{rest}", databases(port))).unwrap();
        let log = self.0.base.join("pgbouncer.log");
        let reloads = || tail(&log, 100_000).matches("SIGHUP").count();
        let before = reloads();
        signal(self.0.pid, libc::SIGHUP);
        assert!(
            super::wait_until(Duration::from_secs(20), || reloads() > before),
            "pgbouncer never re-read its configuration:\n{}",
            self.log()
        );
    }
}

impl Drop for OwnPgbouncer {
    fn drop(&mut self) {
        signal(self.0.pid, libc::SIGINT);
        if let Ok(mut running) = RUNNING.lock() {
            running.retain(|(pid, _)| *pid != self.0.pid);
        }
        let _ = std::fs::remove_dir_all(&self.0.base);
    }
}

/// The `[databases]` section: every database on the server at `port`.
fn databases(port: u16) -> String {
    format!("[databases]\n* = host=127.0.0.1 port={port}")
}

fn start(mode: Mode, extra: &str, server_port: u16, users: &[&str]) -> Pgbouncer {
    let (uid, gid) = postgres_ids();
    let base = make_temp_dir("member-pgbouncer", Some((uid, gid)));
    let users_file = base.join("userlist.txt");
    let mut list = String::new();
    for u in ["postgres", super::MODULE_ROLE, super::APP_ROLE]
        .iter()
        .chain(users)
    {
        list.push_str(&format!("\"{u}\" \"\"\n"));
    }
    std::fs::write(&users_file, list).unwrap();
    let users = users_file;
    let log = base.join("pgbouncer.log");
    for attempt in 0.. {
        let port = free_port();
        let ini = base.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "{databases}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n{extra}",
                databases = databases(server_port),
                users = users.display(),
                mode = mode.name()
            ),
        )
        .unwrap();
        for f in [&ini, &users] {
            let _ = std::os::unix::fs::chown(f, Some(uid), Some(gid));
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut cmd = Command::new("/usr/sbin/pgbouncer");
        cmd.arg(&ini)
            .current_dir(&base)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .uid(uid)
            .gid(gid);
        set_pdeathsig(&mut cmd, libc::SIGINT);
        let mut child =
            spawn(cmd).expect("run pgbouncer (is it installed? scripts/install-deps.sh)");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                let why = tail(&log, 10);
                if attempt < 3 && why.contains("in use") {
                    break;
                }
                let _ = std::fs::remove_dir_all(&base);
                panic!("pgbouncer exited early ({st}):\n{why}");
            }
            let ready = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if ready {
                let mut running = RUNNING.lock().unwrap();
                if running.is_empty() {
                    // SAFETY: registering a plain extern "C" fn.
                    unsafe {
                        libc::atexit(pgbouncer_atexit);
                    }
                }
                running.push((child.id(), base.clone()));
                return Pgbouncer {
                    port,
                    base,
                    pid: child.id(),
                };
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen within 20 s:\n{}",
                tail(&log, 20)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    unreachable!()
}
