//! Issue 8, step 4a (docs/cluster-placement.md): in a real cluster (3 primaries, 3 replicas,
//! shared by the cluster tests; the test that moves a slot uses the second one kept for
//! that), filters live in module memory, no key is kept per slot, and a filter negative
//! counts only for a slot the node has held, with no command since that could have moved it,
//! for longer than the grace. Writes whose canonical form lies in another node's slot are
//! forwarded to that slot's holder.
use crate::chaos_harness::router::keyslot;
use crate::support;

use std::time::Duration;

use redis::{Connection, Value};
use support::cluster::{Cluster, Node};
use support::member::*;
use support::wait_until;

fn number(c: &mut Connection, set: &str, field: &str) -> i64 {
    set_info(c, set, field)
        .unwrap_or_else(|e| panic!("{e}"))
        .parse()
        .unwrap()
}

/// A per-item call sent where the cluster routes it: the owner of its item's slot.
fn routed(cl: &Cluster, args: &[&str]) -> i64 {
    int(&mut cl.owner(cl.keyslot(args[2])).conn(), args)
}

/// Keys named like the per-slot sentinels of earlier versions (`member:{<tag>}:owner`) on `n`.
fn legacy_sentinels(n: &Node) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("member:{*}:owner")
        .query(&mut n.conn())
        .unwrap()
}

/// The name an earlier version gave slot `slot`'s sentinel: `member:{T}:owner`, where `T` is
/// the slot's first tag over `0-9a-zA-Z` by length, then in alphabet order
/// (`src/model/slot.rs`, which the module's keys share).
fn legacy_sentinel_name(slot: u16) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let words = (1..=3u32).flat_map(|n| {
        (0..ALPHABET.len().pow(n)).map(move |mut i| {
            let mut w = vec![0u8; n as usize];
            for c in w.iter_mut().rev() {
                *c = ALPHABET[i % ALPHABET.len()];
                i /= ALPHABET.len();
            }
            w
        })
    });
    let tag = words.into_iter().find(|t| keyslot(t) == slot).unwrap();
    format!("member:{{{}}}:owner", String::from_utf8(tag).unwrap())
}

/// Creates `set` (spellings kept apart) on the primary its name routes to and waits until
/// every node serves it from a filter that covers its slots.
fn create_ready(cl: &Cluster, set: &str) {
    ok(
        &mut cl.set_owner(set).conn(),
        &["MEMBER.CREATE", set, "NORMALIZE", "none"],
    );
    cl.wait_ready(set);
}

/// The filter did not answer for `item`: the database said "absent", or did not answer in time
/// (`UNAVAILABLE`, on a busy machine). Never a 0 from the filter.
fn asked_the_database(c: &mut Connection, set: &str, item: &str) {
    match redis::cmd("MEMBER.EXPLAIN")
        .arg(set)
        .arg(item)
        .query::<(i64, String)>(c)
    {
        Ok(v) => assert_eq!(v, (0, "db-miss".into()), "{item}"),
        Err(e) => assert_eq!(e.code(), Some("UNAVAILABLE"), "{item}: {e}"),
    }
}

/// The first item `prefix<i>` that is absent from `set` (never added), and its slot.
fn probe(cl: &Cluster, prefix: &str) -> (String, u16) {
    let item = format!("{prefix}-absent");
    let slot = cl.keyslot(&item);
    (item, slot)
}

/// The first item `prefix-<i>` of `slot`. One in 16 384 items lands there: the search hashes
/// locally (asking the server about each, on a connection of its own, took minutes on a busy
/// machine), and the server confirms the item it found.
fn item_in_slot(cl: &Cluster, prefix: &str, slot: u16) -> String {
    let item = (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|m| keyslot(m.as_bytes()) == slot)
        .unwrap();
    assert_eq!(cl.keyslot(&item), slot, "CLUSTER KEYSLOT {item}");
    item
}

/// Slot fills `node` has finished.
pub(crate) fn fills_done(node: &Node) -> u64 {
    info_field(&mut node.conn(), "slot_fills_done")
        .unwrap()
        .parse()
        .unwrap()
}

/// Waits until `node` answers `absent` of `slot` from its filter: the slot is covered there.
fn answers_from_filter(node: &Node, set: &str, absent: &str, slot: u16) {
    let mut c = node.conn();
    assert!(
        wait_until(Duration::from_secs(30), || {
            bloom_negative_now(&mut c, set, absent)
        }),
        "slot {slot} never answered from the filter on {}: {:?}",
        node.addr(),
        explain(&mut c, set, absent)
    );
}

#[test]
fn every_owned_slot_is_known_and_the_module_keeps_no_key_per_slot() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "slotmap";
    create_ready(cl, set);
    let mut owned_total = 0;
    for n in &cl.nodes {
        let mut c = n.conn();
        let owned = number(&mut c, set, "cluster_slots_owned");
        // MEMBER.INFO says which node's part it shows.
        assert_eq!(
            set_info(&mut c, set, "cluster_node").as_deref(),
            Ok(n.id.as_str())
        );
        let role = if n.primary { "primary" } else { "replica" };
        assert_eq!(set_info(&mut c, set, "cluster_role").as_deref(), Ok(role));
        assert!((5000..=5600).contains(&owned), "{}: {owned}", n.addr());
        if n.primary {
            owned_total += owned;
        }
        assert_eq!(set_info(&mut c, set, "filter_present").as_deref(), Ok("1"));
        // No key per slot: a cluster costs the module nothing that grows with its slots.
        assert_eq!(legacy_sentinels(n), Vec::<String>::new(), "{}", n.addr());
    }
    assert_eq!(owned_total, 16384);
    // The filter lives in module memory, not at a key of some slot.
    let bloom = format!("member:{set}:bloom");
    let holder = cl.owner(cl.keyslot(&bloom));
    assert_eq!(int(&mut holder.conn(), &["EXISTS", &bloom]), 0);
    // And a negative now comes from the filter, on the owner and on its replica.
    let (item, slot) = probe(cl, "slotmap");
    let owner = cl.owner(slot);
    assert_eq!(
        explain(&mut owner.conn(), set, &item),
        (0, "bloom-negative".into())
    );
    let mut rc = cl.replica_of(owner).conn();
    ok(&mut rc, &["READONLY"]);
    assert_eq!(explain(&mut rc, set, &item), (0, "bloom-negative".into()));
}

/// The window a poll of `CLUSTER NODES` leaves: a slot that leaves and comes back between two
/// polls. Every command that can give a node a slot is a `CLUSTER` command run on it (on a
/// replica, its primary's SETSLOT arrives first), so the command filter makes the slot wait
/// out a new grace. A `SETSLOT … STABLE` of a slot that is not moving changes nothing the poll
/// could see: only the filter can make the slot wait, on the owner and on its replica, and
/// only that slot.
#[test]
fn a_slot_that_may_have_changed_hands_waits_out_a_new_grace() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "comeback";
    create_ready(cl, set);
    let (item, slot) = probe(cl, "comeback");
    let owner = cl.owner(slot);
    let mut c = owner.conn();
    let mut rc = cl.replica_of(owner).conn();
    ok(&mut rc, &["READONLY"]);
    assert!(wait_until(Duration::from_secs(30), || {
        bloom_negative_now(&mut rc, set, &item)
    }));
    assert_eq!(explain(&mut c, set, &item), (0, "bloom-negative".into()));
    // Valkey 8 replicates SETSLOT to the replicas and waits for their acknowledgement before
    // it runs it on the primary: when it answers, both have seen it. Redis 7.0 does not
    // replicate it (docs/limits.md): there the replica follows at its next poll.
    let server = support::server_version(&mut c);
    let replicated = server.valkey_at_least((8, 0, 0));
    ok(&mut c, &["CLUSTER", "SETSLOT", &slot.to_string(), "STABLE"]);
    asked_the_database(&mut c, set, &item);
    if replicated {
        asked_the_database(&mut rc, set, &item);
    } else {
        eprintln!("{server} does not replicate SETSLOT: the replica's part is not checked");
    }
    // Other slots are not affected.
    let other = (1..)
        .map(|i| format!("comeback-other-{i}"))
        .find(|i| {
            let s = cl.keyslot(i);
            s != slot && cl.owner(s).port() == owner.port()
        })
        .unwrap();
    assert_eq!(explain(&mut c, set, &other), (0, "bloom-negative".into()));
    // After the grace and a sync pass, the slot answers from the filter again.
    for conn in [&mut c, &mut rc] {
        assert!(
            wait_until(Duration::from_secs(30), || {
                bloom_negative_now(conn, set, &item)
            }),
            "slot {slot} never became ready again"
        );
    }
}

/// A primary runs a `CLUSTER SETSLOT` without replicating it when no replica is online, so a
/// replica whose link was down may never see a slot leave and come back: when its link to its
/// primary drops (and again when it comes back), it waits out a new grace for every slot. Run
/// on the cluster kept for tests that disturb it, so that no other test reads this replica
/// meanwhile.
#[test]
fn a_replica_whose_link_to_its_primary_dropped_waits_out_a_new_grace() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "relink";
    create_ready(cl, set);
    let (item, _slot) = probe(cl, "relink");
    let owner = cl.owner(cl.keyslot(&item));
    let replica = cl.replica_of(owner);
    let mut rc = replica.conn();
    ok(&mut rc, &["READONLY"]);
    assert!(wait_until(Duration::from_secs(30), || {
        bloom_negative_now(&mut rc, set, &item)
    }));
    // The link-down event comes as the server drops its primary's connection, before the
    // kill returns.
    let killed = int(&mut replica.conn(), &["CLIENT", "KILL", "TYPE", "master"]);
    assert_eq!(killed, 1);
    asked_the_database(&mut rc, set, &item);
    // The replica reconnects by itself; after the grace and a sync pass its filter answers.
    assert!(
        wait_until(Duration::from_secs(60), || {
            bloom_negative_now(&mut rc, set, &item)
        }),
        "the replica never trusted its filter again"
    );
}

/// A dataset from an earlier version holds one sentinel key per slot. The owner deletes the
/// one it finds in a slot it accepts, and its replica follows.
#[test]
fn sentinel_keys_of_earlier_versions_are_deleted() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let slot = cl.keyslot("legacy-sentinel");
    let key = legacy_sentinel_name(slot);
    assert_eq!(cl.keyslot(&key), slot);
    let owner = cl.owner(slot);
    let mut c = owner.conn();
    let _: () = redis::cmd("SET").arg(&key).arg("x").query(&mut c).unwrap();
    // Accepted afresh (as after a restart or a migration), the slot loses the key.
    ok(&mut c, &["CLUSTER", "SETSLOT", &slot.to_string(), "STABLE"]);
    assert!(
        wait_until(Duration::from_secs(10), || int(&mut c, &["EXISTS", &key])
            == 0),
        "{key} was never deleted"
    );
    let mut rc = cl.replica_of(owner).conn();
    ok(&mut rc, &["READONLY"]);
    assert!(wait_until(Duration::from_secs(10), || int(
        &mut rc,
        &["EXISTS", &key]
    ) == 0));
    // MEMBER._OWN is refused from a client, as every internal command, and changes nothing.
    let _: () = redis::cmd("SET").arg(&key).arg("x").query(&mut c).unwrap();
    assert!(redis::cmd("MEMBER._OWN")
        .arg(&key)
        .query::<Value>(&mut c)
        .is_err());
    assert_eq!(int(&mut c, &["DEL", &key]), 1);
}

/// Only the module writes its keys, in cluster form too: the bytes of a cache entry set again
/// by a plain SET after a DEL are not believed.
#[test]
fn a_foreign_set_onto_the_modules_keys_is_not_believed() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "forged";
    ok(
        &mut cl.set_owner(set).conn(),
        &["MEMBER.CREATE", set, "CACHE-TTL", "300", "RECENT-TTL", "1"],
    );
    cl.wait_ready(set);
    let item = "erin";
    let slot = cl.keyslot(item);
    let owner = cl.owner(slot);
    let mut c = owner.conn();
    assert_eq!(int(&mut c, &["MEMBER.ADD", set, item]), 1);
    // Past RECENT-TTL: the filter's hit goes to the cache.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", set, item]), 1);
    assert_eq!(explain(&mut c, set, item), (1, "cache-hit".into()));
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("member:*:{set}:hit:*"))
        .query(&mut c)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let value: Vec<u8> = redis::cmd("GET").arg(&keys[0]).query(&mut c).unwrap();
    assert_eq!(int(&mut c, &["MEMBER.DEL", set, item]), 1);
    let _: () = redis::cmd("SET")
        .arg(&keys[0])
        .arg(&value)
        .arg("EX")
        .arg(300)
        .query(&mut c)
        .unwrap();
    match redis::cmd("MEMBER.EXPLAIN")
        .arg(set)
        .arg(item)
        .query::<(i64, String)>(&mut c)
    {
        Ok(v) => assert_eq!(v.0, 0, "a deleted member answered {v:?}"),
        Err(e) => assert_eq!(e.code(), Some("UNAVAILABLE"), "{e}"),
    }
}

/// A client routes by the bytes it sends; only the holder of the canonical form's slot changes
/// what its filter and cache hold. Another node forwards such a write there over the cluster
/// bus (step 5; tests/all/cluster_forward.rs has the rest).
#[test]
fn a_write_whose_canonical_form_lies_elsewhere_is_forwarded_there() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "canonical";
    ok(
        &mut cl.set_owner(set).conn(),
        &["MEMBER.CREATE", set, "NORMALIZE", "lower"],
    );
    cl.wait_ready(set);
    let (raw, canon) = (0..)
        .map(|i| (format!("Mixed-{i}"), format!("mixed-{i}")))
        .find(|(r, l)| cl.owner(cl.keyslot(r)).port() != cl.owner(cl.keyslot(l)).port())
        .unwrap();
    let raw_owner = cl.owner(cl.keyslot(&raw));
    let mut c = raw_owner.conn();
    assert_eq!(int(&mut c, &["MEMBER.ADD", set, &raw]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", set, &raw]), 0);
    // Written where the canonical form lives: its owner answers it in that form, from its
    // cache once filled; through the other node, the answer is the owner's.
    assert_eq!(routed(cl, &["MEMBER.EXISTS", set, &canon]), 1);
    assert_eq!(
        explain(&mut cl.owner(cl.keyslot(&canon)).conn(), set, &canon),
        (1, "cache-hit".into())
    );
    assert_eq!(explain(&mut c, set, &raw), (1, "cache-hit".into()));
    assert_eq!(int(&mut c, &["MEMBER.DEL", set, &raw]), 1);
    assert_eq!(routed(cl, &["MEMBER.EXISTS", set, &canon]), 0);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", set, &raw]), 0);
    // The same item in a form of its own slot is written where it lands.
    assert_eq!(routed(cl, &["MEMBER.ADD", set, "same"]), 1);
    assert_eq!(routed(cl, &["MEMBER.EXISTS", set, "SAME"]), 1);
}

/// The filters held in module memory are saved in the RDB aux field and come back with the
/// dataset (DEBUG RELOAD here; a replica's full synchronization reads the same field): the
/// node serves them again without a rebuild, once caught up.
#[test]
fn filters_come_back_with_the_dataset() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "carried";
    ok(
        &mut cl.set_owner(set).conn(),
        &["MEMBER.CREATE", set, "NORMALIZE", "none"],
    );
    assert_eq!(routed(cl, &["MEMBER.ADD", set, "kept"]), 1);
    cl.wait_ready(set);
    let owner = cl.owner(cl.keyslot("kept"));
    let mut c = owner.conn();
    // This set's last rebuild (the node-wide count also moves with other tests' sets on the
    // same cluster): its duration, to the millisecond, changes with any rebuild after it.
    let last_rebuild = |c: &mut redis::Connection| {
        ["last_rebuild", "last_rebuild_s", "rebuild_state"].map(|f| set_info(c, set, f))
    };
    let rebuilds = last_rebuild(&mut c);
    let bits = set_info(&mut c, set, "filter_bits");
    ok(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(set_info(&mut c, set, "filter_present").as_deref(), Ok("1"));
    assert_eq!(set_info(&mut c, set, "filter_bits"), bits);
    cl.wait_ready(set);
    assert_eq!(explain(&mut c, set, "kept").0, 1);
    let (item, slot) = probe(cl, "carried");
    assert_eq!(
        explain(&mut cl.owner(slot).conn(), set, &item),
        (0, "bloom-negative".into())
    );
    assert_eq!(last_rebuild(&mut c), rebuilds, "rebuilt after the reload");
}

/// Step 4b: each primary's filter is sized for, and filled with, its own slots only, so the
/// set's memory summed over the primaries is that of one filter for the whole set.
#[test]
fn each_primary_holds_only_its_share_of_the_filter() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "shares";
    let capacity = 300_000;
    ok(
        &mut cl.set_owner(set).conn(),
        &[
            "MEMBER.CREATE",
            set,
            "CAPACITY",
            &capacity.to_string(),
            "NORMALIZE",
            "none",
        ],
    );
    cl.wait_ready(set);
    let mut bits = 0;
    for n in cl.primaries() {
        let mut c = n.conn();
        assert_eq!(
            set_info(&mut c, set, "cluster_slots_covered"),
            set_info(&mut c, set, "cluster_slots_owned")
        );
        bits += number(&mut c, set, "filter_bits");
    }
    let per_member = bits as f64 / capacity as f64;
    // One filter at 1 % needs 9.6 bits per member; three whole-table copies would need 28.8.
    assert!(
        per_member < 10.0,
        "{per_member:.2} bits per member over the primaries"
    );
}

/// Moves `slot` from `src` to `dst` the way `valkey-cli --cluster reshard` does.
pub(crate) fn move_slot(cl: &Cluster, slot: u16, src: &Node, dst: &Node) {
    let s = slot.to_string();
    ok(
        &mut dst.conn(),
        &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src.id],
    );
    ok(
        &mut src.conn(),
        &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst.id],
    );
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut src.conn())
            .unwrap();
        if keys.is_empty() {
            break;
        }
        let mut m = redis::cmd("MIGRATE");
        m.arg("127.0.0.1")
            .arg(dst.port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS");
        for k in &keys {
            m.arg(k);
        }
        let _: Value = m.query(&mut src.conn()).unwrap();
    }
    for n in cl.primaries() {
        ok(&mut n.conn(), &["CLUSTER", "SETSLOT", &s, "NODE", &dst.id]);
    }
    assert!(wait_until(Duration::from_secs(10), || cl
        .owner(slot)
        .port()
        == dst.port()));
}

/// A slot that arrives is filled in place (its rows read and added) and answers from the
/// filter once filled and past the grace; the node it left keeps covering it (the sync loop
/// goes on applying its rows), so when it comes back no fill is needed.
#[test]
fn a_slot_that_arrives_is_filled_and_one_that_returns_is_still_covered() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "arrivals";
    create_ready(cl, set);
    let (absent, slot) = probe(cl, "arrivals");
    let src = cl.owner(slot);
    let dst = cl.primaries().find(|n| n.port() != src.port()).unwrap();
    // A member of the slot, added on its owner before the move.
    let member = item_in_slot(cl, "arrivals-member", slot);
    assert_eq!(int(&mut src.conn(), &["MEMBER.ADD", set, &member]), 1);
    let fills_before = fills_done(dst);

    move_slot(cl, slot, src, dst);
    let mut d = dst.conn();
    assert_eq!(int(&mut d, &["MEMBER.EXISTS", set, &member]), 1);
    answers_from_filter(dst, set, &absent, slot);
    assert!(fills_done(dst) > fills_before);
    assert_eq!(
        set_info(&mut d, set, "cluster_slots_covered"),
        set_info(&mut d, set, "cluster_slots_owned")
    );
    // Added where the slot is now, then the slot goes back.
    let later = item_in_slot(cl, "arrivals-later", slot);
    assert_eq!(int(&mut d, &["MEMBER.ADD", set, &later]), 1);
    let fills_src = fills_done(src);
    move_slot(cl, slot, dst, src);
    let mut c = src.conn();
    for m in [&member, &later] {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", set, m]), 1, "{m}");
    }
    assert!(wait_until(Duration::from_secs(30), || {
        bloom_negative_now(&mut c, set, &absent)
    }));
    // Past the grace, the filter (not a fill) knows the member added elsewhere.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(explain(&mut c, set, &later).0, 1);
    assert_eq!(
        fills_done(src),
        fills_src,
        "the slot never stopped being covered there"
    );
}

/// An attached set's slot that arrives is filled from the source table too: the application's
/// table has no slot column, so the fill reads its rows and keeps those of the slot.
#[test]
fn an_attached_sets_slot_that_arrives_is_filled_from_the_source() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "att_arrivals";
    let (absent, slot) = probe(cl, "att-arrivals");
    let member = item_in_slot(cl, "att-arrivals-member", slot);
    let mut pg = cl.db().client();
    pg.batch_execute(&format!(
        "CREATE TABLE public.att_arrivals (name text PRIMARY KEY);
         INSERT INTO public.att_arrivals SELECT 'row-' || g FROM generate_series(1, 2000) g;
         INSERT INTO public.att_arrivals VALUES ('{member}')"
    ))
    .unwrap();
    let owner = cl.set_owner(set);
    let c = &mut owner.conn();
    ok(
        c,
        &[
            "CONFIG",
            "SET",
            "member.attach-allow",
            "public.att_arrivals",
        ],
    );
    ok(
        c,
        &[
            "MEMBER.CREATE",
            set,
            "SOURCE",
            "public.att_arrivals",
            "COLUMN",
            "name",
            "SYNC",
            "log",
        ],
    );
    ok(c, &["CONFIG", "SET", "member.attach-allow", ""]);
    cl.wait_ready(set);
    let src = cl.owner(slot);
    let dst = cl.primaries().find(|n| n.port() != src.port()).unwrap();
    let fills_before = fills_done(dst);
    let items_before: i64 = set_info(&mut dst.conn(), set, "filter_items")
        .unwrap()
        .parse()
        .unwrap();

    move_slot(cl, slot, src, dst);
    let mut d = dst.conn();
    answers_from_filter(dst, set, &absent, slot);
    assert!(fills_done(dst) > fills_before);
    // The fill added the slot's row, not the table's other rows.
    let items: i64 = set_info(&mut d, set, "filter_items")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        items > items_before && items < items_before + 10,
        "filter items {items_before} -> {items} for one slot"
    );
    assert_ne!(explain(&mut d, set, &member).1, "bloom-negative");
    assert_eq!(int(&mut d, &["MEMBER.EXISTS", set, &member]), 1);
    move_slot(cl, slot, dst, src);
    ok(&mut cl.set_owner(set).conn(), &["MEMBER.DROP", set]);
}
