//! libmember benchmark: `make bench` (1 000 000 members) or `make bench ARGS=--ten-million`.
//!
//! Starts its own PostgreSQL and valkey-server (release build of the module), loads the
//! members with SQL, then measures every figure against its baseline in the same run on the
//! same servers and prints one markdown table (also written to `bench/results.md`, with a
//! latency chart in `bench/latency.svg`).
//!
//! Load generators, each used for both sides of a ratio:
//! * `valkey-benchmark` for the negative path (EXISTS of absent items vs GET);
//! * a small RESP load generator (threads × connections, pipelining) for the mixed workload;
//! * one-operation-per-call threads (one connection each) for everything that compares with
//!   PostgreSQL or with the application-level pattern.
//!
//! Each side of a ratio runs twice, in A B B A order, and the two runs are pooled
//! (throughput = all operations / all seconds, percentiles = mean of the two runs), so a
//! slow drift of the machine does not favour either side.
//!
//! Where things are:
//! * `main.rs`: the run's constants, the section list (`SECTIONS`, what `--only` takes), `main`;
//! * `opts.rs`: command-line options; `servers.rs`: the release module, PostgreSQL, valkey-server,
//!   the loaded members and warm caches; `client.rs`: small connection and INFO helpers;
//! * `stats.rs`: one measured load, A B B A pooling, the item generator;
//! * `load/`: the load generators (`threads`, `resp`, `valkey_benchmark`, `pgbench`, `items`);
//! * `pg_cpu.rs`: the CPU time of the bench's PostgreSQL cluster, from /proc;
//! * `report/`: the table and notes, `results.rs` (bench/results.md), `svg.rs`
//!   (bench/latency.svg), `machine.rs` (the host and its other load);
//! * `sections/`: one file per section.

// The tests' harness: the bench uses a part of it.
#[path = "../../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

/// The module's filter code itself, for `--hundred-million` (`filter::Bloom`); the
/// static part and large arrays are its children.
#[allow(dead_code)]
#[path = "../../src/filter/bloom/mod.rs"]
mod filter;

mod client;
mod hundred_million;
mod load;
mod opts;
mod pg_cpu;
mod report;
mod sections;
mod servers;
mod stats;

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use client::*;
use load::*;
use opts::*;
use report::*;
use servers::*;
use stats::*;
use support::member::{start_loaded, wait_catalog_loaded};

const SET: &str = "bench";
const TABLE: &str = "member_bench";
/// The application-level pattern's keys: a Valkey SET standing in for the Bloom gate, a
/// recent-writes SET and exact-match cache keys.
const APP_SET: &str = "app:members";
const APP_RECENT: &str = "app:recent";
const APP_HIT: &str = "app:hit:";
/// The module's exact-match key prefix for an unscoped item (`member:<set>:hit:<item>\0`).
const HIT_PREFIX: &str = "member:bench:hit:";
/// The key GET reads in the negative-path baseline.
const PRESENT_KEY: &str = "bench:present";
const CONFIGURED_FPR: f64 = 0.01;
const CACHE_TTL_S: u64 = 3600;
/// Share of present items in the mixed workload, in percent.
const PRESENT_PCT: u64 = 5;
const POINT_QUERY: &str = "SELECT 1 FROM member_bench WHERE entity_id = $1 AND scope = ''";
const COPY_SQL: &str = "COPY (SELECT entity_id, scope FROM member_bench WHERE status = 1 \
     AND (expires_at IS NULL OR expires_at > now())) TO STDOUT";

/// One part of a run.
type Section = fn(&mut Bench);

/// The sections of a run, in order, by the name `--only` takes (a comma-separated list).
/// `cluster` comes last: it adds items to the standalone set.
const SECTIONS: [(&str, Section); 20] = [
    ("memory", Bench::memory),
    ("negative", Bench::negative_path),
    ("mixed", Bench::mixed),
    ("cold", Bench::cold_path),
    ("dbcpu", Bench::dbcpu),
    ("rebuild", Bench::rebuild),
    ("writes", Bench::adds),
    ("writepath", Bench::write_path),
    ("bigfilter", Bench::big_filters),
    ("idle", Bench::idle_sync),
    ("batch", Bench::batch),
    ("tokenize", Bench::tokenize),
    ("replica", Bench::replica),
    ("normalize", Bench::normalize),
    ("visibility", Bench::visibility),
    ("syncmem", Bench::sync_memory),
    ("rebuildmem", Bench::rebuild_memory),
    ("pooler", Bench::pooler),
    ("rotation", Bench::rotation),
    ("cluster", Bench::cluster),
];

/// The run: its options, the servers it measures, and the report the sections fill.
struct Bench {
    opts: Opts,
    db: support::TestDb,
    vk: support::Valkey,
    port: u16,
    /// Present items whose cache entries are warm: m1 ..= m<warm>.
    warm: u64,
    /// Next never-looked-up member for the cold path.
    cold_next: AtomicU64,
    rebuild_available: bool,
    /// Filter build observed at start-up (seconds, PINGs meanwhile), when MEMBER.REBUILD is
    /// not available.
    startup_build: Option<(f64, Stats)>,
    r: Report,
}

fn main() {
    let opts = Opts::parse();
    if opts.hundred_million {
        hundred_million::run(&opts);
        return;
    }
    let module = check_module();
    let started = Instant::now();
    let cpu_before = (loadavg(), cpu_ticks(), own_tree_ticks());
    let mut b = Bench::setup(opts);
    for (name, section) in SECTIONS {
        if b.opts.runs(name) {
            section(&mut b);
        }
    }
    b.finish(&module, started.elapsed(), cpu_before);
}
