//! pgbench as a load generator: prepared point queries of random members, latency from its
//! per-transaction log.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::*;

/// pgbench, `-S` style: `clients` connections on 2 threads, each running one prepared point
/// query of a random member after another, for `dur` (rounded up to whole seconds).
pub(crate) fn pgbench(db: &support::TestDb, members: u64, clients: usize, dur: Duration) -> Stats {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "member-pgbench-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create pgbench dir");
    let script = dir.join("point.sql");
    std::fs::write(
        &script,
        format!(
            "\\set id random(1, {members})\n\
             SELECT 1 FROM member_bench WHERE entity_id = 'm' || :id AND scope = '';\n"
        ),
    )
    .expect("write pgbench script");
    let secs = dur.as_secs_f64().ceil().max(1.0) as u64;
    let out = Command::new(support::pg_bin("pgbench"))
        .current_dir(&dir)
        .args(["-h", "127.0.0.1", "-U", "postgres", "-n", "-M", "prepared"])
        .args(["-p", &support::Pg::get().port().to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-T",
            &secs.to_string(),
        ])
        .arg("-f")
        .arg(&script)
        .args(["-l", "--log-prefix=tx"])
        .arg(&db.name)
        .output()
        .unwrap_or_else(|e| die(&format!("cannot run pgbench: {e}")));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        die(&format!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let tps: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| die(&format!("no tps in pgbench output: {stdout}")));
    // Log lines: client_id transaction_no latency_us script_no epoch_s epoch_us.
    let mut lat = Vec::new();
    for e in std::fs::read_dir(&dir).expect("read pgbench dir").flatten() {
        if !e.file_name().to_string_lossy().starts_with("tx.") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        lat.extend(text.lines().filter_map(|l| {
            l.split_whitespace()
                .nth(2)
                .and_then(|us| us.parse::<u64>().ok())
                .map(|us| us * 1000)
        }));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ops = lat.len() as u64;
    Stats::from_samples(ops, ops as f64 / tps.max(1.0), lat)
}

/// pgbench running `script` (prepared, `clients` connections on 2 threads) for `secs`
/// (rounded up to whole seconds): transactions and seconds, no latency log.
pub(crate) fn pgbench_script(
    db: &support::TestDb,
    script: &str,
    clients: usize,
    secs: f64,
) -> Stats {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "member-pgbench-script-{}-{}.sql",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, script).expect("write pgbench script");
    let secs = secs.ceil().max(1.0) as u64;
    let out = Command::new(support::pg_bin("pgbench"))
        .args(["-h", "127.0.0.1", "-U", "postgres", "-n", "-M", "prepared"])
        .args(["-p", &support::Pg::get().port().to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-T",
            &secs.to_string(),
        ])
        .arg("-f")
        .arg(&path)
        .arg(&db.name)
        .output()
        .unwrap_or_else(|e| die(&format!("cannot run pgbench: {e}")));
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        die(&format!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let field = |prefix: &str| -> f64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| die(&format!("no {prefix:?} in pgbench output: {stdout}")))
    };
    let tps = field("tps = ");
    let ops = field("number of transactions actually processed: ") as u64;
    Stats {
        ops,
        secs: ops as f64 / tps.max(1.0),
        ..Stats::default()
    }
}
