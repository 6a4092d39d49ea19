//! Load generator 3: valkey-benchmark, sized to a duration by a calibration run; the
//! `__rand_int__` keyspaces of the absent probes.

use std::process::Command;

use crate::*;

/// One valkey-benchmark run of `n` requests; parses its CSV line.
/// `keyspace`: the range of `__rand_int__` (`-r`), when the command uses it.
pub(crate) fn vb_run(
    port: u16,
    clients: usize,
    pipeline: usize,
    n: u64,
    keyspace: Option<u64>,
    cmd: &[&str],
) -> Stats {
    let mut c = Command::new("valkey-benchmark");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-n", &n.to_string(), "--csv", "--precision", "3"]);
    if let Some(r) = keyspace {
        c.args(["-r", &r.to_string()]);
    }
    c.args(cmd);
    let out = c
        .output()
        .expect("run valkey-benchmark (valkey-tools installed?)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('"') && !l.starts_with("\"test\""))
        .unwrap_or_else(|| {
            panic!(
                "valkey-benchmark printed no result:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let f: Vec<f64> = line
        .split("\",\"")
        .skip(1)
        .map(|x| x.trim_matches('"').parse().unwrap_or(0.0))
        .collect();
    // "test","rps","avg","min","p50","p95","p99","max"
    assert!(f.len() >= 7, "unexpected valkey-benchmark line: {line}");
    Stats {
        ops: n,
        secs: n as f64 / f[0].max(1.0),
        p50_ms: f[3],
        p99_ms: f[5],
        max_ms: f[6],
        ..Stats::default()
    }
}

/// Sizes a valkey-benchmark run to about `secs` from a short calibration run.
pub(crate) fn vb_timed(
    port: u16,
    pipeline: usize,
    secs: f64,
    keyspace: Option<u64>,
    cmd: &[&str],
) -> Stats {
    let probe = if pipeline > 1 { 200_000 } else { 40_000 };
    let cal = vb_run(port, 50, pipeline, probe, keyspace, cmd);
    let n = ((cal.rps() * secs) as u64).clamp(probe, 50_000_000);
    vb_run(port, 50, pipeline, n, keyspace, cmd)
}

/// MEMBER.EXISTS of never-repeating absent items of `set` on the server at `port`, sized to
/// about `secs` (`vb_timed`, 50 connections): the negative path's load, which the negative,
/// tokenize and replica sections each compare with a baseline.
pub(crate) fn vb_absent_exists(port: u16, pipeline: usize, secs: f64, set: &str) -> Stats {
    vb_timed(
        port,
        pipeline,
        secs,
        Some(ABSENT_KEYSPACE),
        &["MEMBER.EXISTS", set, "absent:__rand_int__"],
    )
}

/// `__rand_int__` range of the random absent probes: practically never repeated.
pub(crate) const ABSENT_KEYSPACE: u64 = 1_000_000_000;
/// A pool of absent items checked again and again (names re-typed at sign-up, cards seen on
/// every payment): its false positives are remembered after their first database answer.
pub(crate) const REPEATED_KEYSPACE: u64 = 100_000;
