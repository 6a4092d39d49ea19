//! Backfills: a sync pass in bounded memory (docs/sync.md "Paging"). A bulk INSERT of many
//! rows made outside the module reaches the filter without the server's peak memory growing
//! with the rows, so under `maxmemory` and `allkeys-lru` none of the application's own keys is
//! evicted to make room for the pass. The same on every primary of a cluster, where each
//! primary reads only its own slots' rows; and the module's
//! transient memory is shown, given back, and waits for room under `maxmemory`.
use crate::support;

use std::time::{Duration, Instant};

use redis::Connection;
use support::cluster::Cluster;
use support::lifecycle::*;
use support::member::*;
use support::wait_until;

/// Rows the outside INSERT writes on one server: before paging, a pass held ~390 bytes a row
/// (150 MB here), far past `MAXMEMORY` and `PEAK_BUDGET`. No more: the INSERT, its change log
/// and the pass are a large share of the suite's CPU on two cores.
const ROWS: i64 = 400_000;
/// Rows the outside INSERT writes in the cluster test: each of the three primaries reads its
/// third, and that third must still be past `MAXMEMORY` unpaged (~127 MB).
const CLUSTER_ROWS: i64 = 1_000_000;
/// `maxmemory` while the rows are synced: room for the application's keys and the filter, not
/// for a pass that holds every row.
const MAXMEMORY: &str = "64mb";
/// The application's own keys, which must all survive the pass.
const APP_KEYS: usize = 2_000;
/// What the pass may add to the server's peak memory (paged, it adds well under 1 MB).
const PEAK_BUDGET: i64 = 32 << 20;

fn rows_applied(c: &mut Connection, set: &str) -> i64 {
    set_number(c, set, "sync_rows_applied")
}

/// The two million-row backfills run one at a time: together they starve the rest of the
/// suite of CPU on a two-core machine.
static BACKFILL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_backfill_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    BACKFILL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn an_outside_bulk_insert_is_synced_without_evicting_the_applications_keys() {
    let _one = one_backfill_at_a_time();
    let env = env(&[]);
    let mut c = env.conn();
    // Sized for the rows: no auto-grow rebuild (a cost of its own) during the test.
    create(&mut c, "bulk", &["CAPACITY", "2000000"]);
    wait_info(&env.vk, &mut c, "bulk", "filter_caught_up", "1", SETTLE);
    ok(&mut c, &["CONFIG", "SET", "maxmemory", MAXMEMORY]);
    ok(
        &mut c,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    );
    let mut p = redis::pipe();
    for i in 0..APP_KEYS {
        p.cmd("SET").arg(format!("app:{i}")).arg("v").ignore();
    }
    p.query::<()>(&mut c).unwrap();
    let before = peak_allocated(&mut c);

    let t = Instant::now();
    env.pg()
        .batch_execute(&format!(
            "INSERT INTO member_bulk (entity_id) SELECT 'bulk-' || g FROM generate_series(1, {ROWS}) g"
        ))
        .unwrap();
    let committed = t.elapsed();
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(180), || rows_applied(&mut c, "bulk")
            >= ROWS),
        "the pass never applied the {ROWS} rows: MEMBER.INFO {:?}, evicted_keys {}, DBSIZE {}\n{}",
        info_all(&mut c, "bulk"),
        info_number(&mut c, "stats", "evicted_keys"),
        int(&mut c, &["DBSIZE"]),
        log_tail(&env.vk)
    );
    eprintln!(
        "insert committed in {committed:?}; rows applied {:?} later; peak.allocated {} -> {}",
        t.elapsed(),
        before,
        peak_allocated(&mut c)
    );
    // Every row is in the filter, and the filter is trusted again (it caught up past them).
    let sample: Vec<String> = [1, 2, ROWS / 2 - 1, ROWS / 2, ROWS * 7 / 9, ROWS - 1, ROWS]
        .iter()
        .map(|i| format!("bulk-{i}"))
        .collect();
    wait_info(&env.vk, &mut c, "bulk", "filter_caught_up", "1", SETTLE);
    assert_in_filter(&env.vk, &mut c, "bulk", &sample, "after the bulk insert");
    assert_rejected(
        &env.vk,
        &mut c,
        "bulk",
        "never-inserted",
        "after the bulk insert",
    );

    assert_eq!(info_number(&mut c, "stats", "evicted_keys"), 0);
    let mut p = redis::pipe();
    for i in 0..APP_KEYS {
        p.cmd("EXISTS").arg(format!("app:{i}"));
    }
    let alive: Vec<i64> = p.query(&mut c).unwrap();
    assert_eq!(
        alive.iter().sum::<i64>(),
        APP_KEYS as i64,
        "application keys were evicted"
    );
    let rise = peak_allocated(&mut c) - before;
    assert!(
        rise < PEAK_BUDGET,
        "the pass raised peak.allocated by {rise} bytes for {ROWS} rows"
    );
}

fn member_number(c: &mut Connection, name: &str) -> i64 {
    info_number(c, "member", &format!("member_{name}"))
}

fn set_number(c: &mut Connection, set: &str, name: &str) -> i64 {
    let v = set_info(c, set, name).unwrap();
    v.parse()
        .unwrap_or_else(|e| panic!("MEMBER.INFO {set} {name} {v:?}: {e}"))
}

/// What a sync page is admitted for at its largest (`PAGE_ROWS` × `ROW_BYTES`), and at its
/// smallest (`MIN_PAGE_ROWS` × `ROW_BYTES`).
const FULL_PAGE_BYTES: i64 = 32768 * 256;
const MIN_PAGE_BYTES: i64 = 512 * 256;

#[test]
fn a_backfill_shows_its_transient_memory_and_gives_it_back() {
    // A small filter (its payload far below a page) that does not grow meanwhile.
    let env = env(&[("member.auto-grow", "no")]);
    let mut c = env.conn();
    create(&mut c, "backfill", &["CAPACITY", "1000"]);
    wait_info(&env.vk, &mut c, "backfill", "filter_caught_up", "1", SETTLE);
    let peak_before = member_number(&mut c, "transient_peak_bytes");
    let set_peak_before = set_number(&mut c, "backfill", "transient_peak_bytes");

    // Past the first pages, which grow from 512 rows, to at least one full page.
    let rows = 100_000;
    env.pg()
        .batch_execute(&format!(
            "INSERT INTO member_backfill (entity_id) SELECT 'fill-' || g FROM generate_series(1, {rows}) g"
        ))
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(120), || rows_applied(
            &mut c, "backfill"
        ) >= rows),
        "the rows never arrived: {:?}",
        info_all(&mut c, "backfill")
    );
    // The pass read full pages: the node's peak shows at least one, the set's its hashes.
    let peak = member_number(&mut c, "transient_peak_bytes");
    assert!(
        peak >= FULL_PAGE_BYTES && peak > peak_before,
        "transient_peak_bytes {peak_before} -> {peak}"
    );
    let set_peak = set_number(&mut c, "backfill", "transient_peak_bytes");
    assert!(
        set_peak > set_peak_before && set_peak >= 8192 * 18,
        "the set's transient_peak_bytes {set_peak_before} -> {set_peak}"
    );
    // Everything is given back once the pages are applied.
    assert!(
        wait_until(SETTLE, || member_number(&mut c, "transient_bytes") == 0
            && set_number(&mut c, "backfill", "transient_bytes") == 0),
        "transient memory still held: node {}, set {}",
        member_number(&mut c, "transient_bytes"),
        set_number(&mut c, "backfill", "transient_bytes")
    );
    assert_eq!(member_number(&mut c, "memory_waits"), 0, "nothing waited");
    assert_eq!(
        member_number(&mut c, "transient_peak_bytes"),
        peak,
        "the peak stays"
    );
}

#[test]
fn a_page_waits_for_headroom_instead_of_evicting() {
    let env = env(&[]);
    let mut c = env.conn();
    create(&mut c, "tight", &["CAPACITY", "100000"]);
    wait_info(&env.vk, &mut c, "tight", "filter_caught_up", "1", SETTLE);
    let mut p = redis::pipe();
    for i in 0..APP_KEYS {
        p.cmd("SET").arg(format!("app:{i}")).arg("v").ignore();
    }
    p.query::<()>(&mut c).unwrap();
    // The policy docs/operations.md asks for: nothing here has a TTL, so the server itself evicts
    // nothing when its own traffic (replies, buffers) crosses the tight limit below.
    ok(
        &mut c,
        &["CONFIG", "SET", "maxmemory-policy", "volatile-lru"],
    );
    // No room at all, whatever the server's own traffic does to used_memory meanwhile (a limit
    // just above it let a page through once the pipeline's buffers were freed): with nothing
    // evictable under volatile-lru, the server refuses only writes that need memory, and
    // every page must wait.
    let used = info_number(&mut c, "memory", "used_memory");
    let max = (used / 2).to_string();
    ok(&mut c, &["CONFIG", "SET", "maxmemory", &max]);
    assert!(
        wait_until(SETTLE, || info_field(&mut c, "memory_budget")
            .is_ok_and(|b| b.parse::<i64>().is_ok_and(|b| b < MIN_PAGE_BYTES))),
        "the module never measured the new headroom: {:?}",
        info_field(&mut c, "memory_budget")
    );
    let applied = rows_applied(&mut c, "tight");
    let rows = 20_000;
    env.pg()
        .batch_execute(&format!(
            "INSERT INTO member_tight (entity_id) SELECT 'tight-' || g FROM generate_series(1, {rows}) g"
        ))
        .unwrap();
    let waits = member_number(&mut c, "memory_waits");
    assert!(
        wait_until(SETTLE, || member_number(&mut c, "memory_waits")
            >= waits + 2),
        "no pass waited for headroom: memory_waits {waits} -> {}, MEMBER.INFO {:?}",
        member_number(&mut c, "memory_waits"),
        info_all(&mut c, "tight")
    );
    let why = set_info(&mut c, "tight", "sync_last_error").unwrap();
    assert!(
        why.contains("not enough memory left under maxmemory"),
        "sync_last_error: {why:?}"
    );
    assert_eq!(
        rows_applied(&mut c, "tight"),
        applied,
        "a page was read without room for it"
    );
    assert_eq!(info_number(&mut c, "stats", "evicted_keys"), 0);

    // Room again: every row arrives, nothing was evicted meanwhile.
    ok(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    assert!(
        wait_until(SETTLE * 3, || rows_applied(&mut c, "tight")
            >= applied + rows),
        "the rows never arrived once there was room: {:?}",
        info_all(&mut c, "tight")
    );
    let sample: Vec<String> = [1, 777, rows]
        .iter()
        .map(|i| format!("tight-{i}"))
        .collect();
    assert_in_filter(&env.vk, &mut c, "tight", &sample, "once there was room");
    assert_eq!(info_number(&mut c, "stats", "evicted_keys"), 0);
    let mut p = redis::pipe();
    for i in 0..APP_KEYS {
        p.cmd("EXISTS").arg(format!("app:{i}"));
    }
    let alive: Vec<i64> = p.query(&mut c).unwrap();
    assert_eq!(alive.iter().sum::<i64>(), APP_KEYS as i64);
}

/// A hash tag whose slot `owner` serves, for keys that must live there.
fn tag_on(cl: &Cluster, owner: u16) -> String {
    (0..)
        .map(|i| format!("t{i}"))
        .find(|t| cl.owner(cl.keyslot(t)).port() == owner)
        .unwrap()
}

#[test]
fn an_outside_bulk_insert_evicts_nothing_on_any_primary_of_a_cluster() {
    let _one = one_backfill_at_a_time();
    let cl = Cluster::start_primaries_only(&[]);
    let set = "cbulk";
    let mut c0 = cl.set_owner(set).conn();
    ok(
        &mut c0,
        &[
            "MEMBER.CREATE",
            set,
            "CAPACITY",
            "2000000",
            "NORMALIZE",
            "none",
        ],
    );
    cl.wait_ready(set);
    let mut before = Vec::new();
    for n in cl.primaries() {
        let mut c = n.conn();
        ok(&mut c, &["CONFIG", "SET", "maxmemory", MAXMEMORY]);
        ok(
            &mut c,
            &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
        );
        let tag = tag_on(&cl, n.port());
        let mut p = redis::pipe();
        for i in 0..APP_KEYS {
            p.cmd("SET")
                .arg(format!("{{{tag}}}:app:{i}"))
                .arg("v")
                .ignore();
        }
        p.query::<()>(&mut c).unwrap();
        before.push((tag, peak_allocated(&mut c)));
    }

    let t = Instant::now();
    cl.db()
        .client()
        .batch_execute(&format!(
            "INSERT INTO member_{set} (entity_id) SELECT 'cb-' || g FROM generate_series(1, {CLUSTER_ROWS}) g"
        ))
        .unwrap();
    // Each row belongs to one slot, so to one primary: together they apply each row once.
    let applied = |cl: &Cluster| -> i64 {
        cl.primaries()
            .map(|n| rows_applied(&mut n.conn(), set))
            .sum()
    };
    assert!(
        wait_until(Duration::from_secs(180), || applied(&cl) >= CLUSTER_ROWS),
        "the primaries applied {} of {CLUSTER_ROWS} rows",
        applied(&cl)
    );
    eprintln!(
        "{CLUSTER_ROWS} rows applied by the primaries within {:?}",
        t.elapsed()
    );
    assert_eq!(
        applied(&cl),
        CLUSTER_ROWS,
        "a row applied on a node that does not own it"
    );

    for (n, (tag, peak_before)) in cl.primaries().zip(&before) {
        let mut c = n.conn();
        let share = rows_applied(&mut c, set);
        assert!(
            share > CLUSTER_ROWS / 5,
            "{}: {share} rows of its slots",
            n.addr()
        );
        // It read only the rows of its own slots from the change log (their slot is logged
        // with them), not all of them (three times its share). A pass applies its rows page
        // by page and counts what it read when it ends (after its commit and, now and then,
        // the log's prune): the count is read once that pass has ended.
        let read_now = |c: &mut Connection| info_number(c, "member", "member_sync_rows_read");
        wait_until(Duration::from_secs(60), || read_now(&mut c) >= share);
        let read = read_now(&mut c);
        assert!(
            read >= share && read < 2 * share,
            "{}: read {read} logged rows for {share} of its slots (last sync error: {:?})",
            n.addr(),
            set_info(&mut c, set, "sync_last_error"),
        );
        assert_eq!(
            info_number(&mut c, "stats", "evicted_keys"),
            0,
            "{}",
            n.addr()
        );
        let mut p = redis::pipe();
        for i in 0..APP_KEYS {
            p.cmd("EXISTS").arg(format!("{{{tag}}}:app:{i}"));
        }
        let alive: Vec<i64> = p.query(&mut c).unwrap();
        assert_eq!(
            alive.iter().sum::<i64>(),
            APP_KEYS as i64,
            "application keys evicted on {}",
            n.addr()
        );
        let rise = peak_allocated(&mut c) - peak_before;
        assert!(
            rise < PEAK_BUDGET,
            "{}: the pass raised peak.allocated by {rise} bytes",
            n.addr()
        );
    }
    // Every row is visible, from its slot's owner's filter.
    for i in [1, 2, 333_333, 500_000, 777_777, CLUSTER_ROWS] {
        let item = format!("cb-{i}");
        let owner = cl.owner(cl.keyslot(&item));
        let mut c = owner.conn();
        assert!(
            wait_until(SETTLE, || explain(&mut c, set, &item).0 == 1),
            "{item} not visible on {}: {:?}",
            owner.addr(),
            explain(&mut c, set, &item)
        );
        assert_in_filter(&owner.vk, &mut c, set, &[item], "after the bulk insert");
    }
}
