//! Issue 8, step 5 (docs/cluster-placement.md): a client routes by the bytes it sends, the
//! module decides by the canonical form. A node that gets an item whose canonical form hashes
//! to a slot another primary holds forwards it there over the cluster bus; the holder runs
//! its own funnel and answers. The shared cluster (3 primaries, 3 replicas); the migration
//! test on the second one kept for slot moves.
use crate::support;

use std::time::Duration;

use support::cluster::{
    stall_exclusive, stall_shared as shared, while_stopped, Cluster, ConfigFor, Migrating, Node,
};
use support::member::*;
use support::wait_until;

fn create(cl: &Cluster, set: &str, normalize: &str) {
    ok(
        &mut cl.set_owner(set).conn(),
        &["MEMBER.CREATE", set, "NORMALIZE", normalize],
    );
    cl.wait_ready(set);
}

/// The primary that the cluster routes `item` to.
fn node_of<'a>(cl: &'a Cluster, item: &str) -> &'a Node {
    cl.owner(cl.keyslot(item))
}

fn counter(n: &Node, name: &str) -> i64 {
    info_field(&mut n.conn(), name)
        .unwrap_or_else(|e| panic!("{e} on {}", n.addr()))
        .parse()
        .unwrap()
}

/// The spellings of item `i`: two a client may send, then the canonical one.
type Forms = fn(usize) -> [String; 3];

/// Three spellings of one item, `forms(i) = [a, b, canonical]`, whose slots lie on three
/// different primaries: the first `i` for which that holds.
fn spread(cl: &Cluster, forms: impl Fn(usize) -> [String; 3]) -> [String; 3] {
    (0..500)
        .map(forms)
        .find(|f| {
            let p: Vec<u16> = f.iter().map(|x| node_of(cl, x).port()).collect();
            p[0] != p[1] && p[1] != p[2] && p[0] != p[2]
        })
        .expect("no spelling spread over three primaries")
}

/// `<PREFIX>-<i>` and its lower-case form for the first `i` whose two slots differ but have
/// the same owner: a call routed by the spelling is served on that node for another of its
/// slots.
fn same_node_spelling(cl: &Cluster, prefix: &str) -> (String, String) {
    (0..2000)
        .map(|i| {
            let raw = format!("{prefix}-{i}");
            let canon = raw.to_lowercase();
            (raw, canon)
        })
        .find(|(r, c)| {
            cl.keyslot(r) != cl.keyslot(c) && node_of(cl, r).port() == node_of(cl, c).port()
        })
        .expect("no spelling with both slots on one primary")
}

/// The normalization test of the issue: ADD in one form, EXISTS in another, each sent where
/// the cluster routes it, and three different primaries involved. The answers come from the
/// holder of the canonical slot, through its funnel (a cache hit there, not a blind database
/// read elsewhere), and its replica gets the effects.
#[test]
fn add_in_one_form_exists_in_another_on_a_third_node() {
    let _stall = shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let spellings: [(&str, Forms); 2] = [
        ("lower", |i| {
            [
                format!("  Alice-{i}"),
                format!("ALICE-{i}"),
                format!("alice-{i}"),
            ]
        }),
        ("username", |i| {
            [
                format!("Ａｌｉｃｅ-{i} "),
                format!("ALICE-{i}"),
                format!("alice-{i}"),
            ]
        }),
    ];
    for (normalize, forms) in spellings {
        let set = format!("fwd_{normalize}");
        create(cl, &set, normalize);
        let [a, b, canon] = spread(cl, forms);
        let (na, nb, owner) = (node_of(cl, &a), node_of(cl, &b), node_of(cl, &canon));
        let (sent, served) = (
            counter(na, "forwarded_sent"),
            counter(owner, "forwarded_served"),
        );

        assert_eq!(int(&mut na.conn(), &["MEMBER.ADD", &set, &a]), 1);
        assert_eq!(int(&mut na.conn(), &["MEMBER.ADD", &set, &a]), 0, "{set}");
        // (Other tests of this file forward too, through the same nodes: at least.)
        assert!(counter(na, "forwarded_sent") >= sent + 2);
        assert!(counter(owner, "forwarded_served") >= served + 2);

        assert_eq!(int(&mut nb.conn(), &["MEMBER.EXISTS", &set, &b]), 1);
        // The holder filled its cache on that lookup: the next answer, asked through the
        // third node, is the holder's cache hit.
        assert_eq!(explain(&mut nb.conn(), &set, &b), (1, "cache-hit".into()));
        assert_eq!(int(&mut owner.conn(), &["MEMBER.EXISTS", &set, &canon]), 1);
        // The cache entry is the holder's alone: the forwarding nodes wrote none.
        let pattern = format!("member:*:{set}:hit:*");
        for (n, want) in [(na, 0), (nb, 0), (owner, 1)] {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query(&mut n.conn())
                .unwrap();
            assert_eq!(keys.len(), want, "{} holds {keys:?}", n.addr());
        }
        // The holder's replica got the effects, as for a local ADD.
        let mut rc = cl.replica_of(owner).conn();
        ok(&mut rc, &["READONLY"]);
        assert!(
            wait_until(Duration::from_secs(10), || int(
                &mut rc,
                &["MEMBER.EXISTS", &set, &canon]
            ) == 1),
            "replica of {} never saw {canon}",
            owner.addr()
        );
    }
}

/// An item never added, asked in a non-canonical form: the holder's filter says no.
#[test]
fn a_missing_item_in_another_form_is_a_bloom_negative_of_the_holder() {
    let _stall = shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "fwd_missing";
    create(cl, set, "lower");
    let [a, b, canon] = spread(cl, |i| {
        [
            format!("Nobody-{i}"),
            format!(" NOBODY-{i}"),
            format!("nobody-{i}"),
        ]
    });
    for form in [&a, &b] {
        let n = node_of(cl, form);
        assert_eq!(
            explain(&mut n.conn(), set, form),
            (0, "bloom-negative".into())
        );
        assert_eq!(int(&mut n.conn(), &["MEMBER.EXISTS", set, form]), 0);
    }
    assert_eq!(
        explain(&mut node_of(cl, &canon).conn(), set, &canon),
        (0, "bloom-negative".into())
    );
}

/// DEL through a non-canonical form removes the membership for every form on every node;
/// an ADD's expiry travels with it.
#[test]
fn del_and_expiry_travel_with_the_forwarded_write() {
    let _stall = shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "fwd_del";
    create(cl, set, "lower");
    let [a, b, canon] = spread(cl, |i| {
        [
            format!("Gone-{i}"),
            format!("GONE-{i} "),
            format!("gone-{i}"),
        ]
    });
    assert_eq!(
        int(
            &mut node_of(cl, &canon).conn(),
            &["MEMBER.ADD", set, &canon]
        ),
        1
    );
    for form in [&a, &b, &canon] {
        assert_eq!(
            int(&mut node_of(cl, form).conn(), &["MEMBER.EXISTS", set, form]),
            1
        );
    }
    assert_eq!(
        int(&mut node_of(cl, &b).conn(), &["MEMBER.DEL", set, &b]),
        1
    );
    assert_eq!(
        int(&mut node_of(cl, &a).conn(), &["MEMBER.DEL", set, &a]),
        0
    );
    for form in [&a, &b, &canon] {
        let n = node_of(cl, form);
        assert_eq!(
            int(&mut n.conn(), &["MEMBER.EXISTS", set, form]),
            0,
            "{form}"
        );
    }

    // TTL 1 through a forwarding node: a member now, gone once it expires.
    let mut ca = node_of(cl, &a).conn();
    assert_eq!(int(&mut ca, &["MEMBER.ADD", set, &a, "TTL", "1"]), 1);
    assert_eq!(
        int(
            &mut node_of(cl, &canon).conn(),
            &["MEMBER.EXISTS", set, &canon]
        ),
        1
    );
    assert!(wait_until(Duration::from_secs(10), || {
        int(&mut ca, &["MEMBER.EXISTS", set, &a]) == 0
    }));
}

/// The holder does not answer within the forwarding node's `member.db-timeout-ms` (its
/// process is stopped): the client gets UNAVAILABLE, exactly once, and the late answer is dropped.
/// The ADD itself may still happen (UNAVAILABLE leaves the outcome open): every node then
/// agrees that it did.
#[test]
fn a_holder_too_slow_to_answer_gives_unavailable_and_nothing_wrong_after() {
    let _stall = stall_exclusive();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "fwd_slow";
    create(cl, set, "lower");
    let [a, b, canon] = spread(cl, |i| {
        [
            format!("Slow-{i}"),
            format!("SLOW-{i}"),
            format!("slow-{i}"),
        ]
    });
    let (na, owner) = (node_of(cl, &a), node_of(cl, &canon));
    let timeouts = counter(na, "forwarded_timeouts");
    let e = {
        let _short = ConfigFor::set(na, "member.db-timeout-ms", "200");
        // The ADD goes out once the owner is stopped.
        while_stopped(owner, || err(&mut na.conn(), &["MEMBER.ADD", set, &a]))
    };
    assert!(
        e.starts_with("UNAVAILABLE the node holding the item's canonical slot did not answer"),
        "{e}"
    );
    assert!(counter(na, "forwarded_timeouts") > timeouts);
    assert!(wait_until(Duration::from_secs(5), || counter(
        na,
        "forwarded_waiting"
    ) == 0));
    // The owner ran the ADD once it woke: all forms agree, on every node they route to.
    assert!(wait_until(Duration::from_secs(5), || int(
        &mut owner.conn(),
        &["MEMBER.EXISTS", set, &canon]
    ) == 1));
    for form in [&a, &b] {
        assert_eq!(
            int(&mut node_of(cl, form).conn(), &["MEMBER.EXISTS", set, form]),
            1
        );
    }
    assert_eq!(int(&mut na.conn(), &["MEMBER.ADD", set, &a]), 0);
}

/// `NORMALIZE none`: raw and canonical are one form, so each spelling is its own item,
/// answered where it is routed.
#[test]
fn sets_without_normalization_keep_every_spelling_apart() {
    let _stall = shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "fwd_none";
    create(cl, set, "none");
    for i in 0..20 {
        let item = format!("  Raw-{i}");
        let mut c = node_of(cl, &item).conn();
        assert_eq!(int(&mut c, &["MEMBER.ADD", set, &item]), 1);
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", set, &item]), 1);
        let other = format!("raw-{i}");
        let mut c = node_of(cl, &other).conn();
        assert_eq!(explain(&mut c, set, &other), (0, "bloom-negative".into()));
    }
}

/// A tokenized set in a cluster: the membership is the token's, whose slot is unrelated to the
/// raw item's, so calls are forwarded (token only) to the primary holding the token's slot.
/// Every node needs the key.
#[test]
fn a_tokenized_set_is_served_by_the_holder_of_each_tokens_slot() {
    let _stall = shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let dir = std::env::temp_dir().join(format!("member-cluster-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("token.key");
    std::fs::write(
        &key,
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    )
    .unwrap();
    for n in &cl.nodes {
        ok(
            &mut n.conn(),
            &[
                "CONFIG",
                "SET",
                "member.token-key-file",
                key.to_str().unwrap(),
            ],
        );
    }
    let set = "tokens";
    ok(
        &mut cl.set_owner(set).conn(),
        &[
            "MEMBER.CREATE",
            set,
            "NORMALIZE",
            "lower",
            "TOKENIZE",
            "hmac-sha256",
        ],
    );
    cl.wait_ready(set);
    let items: Vec<String> = (0..12).map(|i| format!("Card-{i}")).collect();
    for it in &items {
        assert_eq!(
            int(&mut node_of(cl, it).conn(), &["MEMBER.ADD", set, it]),
            1,
            "{it}"
        );
    }
    for it in &items {
        // Another spelling, routed by its own bytes.
        let other = it.to_uppercase();
        assert_eq!(
            int(
                &mut node_of(cl, &other).conn(),
                &["MEMBER.EXISTS", set, &other]
            ),
            1
        );
    }
    let absent = "never-a-card";
    assert_eq!(
        explain(&mut node_of(cl, absent).conn(), set, absent),
        (0, "bloom-negative".into())
    );
    // The database holds tokens only.
    let raw: i64 = cl
        .db()
        .client()
        .query_one(
            "SELECT count(*) FROM member_tokens WHERE entity_id ILIKE 'card-%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(raw, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A slot migrating away: the server sends its own commands (the canonical spelling's ADD
/// among them) to the importing node with ASK, while another spelling whose raw slot stays
/// on the old owner is still decided there. The old owner must not believe its filter's
/// negative for that slot then (its filter lacks what the importing node took): it asks the
/// database. Found by reading the readiness rule against the migration flow.
#[test]
fn a_migrating_slots_items_are_not_answered_absent_by_its_old_owner() {
    // The cluster kept for slot moves: no other test's stall reaches its nodes.
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let set = "fwd_mig";
    create(cl, set, "lower");
    // An item whose canonical and raw slots differ but have the same owner A.
    let (raw, canon) = same_node_spelling(cl, "MIG");
    let slot = cl.keyslot(&canon);
    let a = node_of(cl, &canon);
    let b = cl
        .primaries()
        .find(|n| n.port() != a.port())
        .expect("a second primary");
    let mut ac = a.conn();
    // A's negative is trusted before the migration (the filter decides, no database).
    assert!(wait_until(Duration::from_secs(20), || {
        explain(&mut ac, set, &raw).1 == "bloom-negative"
    }));
    // Whatever happens below, the slot is STABLE again for the other tests of this cluster.
    let _stable = Migrating::start(a, b, slot);
    // At once, not after the module's next 100 ms poll of slot states: A learns of the
    // migration from the SETSLOT itself. The ADD of the canonical spelling, as a cluster client
    // sends it after A's ASK.
    let mut bc = b.conn();
    let asked: redis::Value = redis::cmd("ASKING").query(&mut bc).unwrap();
    assert_eq!(asked, redis::Value::Okay);
    let added = int(&mut bc, &["MEMBER.ADD", set, &canon]);
    // At once, the other spelling on the old owner: never 0.
    let answer = int(&mut ac, &["MEMBER.EXISTS", set, &raw]);
    assert_eq!(added, 1);
    assert_eq!(
        answer, 1,
        "{raw} answered 0 by the old owner of slot {slot} while it migrated"
    );
}

/// A spelling whose canonical slot is another slot of the node it was routed to: that node
/// serves it just after the command, outside it (inside, the server finds the keys a module
/// opens only in the slot the command was routed by), so its exact-match entry, which lies in
/// the canonical slot, is found: the lookups after the first are cache hits.
#[test]
fn a_spelling_whose_canonical_slot_is_another_of_this_node_finds_its_cache_entry() {
    let _stall = shared();
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "fwd_here";
    ok(
        &mut cl.set_owner(set).conn(),
        &[
            "MEMBER.CREATE",
            set,
            "NORMALIZE",
            "lower",
            "RECENT-TTL",
            "1",
        ],
    );
    cl.wait_ready(set);
    let (raw, canon) = same_node_spelling(cl, "HERE");
    let n = node_of(cl, &raw);
    let mut c = n.conn();
    assert_eq!(int(&mut c, &["MEMBER.ADD", set, &raw]), 1);
    assert!(
        wait_until(Duration::from_secs(10), || {
            explain(&mut c, set, &raw) == (1, "cache-hit".to_string())
        }),
        "{raw} (canonical {canon}) never answered from its cache entry: {:?}",
        explain(&mut c, set, &raw)
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", set, &raw]), 1);
    // A READONLY replica of that node answers the same spelling itself, as its primary does:
    // both slots are its primary's.
    let replica = cl.replica_of(n);
    let mut rc = replica.conn();
    ok(&mut rc, &["READONLY"]);
    let sent = counter(replica, "forwarded_sent");
    assert!(wait_until(Duration::from_secs(10), || int(
        &mut rc,
        &["MEMBER.EXISTS", set, &raw]
    ) == 1));
    assert_eq!(
        counter(replica, "forwarded_sent"),
        sent,
        "the replica sent the lookup to its primary"
    );
}
