//! Issue 8, "how it is shown": a set spread over a cluster (3 primaries, 3 replicas; the
//! reshards and the failovers each have one of their own) keeps the correctness contract while
//! `valkey-cli --cluster reshard` moves 300 slots, and while primaries fail over (kill -9, then
//! a manual `CLUSTER FAILOVER`), under writers and
//! readers (single-item calls, and MADD/MEXISTS of several slots' items, each item recorded
//! with its call's interval) whose whole history is checked (`support/chaos/checker.rs`): no
//! false 0, no false 1, no hang, no unexpected error, and afterwards every item answered by its
//! slot's owner as the database says. The reshard and the failover run once more on a set
//! attached to an application's table, whose rows also arrive from outside the module (the
//! change log).
//! `MEMBER_RESHARD_SEED` repeats a run's item choices;
//! `MEMBER_RESHARD_HISTORY=<dir>` writes each scenario's history there.
use crate::chaos_harness as chaos;
use crate::support;

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use chaos::attached::Source;
use chaos::checker;
use chaos::cluster_check;
use chaos::cluster_load::{self, LoadConfig};
use chaos::history::{Fault, Kind, Op, Recorder};
use chaos::router::keyslot;
use support::cluster::{Cluster, ConfigFor};
use support::member::set_info;
use support::wait_until;

pub(crate) const DB_TIMEOUT_MS: u64 = 1000;

/// Every node's configs: failures are detected in 2 s, and the sync loop runs only once a
/// second, so it cannot hide a node that answers before it has caught up.
pub(crate) const CONFIGS: [(&str, &str); 4] = [
    ("cluster-node-timeout", "2000"),
    ("member.sync-interval-ms", "1000"),
    ("member.db-timeout-ms", "1000"),
    ("member.workers", "2"),
];

/// RECENT-TTL 1: the marks would hide a missing filter bit for 10 s. NORMALIZE lower: half of
/// the load's items go out spelled in mixed case, whose slot is not the item's, so calls are
/// served through the cluster bus's forwarding and the batch split while slots move
/// (`LoadConfig::spell`).
pub(crate) const SET_OPTIONS: [&str; 6] = [
    "CAPACITY",
    "100000",
    "RECENT-TTL",
    "1",
    "NORMALIZE",
    "lower",
];

/// The reshard tests' own cluster, started once; they take turns on it.
fn reshard_cluster() -> MutexGuard<'static, Cluster> {
    static OWN: OnceLock<Mutex<Cluster>> = OnceLock::new();
    OWN.get_or_init(|| Mutex::new(Cluster::start(&CONFIGS)))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The failover tests' own cluster, apart from the reshards': on Valkey 8 a primary demoted by
/// a failover, once a replica, sometimes kept a later reshard's `SETSLOT … MIGRATING` marks
/// that its primary replicated to it (34 of 150 slots in one run), and `--cluster check` then
/// reports open slots on it.
pub(crate) fn failover_cluster() -> MutexGuard<'static, Cluster> {
    static OWN: OnceLock<Mutex<Cluster>> = OnceLock::new();
    OWN.get_or_init(|| Mutex::new(Cluster::start(&CONFIGS)))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn load_config(hot: Vec<u16>, source: Option<Source>) -> LoadConfig {
    let seed = std::env::var("MEMBER_RESHARD_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("cluster_reshard: seed {seed}");
    LoadConfig {
        seed,
        writers: 3,
        readers: 4,
        pause_ms: 6,
        db_timeout_ms: DB_TIMEOUT_MS,
        slack_ms: 3000,
        hot,
        batch: 6,
        spell: true,
        source,
        chain_keys: Vec::new(),
    }
}

/// Every node's port: the routers read the slot table from the first that answers.
pub(crate) fn seeds(cl: &Cluster) -> Vec<u16> {
    cl.nodes.iter().map(|n| n.port()).collect()
}

/// Records a cluster event as a fault of the history (printed at once).
pub(crate) fn event(rec: &Recorder, start: u64, kind: &'static str, detail: String) {
    rec.fault(Fault {
        start,
        end: rec.now(),
        kind,
        detail,
        injected: true,
    });
}

/// How a node answered for `set`: the counters of MEMBER.INFO that say which tier decided.
pub(crate) fn paths(c: &mut redis::Connection, set: &str) -> String {
    const SHOWN: [&str; 9] = [
        "filter_complete",
        "filter_caught_up",
        "exists_calls",
        "path_bloom_negative",
        "path_recent",
        "path_cache_hit",
        "path_db_hit",
        "path_db_miss",
        "filter_incomplete_lookups",
    ];
    SHOWN
        .iter()
        .map(|f| {
            format!(
                "{f}={}",
                set_info(c, set, f).unwrap_or_else(|e| e.to_string())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The load goes on until it has made enough operations for the history check to mean
/// something (`finish` requires more than 1000), however slow the machine is today.
pub(crate) fn enough_operations(rec: &Recorder) {
    wait_until(Duration::from_secs(180), || rec.op_count() > 1000);
}

/// Waits for the load to settle, checks the history and the final state, prints the summary,
/// and fails with every problem found.
pub(crate) fn finish(
    tag: &str,
    cl: &Cluster,
    set: &str,
    cfg: &LoadConfig,
    rec: &Recorder,
    began: Instant,
    mut problems: Vec<String>,
) {
    let ops = rec.ops();
    thread::sleep(cfg.settle_wait());
    let rules = cfg.rules();
    let mut violations = checker::check(&ops, &rules);
    violations.extend(cluster_load::unexpected_errors(&ops));
    let t = Instant::now();
    violations.extend(cluster_check::final_check(cl, set, cfg, &ops));
    eprintln!("{tag}: final check took {:.1} s", t.elapsed().as_secs_f64());
    chaos::summary(tag, &ops, &rec.faults(), &violations, began.elapsed());
    if let Ok(dir) = std::env::var("MEMBER_RESHARD_HISTORY") {
        let path = format!("{dir}/{tag}.history");
        chaos::write_history(&path, &ops, &rec.faults(), &violations);
    }
    let (mut negatives, mut lookups) = (0, 0);
    for n in cl.primaries() {
        let mut c = n.conn();
        eprintln!("{tag}: :{} {}", n.port(), paths(&mut c, set));
        let mut count = |f| set_info(&mut c, set, f).unwrap().parse::<u64>().unwrap();
        negatives += count("path_bloom_negative");
        lookups += count("exists_calls");
    }
    assert!(ops.len() > 1000, "only {} operations ran", ops.len());
    if let Some(src) = &cfg.source {
        let (inserts, lag) = outside_lag(&ops);
        eprintln!(
            "{tag}: {inserts} outside INSERTs; the latest 0 for one came {:.0} ms after its \
             commit (allowed {} ms)",
            lag as f64 / 1e3,
            src.outside_ms
        );
        if inserts < 50 {
            problems.push(format!("only {inserts} outside INSERTs were made"));
        }
    }
    // The batch clients' items are in the history, answered as well as refused: a run where
    // no MADD or MEXISTS was answered checked nothing of them.
    for (client, what) in [
        (cluster_load::BATCH_WRITER, "MADD"),
        (cluster_load::BATCH_READER, "MEXISTS"),
    ] {
        let answered = ops
            .iter()
            .filter(|o| o.client == client && o.outcome.answer().is_some())
            .count();
        eprintln!("{tag}: {answered} items answered by {what} calls");
        if answered < 100 {
            problems.push(format!("only {answered} items answered by {what} calls"));
        }
    }
    if !violations.is_empty() {
        problems.push(format!(
            "{} violations of the contract (see the summary above)",
            violations.len()
        ));
    }
    // A fifth of the reads, and some of the final check's lookups, are of items nobody wrote:
    // a filter that serves answers nearly all of them itself. If it answered fewer than one
    // lookup in twenty, most answers came from the database and the history could not show a
    // filter that misses an acknowledged member.
    if negatives * 20 < lookups {
        problems.push(format!(
            "the filters answered {negatives} of {lookups} lookups (path_bloom_negative, counters \
             above): too few for the run to catch a filter missing an acknowledged member"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// How many outside INSERTs the history holds, and the longest time from one's commit to the
/// start of a read that answered 0 for it (µs): how late a node learned such a row.
fn outside_lag(ops: &[Op]) -> (usize, u64) {
    let commits: std::collections::HashMap<&str, u64> = ops
        .iter()
        .filter(|o| o.kind == Kind::Insert && o.outcome.answer() == Some(1))
        .map(|o| (o.item.as_str(), o.end))
        .collect();
    let lag = ops
        .iter()
        .filter(|o| o.kind == Kind::Exists && o.outcome.answer() == Some(0))
        .filter_map(|o| Some(o.start.saturating_sub(*commits.get(o.item.as_str())?)))
        .max()
        .unwrap_or(0);
    (commits.len(), lag)
}

/// Slots the reshard moves by default: enough that the load's items fall in them all through
/// the move (each slot takes tens of milliseconds with a debug build on an idle machine, a
/// second or more on a busy one). `MEMBER_RESHARD_SLOTS` asks for another number (up to the
/// source's 5 461), for a longer run.
fn moving_slots() -> usize {
    std::env::var("MEMBER_RESHARD_SLOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (5..=5461).contains(n))
        .unwrap_or(300)
}

/// Moves [`moving_slots`] slots from one primary to another with the real CLI while the load runs. The
/// set is named so that a key named after it alone (`member:<set>:bloom`, which every node
/// holds today) hashes to one of the last slots moved: whatever the module keeps in keys,
/// a slot holding some set's key moves like any other (with many sets, some always do).
#[test]
fn resharding_under_load_keeps_the_contract() {
    reshard_scenario("reshard", "reshard", moving_slots(), false);
}

/// The same on a set attached to an application's table (docs/attach.md, "In a cluster"):
/// the writers INSERT each row and then ADD or MADD it, as the sign-up flow does, an outside
/// writer INSERTs rows the module learns only from the change log (answered as members from
/// 3 s after their commit), and each slot that arrives is filled by reading the
/// table. Half as many slots move: the history is as long, and the test suite shorter.
#[test]
fn resharding_an_attached_set_under_load_keeps_the_contract() {
    reshard_scenario("reshard_attached", "reshard_att", moving_slots() / 2, true);
}

/// Creates `set` on every node with [`SET_OPTIONS`]; attached to `source`'s table (made
/// here) when given.
pub(crate) fn create_set(cl: &Cluster, set: &str, source: Option<&Source>) {
    let Some(src) = source else {
        cl.create_everywhere_with(set, &SET_OPTIONS);
        return;
    };
    cl.db()
        .client()
        .batch_execute(&format!(
            "CREATE TABLE {t} (username text PRIMARY KEY);
             CREATE UNIQUE INDEX ON {t} (lower(username))",
            t = src.table
        ))
        .expect("the source table");
    let _allow = ConfigFor::set(cl.set_owner(set), "member.attach-allow", &src.table);
    let mut options = vec!["SOURCE", &src.table, "COLUMN", "username", "SYNC", "log"];
    options.extend(SET_OPTIONS);
    cl.create_everywhere_with(set, &options);
}

/// An attached set's source table for the scenario `tag`, in the cluster's database: the
/// outside writer's rows are answered as members from 3 s (three sync intervals) after their
/// commit.
fn source_for(cl: &Cluster, tag: &str) -> Source {
    Source {
        url: cl.db().url(),
        table: format!("public.{tag}_src_{}", std::process::id()),
        column: "username".into(),
        outside_ms: 3000,
    }
}

/// Creates the set (named `<prefix>_<n>`; attached to a table of its own when `attached`),
/// then runs the load while `count` slots move, and checks the history.
fn reshard_scenario(tag: &str, prefix: &str, count: usize, attached: bool) {
    let began = Instant::now();
    let cl = reshard_cluster();
    let source = attached.then(|| source_for(&cl, tag));
    cl.wait_healthy(Duration::from_secs(30), true)
        .expect("cluster healthy before the reshard");
    assert_eq!(keyslot(b"member:x:bloom"), cl.keyslot("member:x:bloom"));
    let table = cl.slot_table();
    let from = cl.node_by_port(table[0]);
    let to = cl.primaries().find(|n| n.port() != from.port()).unwrap();
    // The CLI takes the source's lowest slots.
    let moving: Vec<u16> = cl.slots_of(from).into_iter().take(count).collect();
    let set = (0..)
        .map(|i| format!("{prefix}_{i}"))
        .find(|s| {
            moving[count * 4 / 5..].contains(&keyslot(format!("member:{s}:bloom").as_bytes()))
        })
        .unwrap();
    create_set(&cl, &set, source.as_ref());
    let cfg = load_config(moving.clone(), source);
    let rec = Recorder::new();
    let mut problems = Vec::new();
    cluster_load::run(&cfg, &set, &seeds(&cl), &rec, || {
        thread::sleep(Duration::from_secs(2));
        let start = rec.now();
        let run = cl.reshard(from, to, moving.len());
        let ok = if run.ok { "done" } else { "FAILED" };
        let secs = (rec.now() - start) as f64 / 1e6;
        let detail = format!(
            "{count} slots :{} -> :{}: {ok} after {secs:.3} s",
            from.port(),
            to.port()
        );
        event(&rec, start, "reshard", detail);
        if !run.ok {
            // The slot it stopped at, and who holds what there.
            let at = run.text.lines().rev().find_map(|l| {
                let slot = l.strip_prefix("Moving slot ")?.split_whitespace().next()?;
                slot.parse::<u16>().ok()
            });
            let held = at.map_or(String::new(), |s| {
                format!("\n{}\n{}", cl.keys_in_slot(from, s), cl.keys_in_slot(to, s))
            });
            problems.push(format!("the reshard failed:\n{}{held}", run.text));
        }
        thread::sleep(Duration::from_secs(3));
        enough_operations(&rec);
    });
    let check = cl.wait_check_clean(Duration::from_secs(10));
    if !check.ok {
        problems.push(format!(
            "--cluster check is not clean after the reshard:\n{}",
            check.text
        ));
    }
    let table = cl.slot_table();
    let moved = moving
        .iter()
        .filter(|s| table[**s as usize] == to.port())
        .count();
    eprintln!(
        "{tag}: {moved} of the {} slots aimed at moved",
        moving.len()
    );
    if moved != moving.len() {
        problems.push(format!(
            "{moved} of the {} slots aimed at moved to :{}",
            moving.len(),
            to.port()
        ));
    }
    let closed = cl.close_open_slots();
    if !closed.is_empty() {
        eprintln!("{tag}: set open slots {closed:?} back to STABLE");
    }
    finish(tag, &cl, &set, &cfg, &rec, began, problems);
}

/// Kills a primary with -9 and lets its replica be promoted, then fails another primary over
/// by hand (`CLUSTER FAILOVER` on its replica), while the load runs; the killed node comes
/// back as a replica before the final check.
#[test]
fn failover_under_load_keeps_the_contract() {
    failover_scenario("failover", false);
}

/// The same on a set attached to an application's table, loaded as in
/// [`resharding_an_attached_set_under_load_keeps_the_contract`]: a promoted replica serves the
/// table's rows of its slots, outside INSERTs included.
#[test]
fn failover_of_an_attached_set_under_load_keeps_the_contract() {
    failover_scenario("failover_attached", true);
}

fn failover_scenario(tag: &str, attached: bool) {
    let began = Instant::now();
    let mut guard = failover_cluster();
    let cl: &mut Cluster = &mut guard;
    let source = attached.then(|| source_for(cl, tag));
    cl.wait_healthy(Duration::from_secs(30), true)
        .expect("cluster healthy before the failover");
    cl.refresh_roles();
    let primaries: Vec<u16> = cl.primaries().map(|n| n.port()).collect();
    let replica_of = |cl: &Cluster, p: u16| cl.replica_of(cl.node_by_port(p)).port();
    let (victim, manual) = (primaries[0], primaries[1]);
    let (heir, taker) = (replica_of(cl, victim), replica_of(cl, manual));
    let set = format!("{tag}_{}", std::process::id());
    create_set(cl, &set, source.as_ref());
    let cfg = load_config(cl.slots_of(cl.node_by_port(victim)), source);
    let rec = Recorder::new();
    let mut problems = Vec::new();
    let seeds = seeds(cl);
    let promote_wait = Duration::from_secs(30);
    cluster_load::run(&cfg, &set, &seeds, &rec, || {
        thread::sleep(Duration::from_secs(2));
        let start = rec.now();
        cl.kill9(victim);
        event(&rec, start, "kill -9", format!("primary :{victim}"));
        let start = rec.now();
        let promoted = wait_until(promote_wait, || cl.is_primary_now(heir))
            && cl.wait_healthy(promote_wait, false).is_ok();
        let secs = (rec.now() - start) as f64 / 1e6;
        let detail = format!(":{heir} primary, cluster ok: {promoted} after {secs:.3} s");
        event(&rec, start, "promotion", detail);
        if !promoted {
            problems.push(format!(
                "replica :{heir} was not promoted after :{victim} died"
            ));
        }
        thread::sleep(Duration::from_secs(3));
        let start = rec.now();
        let asked = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query::<String>(&mut cl.node_by_port(taker).conn());
        let took = asked.is_ok()
            && wait_until(promote_wait, || cl.is_primary_now(taker))
            && cl.wait_healthy(promote_wait, false).is_ok();
        let secs = (rec.now() - start) as f64 / 1e6;
        let detail = format!(":{taker} primary, cluster ok: {took} after {secs:.3} s");
        event(&rec, start, "manual failover", detail);
        if !took {
            problems.push(format!(
                "CLUSTER FAILOVER on :{taker}: {asked:?}, took {took}"
            ));
        }
        thread::sleep(Duration::from_secs(3));
        enough_operations(&rec);
    });
    cl.restart(victim);
    cl.refresh_roles();
    if let Err(e) = cl.wait_healthy(Duration::from_secs(30), true) {
        problems.push(format!("the cluster did not heal after the failovers: {e}"));
    }
    cl.refresh_roles();
    let check = cl.wait_check_clean(Duration::from_secs(10));
    if !check.ok {
        problems.push(format!(
            "--cluster check is not clean after the failovers:\n{}",
            check.text
        ));
    }
    finish(tag, cl, &set, &cfg, &rec, began, problems);
}
