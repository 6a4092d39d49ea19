//! Test harness shared by the integration tests (`mod support;`).
//!
//! * [`Pg`] / [`fresh_db`]: one throwaway PostgreSQL cluster per test process, started lazily;
//!   every test gets its own database in it.
//! * [`OwnPg`]: a dedicated cluster for a fault test that stops and restarts PostgreSQL.
//! * [`Valkey`]: one valkey-server per test, with `libmember.so` loaded.
//! * [`cluster::Cluster`]: one cluster (3 primaries, 3 replicas) per test process.
//!
//! We run as root; PostgreSQL runs as the `postgres` user. All children are spawned from one
//! long-lived "spawner" thread with `PR_SET_PDEATHSIG`, because the parent-death signal fires
//! when the *thread* that forked exits (libtest runs each test on its own thread), not only when
//! the process does. Children therefore die with the test process and never before it.
#![allow(dead_code)]

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// small helpers

/// Polls `f` every 20 ms until it returns true or `timeout` passes. Returns the last result.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique() -> String {
    format!(
        "{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

const DIR_PREFIXES: [&str; 3] = ["member-pg-", "member-ownpg-", "member-valkey-"];

/// Removes temp dirs left by test processes that were killed (SIGKILL skips all cleanup).
fn sweep_stale_dirs() {
    let Ok(rd) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = DIR_PREFIXES.iter().find_map(|p| name.strip_prefix(p)) else {
            continue;
        };
        let Some(pid) = rest.split('_').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// Creates a fresh directory under the system temp dir, mode 0700, owned by `owner` if given.
fn make_temp_dir(prefix: &str, owner: Option<(u32, u32)>) -> PathBuf {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(sweep_stale_dirs);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", unique()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    if let Some((uid, gid)) = owner {
        let c = CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: plain syscall on a valid C string.
        let rc = unsafe { libc::chown(c.as_ptr(), uid, gid) };
        assert_eq!(
            rc,
            0,
            "chown {}: {}",
            dir.display(),
            io::Error::last_os_error()
        );
    }
    dir
}

/// Last `n` lines of a file (empty string if unreadable).
fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// uid/gid of the `postgres` system user.
fn postgres_ids() -> (u32, u32) {
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

/// Path of a PostgreSQL server binary: newest /usr/lib/postgresql/<v>/bin/<name>, else PATH.
pub fn pg_bin(name: &str) -> PathBuf {
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

/// Sets PR_SET_PDEATHSIG in the child. std applies uid/gid before `pre_exec` closures, which
/// matters: changing credentials clears the parent-death signal.
fn set_pdeathsig(cmd: &mut Command, sig: libc::c_int) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1); // the test process already died
            }
            Ok(())
        });
    }
}

type SpawnReq = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from a dedicated thread that lives as long as the process (see module docs).
fn spawn(cmd: Command) -> io::Result<Child> {
    static TX: OnceLock<Mutex<mpsc::Sender<SpawnReq>>> = OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnReq>();
        thread::Builder::new()
            .name("support-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn support-spawner thread");
        Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::channel();
    tx.lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, rtx))
        .expect("spawner thread gone");
    rrx.recv().expect("spawner thread gone")
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Waits for `child` to exit for up to `timeout`; true if it did.
fn wait_child(child: &mut Child, timeout: Duration) -> bool {
    wait_until(timeout, || !matches!(child.try_wait(), Ok(None)))
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

/// One PostgreSQL cluster: data in `<base>/data`, unix socket and log in `<base>`.
struct Cluster {
    base: PathBuf,
    port: u16,
    child: Option<Child>,
    /// Extra `postgres` arguments (from a [`Setup`]).
    extra: Vec<String>,
}

/// Prepares a new cluster's data dir before its first start (certificates, pg_hba.conf) and
/// returns extra `postgres` arguments. Files it writes are handed to the `postgres` user.
pub type Setup = fn(&Path) -> Vec<String>;

impl Cluster {
    /// initdb + start on a free port.
    fn create(prefix: &str) -> Cluster {
        Self::create_with(prefix, |_| Vec::new())
    }

    /// initdb, `setup`, then start on a free port.
    fn create_with(prefix: &str, setup: Setup) -> Cluster {
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

    fn log_path(&self) -> PathBuf {
        self.base.join("postgres.log")
    }

    fn try_start(&mut self) -> Result<(), String> {
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

    fn url(&self, dbname: &str) -> String {
        self.url_as(dbname, "postgres")
    }

    fn url_as(&self, dbname: &str, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname={dbname}",
            self.port
        )
    }

    fn try_client(&self, dbname: &str) -> Result<postgres::Client, postgres::Error> {
        let mut cfg: postgres::Config = self.url(dbname).parse()?;
        cfg.connect_timeout(Duration::from_secs(5));
        cfg.connect(postgres::NoTls)
    }

    fn client(&self, dbname: &str) -> postgres::Client {
        self.try_client(dbname)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url(dbname)))
    }

    /// Fast shutdown (SIGINT), escalating to SIGQUIT and SIGKILL.
    fn stop(&mut self) {
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
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGQUIT);
            if !wait_child(&mut child, Duration::from_secs(5)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// The per-process shared PostgreSQL cluster. Use [`fresh_db`] rather than this directly.
pub struct Pg {
    cluster: Cluster,
    pid: u32,
    admin: Mutex<Option<postgres::Client>>,
}

impl Pg {
    /// The shared cluster, started on first use; stopped and removed at process exit.
    pub fn get() -> &'static Pg {
        Self::get_with(|_| Vec::new())
    }

    /// The shared cluster, prepared by `setup` when this call starts it (a test file whose
    /// tests all call this with the same `setup` gets one cluster set up that way).
    pub fn get_with(setup: Setup) -> &'static Pg {
        static PG: OnceLock<Pg> = OnceLock::new();
        PG.get_or_init(|| {
            let cluster = Cluster::create_with("member-pg", setup);
            let pid = cluster.child.as_ref().unwrap().id();
            SHARED_PG
                .lock()
                .unwrap()
                .replace((pid, cluster.base.clone()));
            // SAFETY: registering a plain extern "C" fn.
            unsafe {
                libc::atexit(shared_pg_atexit);
            }
            Pg {
                cluster,
                pid,
                admin: Mutex::new(None),
            }
        })
    }

    pub fn port(&self) -> u16 {
        self.cluster.port
    }

    /// Connection string for a database of this cluster.
    pub fn url(&self, dbname: &str) -> String {
        self.cluster.url(dbname)
    }

    pub fn client(&self, dbname: &str) -> postgres::Client {
        self.cluster.client(dbname)
    }

    /// Creates a new empty database and returns its name.
    pub fn create_db(&self) -> String {
        self.admin_sql(|name| format!("CREATE DATABASE {name}"))
    }

    /// Creates a new empty database owned by `owner` (so that role may create tables in its
    /// `public` schema, as PostgreSQL 15 allows only the owner by default).
    pub fn create_db_owned_by(&self, owner: &str) -> String {
        self.admin_sql(|name| format!("CREATE DATABASE {name} OWNER {owner}"))
    }

    /// Runs the admin statement `sql(name)` for a new database name; returns the name.
    fn admin_sql(&self, sql: impl FnOnce(&str) -> String) -> String {
        let name = format!("t_{}", unique());
        // Serialized: one admin session creates every database (and the roles).
        let mut guard = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            *guard = Some(self.cluster.client("postgres"));
        }
        // The test roles exist in every cluster (roles are cluster-wide). A separate call:
        // CREATE DATABASE refuses to run in the implicit transaction of a multi-statement batch.
        let roles = format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{MODULE_ROLE}') THEN
                 CREATE ROLE {MODULE_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
               END IF;
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                 CREATE ROLE {APP_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
               END IF;
             END $$"
        );
        let sql = sql(&name);
        let admin = guard.as_mut().unwrap();
        admin
            .batch_execute(&roles)
            .unwrap_or_else(|e| panic!("{roles}: {e}"));
        admin
            .batch_execute(&sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        name
    }
}

/// A least-privilege role for the module: it may log in and owns its test database (so it
/// owns the tables it creates), but it is neither superuser nor a member of
/// `pg_read_all_stats`: it cannot see other roles' sessions in `pg_stat_activity`.
pub const MODULE_ROLE: &str = "member_mod";
/// An application role that writes rows into a set's table from outside the module.
pub const APP_ROLE: &str = "member_app";

static SHARED_PG: Mutex<Option<(u32, PathBuf)>> = Mutex::new(None);

extern "C" fn shared_pg_atexit() {
    let Some((pid, base)) = SHARED_PG.lock().ok().and_then(|mut g| g.take()) else {
        return;
    };
    signal(pid, libc::SIGQUIT);
    let mut status = 0;
    let reaped = wait_until(Duration::from_secs(5), || {
        // SAFETY: plain syscall; the child is ours.
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) != 0 }
    });
    if !reaped {
        signal(pid, libc::SIGKILL);
        // SAFETY: as above.
        unsafe {
            libc::waitpid(pid as libc::pid_t, &mut status, 0);
        }
    }
    let _ = fs::remove_dir_all(base);
}

/// A database of its own for one test, in the shared cluster.
pub struct TestDb {
    pub name: String,
}

/// Creates a new uniquely named database (`t_<pid>_<n>`) in the shared cluster.
pub fn fresh_db() -> TestDb {
    TestDb {
        name: Pg::get().create_db(),
    }
}

/// `fresh_db`, owned by [`MODULE_ROLE`] (created with [`APP_ROLE`] if missing).
pub fn fresh_db_owned_by_module_role() -> TestDb {
    TestDb {
        name: Pg::get().create_db_owned_by(MODULE_ROLE),
    }
}

impl TestDb {
    /// libpq key=value connection string (as the superuser `postgres`).
    pub fn url(&self) -> String {
        Pg::get().url(&self.name)
    }

    /// libpq key=value connection string as `user`.
    pub fn url_as(&self, user: &str) -> String {
        Pg::get().cluster.url_as(&self.name, user)
    }

    /// A session as the superuser `postgres`.
    pub fn client(&self) -> postgres::Client {
        Pg::get().client(&self.name)
    }

    /// A session as `user`.
    pub fn client_as(&self, user: &str) -> postgres::Client {
        let mut cfg: postgres::Config = self.url_as(user).parse().unwrap();
        cfg.connect_timeout(Duration::from_secs(5));
        cfg.connect(postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect as {user}: {e}"))
    }
}

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

    pub fn log(&self) -> String {
        fs::read_to_string(self.cluster.log_path()).unwrap_or_default()
    }
}

impl Drop for OwnPg {
    fn drop(&mut self) {
        self.cluster.kill();
        let _ = fs::remove_dir_all(&self.cluster.base);
    }
}

// ---------------------------------------------------------------------------------------------
// Valkey

/// `libmember.so` of the profile that built this test binary, which is
/// `target/<profile>/deps/<test>-<hash>`. `cargo test` (re)builds the cdylib as
/// `target/<profile>/deps/libmember.so` but only `cargo build` copies it up to
/// `target/<profile>/libmember.so`, so the deps one is preferred: it is never stale.
/// `MEMBER_MODULE` overrides both.
pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMBER_MODULE") {
        return PathBuf::from(p);
    }
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

/// One valkey-server for one test. Killed and its dir removed on drop.
pub struct Valkey {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// The full command line, so the server can be started again on the same dir and port.
    argv: Vec<std::ffi::OsString>,
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
        let module = module_path();
        assert!(
            module.exists(),
            "{} not found: run `cargo build` first (make test does)",
            module.display()
        );
        Self::launch(Some(&module), configs)
    }

    /// valkey-server without the module (harness self-test).
    pub fn start_plain() -> Valkey {
        Self::launch(None, &[])
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

    fn try_ping(&self) -> bool {
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

    /// The whole server log (for assertion messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("valkey.log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
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
pub mod cluster;
pub mod cluster_ops;
pub mod member;

// ---------------------------------------------------------------------------------------------
// Valkey lifecycle: stop, start again on the same dir and port, start expecting a failure

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
pub mod proxy;
pub mod source;
pub mod standby;
pub mod tls;

impl OwnPg {
    /// A connection to database `postgres`, or why not (the cluster may be down).
    pub fn try_client(&self) -> Result<postgres::Client, postgres::Error> {
        self.cluster.try_client("postgres")
    }
}
