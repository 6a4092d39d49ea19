//! Helpers of the harness: waiting, free ports, temp dirs swept after killed runs, and spawning
//! children that die with the test process (see mod.rs).

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

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

pub(super) fn unique() -> String {
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
pub(super) fn make_temp_dir(prefix: &str, owner: Option<(u32, u32)>) -> PathBuf {
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
pub(super) fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Sets PR_SET_PDEATHSIG in the child. std applies uid/gid before `pre_exec` closures, which
/// matters: changing credentials clears the parent-death signal.
pub(super) fn set_pdeathsig(cmd: &mut Command, sig: libc::c_int) {
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
pub(super) fn spawn(cmd: Command) -> io::Result<Child> {
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

pub(super) fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// At process exit: a PostgreSQL postmaster of ours is told to quit at once (SIGQUIT), killed
/// if it has not gone within 5 s, reaped, and its directory removed.
pub(super) fn stop_postmaster_at_exit(pid: u32, base: &std::path::Path) {
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
    let _ = std::fs::remove_dir_all(base);
}

/// Waits for `child` to exit for up to `timeout`; true if it did.
pub(super) fn wait_child(child: &mut Child, timeout: Duration) -> bool {
    wait_until(timeout, || !matches!(child.try_wait(), Ok(None)))
}
