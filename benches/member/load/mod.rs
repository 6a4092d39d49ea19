//! Load generators, each used for both sides of a ratio: one-call-per-thread (`threads`),
//! pipelined raw RESP (`resp`), valkey-benchmark and pgbench; plus the mixed workload's items.

use std::time::Instant;

use crate::*;

mod items;
mod pgbench;
mod resp;
mod threads;
mod valkey_benchmark;

pub(crate) use items::*;
pub(crate) use pgbench::*;
pub(crate) use resp::*;
pub(crate) use threads::*;
pub(crate) use valkey_benchmark::*;

/// An item of the mixed workload: 95 % absent (never a member), 5 % one of the `warm` first
/// members (whose cache entries were filled before). Returns (item, is_member).
pub(crate) fn mixed_item(rng: &mut Rng, warm: u64) -> (String, bool) {
    if rng.below(100) < PRESENT_PCT {
        (format!("m{}", 1 + rng.below(warm)), true)
    } else {
        (format!("absent:{}", rng.next()), false)
    }
}

pub(crate) type ThreadResult = (Instant, Instant, u64, u64, u64, Option<String>, Vec<u64>);

pub(crate) fn merge(results: Vec<ThreadResult>) -> Stats {
    let start = results.iter().map(|r| r.0).min().unwrap();
    let end = results.iter().map(|r| r.1).max().unwrap();
    let ops = results.iter().map(|r| r.2).sum();
    let errors = results.iter().map(|r| r.3).sum();
    let wrong = results.iter().map(|r| r.4).sum();
    let first_error = results.iter().find_map(|r| r.5.clone());
    let mut all = Vec::with_capacity(results.iter().map(|r| r.6.len()).sum());
    for r in results {
        all.extend(r.6);
    }
    let mut st = Stats::from_samples(ops, (end - start).as_secs_f64(), all);
    st.errors = errors;
    st.wrong = wrong;
    st.first_error = first_error;
    st
}
