//! The chaos test of issue 9: writers ADD and DEL, readers EXISTS, on several sets at once,
//! while PostgreSQL restarts, its backends are killed, the database link is delayed, stalled,
//! cut or refused (a proxy), Valkey is killed with -9 and restarts from its AOF, filters are
//! rebuilt, lost or replaced by an older DUMP, `member.pg-url` changes, the primary fails
//! over to its replica, and a switchover demotes the primary to a replica without a restart.
//! Readers ask the replica as well (the demoted node included), judged with its stated window. A checker verifies the whole history against the contract
//! (`support/chaos/checker.rs`). `make chaos` runs the long version (`MEMBER_CHAOS_SECS`).
use crate::chaos_harness as chaos;

use std::time::Duration;

use chaos::{faults, Config};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(secs: u64) -> Config {
    Config {
        duration: Duration::from_secs(secs),
        seed: env_u64(
            "MEMBER_CHAOS_SEED",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64,
        ),
        sets: 3,
        writers: 3,
        readers: 3,
        replica_readers: 2,
        items_per_writer: 20,
        window_step_ms: 500,
        writer_pause_ms: 10,
        fault_gap_ms: (300, 1200),
        db_timeout_ms: 1000,
        slack_ms: 3000,
    }
}

/// `kinds`, or only those `MEMBER_CHAOS_FAULTS` names (comma-separated) when it is set.
fn chosen(kinds: &[&'static str]) -> Vec<&'static str> {
    let Ok(only) = std::env::var("MEMBER_CHAOS_FAULTS") else {
        return kinds.to_vec();
    };
    let only: Vec<&str> = only.split(',').map(str::trim).collect();
    for o in &only {
        assert!(
            kinds.contains(o),
            "MEMBER_CHAOS_FAULTS: no fault {o} here ({kinds:?})"
        );
    }
    kinds.iter().copied().filter(|k| only.contains(k)).collect()
}

fn assert_clean(r: chaos::Report) {
    assert!(r.ops > 0, "no operation ran");
    let never: Vec<&str> = r
        .injected
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(k, _)| *k)
        .collect();
    assert!(
        never.is_empty(),
        "fault kinds never injected: {never:?} (each try is in the log above)"
    );
    assert!(
        r.violations.is_empty(),
        "{} violations of the contract (see the summary above)",
        r.violations.len()
    );
}

/// The short run inside `make test`: every fault kind at least once.
#[test]
fn chaos_short() {
    let secs = env_u64("MEMBER_CHAOS_SHORT_SECS", 30);
    assert_clean(chaos::run(&config(secs), &chosen(&faults::ALL)));
}

/// The long run: `make chaos` (`MEMBER_CHAOS_SECS`, default 300), with the faults too slow
/// for the short one (`faults::LONG_ONLY`).
#[test]
#[ignore]
fn chaos_long() {
    let secs = env_u64("MEMBER_CHAOS_SECS", 300);
    let kinds: Vec<&'static str> = faults::ALL
        .iter()
        .chain(&faults::LONG_ONLY)
        .copied()
        .collect();
    assert_clean(chaos::run(&config(secs), &chosen(&kinds)));
}
