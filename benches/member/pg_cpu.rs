//! CPU time used by the bench's own PostgreSQL cluster, read from the kernel's counters of its
//! processes (the postmaster and its children: backends, workers, checkpointer…) in /proc.

use std::collections::HashMap;

/// The processes of one PostgreSQL cluster, found through its postmaster.
pub(crate) struct PgCpu {
    postmaster: u32,
    /// Nanoseconds per clock tick of /proc/<pid>/stat.
    tick_ns: u64,
}

/// CPU used by the cluster up to one moment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuSample {
    /// utime + stime of every live process (clock ticks, as /proc/<pid>/stat has them), plus
    /// the postmaster's cutime + cstime: the processes that exited and it reaped.
    pub(crate) ticks: u64,
    /// The same, with each live process' time from /proc/<pid>/schedstat (nanoseconds on the
    /// CPU) instead of its ticks; the reaped ones still count by ticks.
    pub(crate) ns: u64,
    /// Processes counted (postmaster included).
    pub(crate) procs: usize,
}

impl CpuSample {
    /// Milliseconds between `self` (before) and `after`, by the precise counters.
    pub(crate) fn ms_to(&self, after: &CpuSample) -> f64 {
        after.ns.saturating_sub(self.ns) as f64 / 1e6
    }
}

/// Fields of /proc/<pid>/stat after "(comm)", 1-based as in proc(5): state is 3.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // Field 3 (state) is a letter: keep the positions by mapping it to 0.
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    (f.len() >= 15).then_some(f)
}

/// proc(5) field `i` (1-based) out of `stat_fields`.
fn field(f: &[u64], i: usize) -> u64 {
    f[i - 3]
}

/// Nanoseconds the task has run on a CPU (first field of /proc/<pid>/schedstat).
fn schedstat_ns(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl PgCpu {
    /// The cluster `pg` is connected to: its data directory's `postmaster.pid` names the
    /// postmaster, and must be the parent of this session's own backend.
    pub(crate) fn of(pg: &mut postgres::Client) -> PgCpu {
        let dir: String = pg
            .query_one("SHOW data_directory", &[])
            .expect("SHOW data_directory")
            .get(0);
        let pidfile = format!("{dir}/postmaster.pid");
        let postmaster: u32 = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("read {pidfile}: {e}"))
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no pid in {pidfile}"));
        let backend: i32 = pg
            .query_one("SELECT pg_backend_pid()", &[])
            .expect("pg_backend_pid")
            .get(0);
        let ppid = stat_fields(backend as u32).map(|f| field(&f, 4) as u32);
        assert_eq!(
            ppid,
            Some(postmaster),
            "backend {backend} is not a child of the postmaster {postmaster} of {pidfile}"
        );
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        PgCpu {
            postmaster,
            tick_ns: 1_000_000_000 / hz,
        }
    }

    /// CPU used so far by the postmaster, its live children and its reaped children.
    pub(crate) fn sample(&self) -> CpuSample {
        let mut parent: HashMap<u32, u32> = HashMap::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Some(f) = stat_fields(pid) {
                parent.insert(pid, field(&f, 4) as u32);
            }
        }
        let mut s = CpuSample::default();
        let procs = parent
            .iter()
            .filter(|(pid, pp)| **pid == self.postmaster || **pp == self.postmaster)
            .map(|(pid, _)| *pid);
        for pid in procs {
            let Some(f) = stat_fields(pid) else { continue };
            let own = field(&f, 14) + field(&f, 15);
            // Reaped children's time: the postmaster's own children (backends have none).
            let reaped = field(&f, 16) + field(&f, 17);
            s.ticks += own + reaped;
            s.ns += schedstat_ns(pid).unwrap_or(own * self.tick_ns) + reaped * self.tick_ns;
            s.procs += 1;
        }
        s
    }

    /// Per process (its title, as `ps` shows it, and nanoseconds on the CPU so far), for telling
    /// where the cluster's time goes.
    pub(crate) fn by_process(&self) -> HashMap<u32, (String, u64)> {
        let mut out = HashMap::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Some(f) = stat_fields(pid) else { continue };
            if pid != self.postmaster && field(&f, 4) as u32 != self.postmaster {
                continue;
            }
            let title = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " ")
                .trim()
                .to_string();
            let ns = schedstat_ns(pid).unwrap_or((field(&f, 14) + field(&f, 15)) * self.tick_ns);
            out.insert(pid, (title, ns));
        }
        out
    }

    /// Milliseconds per clock tick (the resolution of the `ticks` figures).
    pub(crate) fn tick_ms(&self) -> f64 {
        self.tick_ns as f64 / 1e6
    }
}
