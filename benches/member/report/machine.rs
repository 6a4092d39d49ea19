//! The machine a run measured: CPU, memory, tool versions, and how much of the CPU other
//! processes took meanwhile (from /proc).

use std::collections::HashMap;
use std::process::Command;
use std::thread;

pub(crate) fn machine() -> Vec<(String, String)> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|r| r.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let nproc = thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or("unknown".into(), |kb| {
            format!("{:.1} GiB", kb as f64 / 1048576.0)
        });
    let vb = Command::new("valkey-benchmark")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    vec![
        ("nproc".into(), nproc.to_string()),
        ("CPU".into(), model),
        ("memory".into(), mem),
        ("valkey-benchmark".into(), vb),
    ]
}

/// (busy, total) clock ticks of all CPUs since boot, from /proc/stat.
pub(crate) fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 8 {
        return (0, 0);
    }
    // user nice system idle iowait irq softirq steal
    (v[0] + v[1] + v[2] + v[5] + v[6] + v[7], v.iter().sum())
}

/// Clock ticks used by this process and all its descendants (live ones, and the reaped ones
/// through their parents' cutime/cstime).
pub(crate) fn own_tree_ticks() -> u64 {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    let mut ticks: HashMap<u32, u64> = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // Fields after "(comm)": state ppid ... utime(14) stime cutime cstime (1-based).
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < 15 {
            continue;
        }
        let n = |i: usize| f[i - 3].parse::<u64>().unwrap_or(0);
        parent.insert(pid, n(4) as u32);
        ticks.insert(pid, n(14) + n(15) + n(16) + n(17));
    }
    let me = std::process::id();
    ticks
        .iter()
        .filter(|(pid, _)| {
            let mut p = **pid;
            for _ in 0..64 {
                if p == me {
                    return true;
                }
                match parent.get(&p) {
                    Some(&pp) if pp != 0 && pp != p => p = pp,
                    _ => return false,
                }
            }
            false
        })
        .map(|(_, t)| *t)
        .sum()
}

/// 1-minute load average.
pub(crate) fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

pub(crate) fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
