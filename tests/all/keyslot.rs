//! Issue 8, step 3: one key slot everywhere. `member_keyslot()` in PostgreSQL, `CLUSTER KEYSLOT`
//! on a real cluster node and the module's Rust `keyslot()` agree on thousands of random items;
//! set tables carry a generated `slot` column that outside writers fill without knowing it;
//! in cluster mode the exact-match keys live in the slot of their item.
use crate::support;

#[allow(dead_code)]
#[path = "../../src/model/slot.rs"]
mod slot;

use std::time::Duration;

use redis::Connection;
use support::cluster::Cluster;
use support::member::*;
use support::wait_until;

/// A small deterministic generator (xorshift64*), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

/// Pieces random items are glued from: braces in every arrangement, ASCII, multi-byte UTF-8.
const PIECES: &[&str] = &[
    "{", "}", "{}", "}{", "{{", "}}", "a", "b", "z", "0", "9", "user", ":", ".", " ", "-", "é",
    "ü", "ß", "中", "文", "ж", "😀", "🦀", "\u{7f}", "\u{1}", "\t", "x{y}z", "{tag}", "{é}",
];

/// At least 2 000 items: fixed awkward cases, then random ones (short glued pieces, random
/// code points, long strings up to the item limit).
fn items() -> Vec<String> {
    let mut out: Vec<String> = [
        "",
        "foo",
        "bar",
        "{user1000}.following",
        "{user1000}.followers",
        "{}",
        "}{",
        "{{a}}",
        "a{b",
        "a}b",
        "{",
        "}",
        "{}{a}",
        "{a}{b}",
        "a{}b{c}",
        "{{}}",
        "}{a}",
        "{a",
        "a}",
        "é{ü}",
        "{😀}x",
        "中{}文",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    while out.len() < 1600 {
        let n = 1 + r.below(8);
        out.push((0..n).map(|_| r.pick(PIECES)).collect());
    }
    while out.len() < 1900 {
        // Random code points (no NUL: PostgreSQL text cannot hold it; no surrogates).
        let n = 1 + r.below(12);
        out.push(
            (0..n)
                .filter_map(|_| {
                    let cp = match r.below(4) {
                        0 => 1 + r.below(0x7f),
                        1 => 0x80 + r.below(0x780),
                        2 => 0x800 + r.below(0xd000),
                        _ => 0x10000 + r.below(0x100000),
                    };
                    char::from_u32(cp as u32)
                })
                .collect(),
        );
    }
    while out.len() < 2100 {
        // Long items, up to the module's limit of 1 024 bytes.
        let want = 100 + r.below(920);
        let mut s = String::new();
        loop {
            let piece = r.pick(PIECES);
            if s.len() + piece.len() > want {
                break;
            }
            s.push_str(piece);
        }
        out.push(s);
    }
    out
}

/// `CLUSTER KEYSLOT` of each item, asked of one node in one pipeline.
fn server_slots(c: &mut Connection, items: &[String]) -> Vec<u16> {
    let mut p = redis::pipe();
    for i in items {
        p.cmd("CLUSTER").arg("KEYSLOT").arg(i.as_bytes());
    }
    p.query(c).expect("CLUSTER KEYSLOT")
}

fn sql_slots(pg: &mut postgres::Client, items: &[String]) -> Vec<u16> {
    pg.query(
        "SELECT member_keyslot(k) FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i",
        &[&items],
    )
    .expect("member_keyslot")
    .iter()
    .map(|r| r.get::<_, i16>(0) as u16)
    .collect()
}

#[test]
fn sql_server_and_rust_agree_on_every_slot() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let items = items();
    assert!(items.len() >= 2000);
    let server = server_slots(&mut cl.nodes[0].conn(), &items);
    // The module installed member_keyslot() when it loaded the catalog.
    let sql = sql_slots(&mut cl.db().client(), &items);
    for (i, item) in items.iter().enumerate() {
        let rust = slot::keyslot(item.as_bytes());
        assert_eq!(sql[i], server[i], "member_keyslot({item:?})");
        assert_eq!(rust, server[i], "keyslot({item:?})");
    }
    // The generator is not degenerate: the items spread over thousands of slots.
    let distinct: std::collections::HashSet<_> = server.iter().collect();
    assert!(distinct.len() > 1000, "{}", distinct.len());
}

#[test]
fn every_slot_tag_is_in_its_slot_on_the_server() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let tags: Vec<String> = (0..slot::SLOTS as u16)
        .map(|s| slot::tag_for_slot(s).to_string())
        .collect();
    let server = server_slots(&mut cl.nodes[0].conn(), &tags);
    for (s, got) in server.iter().enumerate() {
        assert_eq!(*got as usize, s, "tag {:?}", tags[s]);
    }
}

/// Waits until `node` has a complete filter for `set` (its rebuild ran, so the table met
/// `ensure_slot_column`).
fn wait_built(c: &mut Connection, set: &str) {
    assert!(
        wait_until(Duration::from_secs(30), || set_info(
            c,
            set,
            "filter_complete"
        )
        .as_deref()
            == Ok("1")),
        "{set} never built: {:?}",
        cmd(c, &["MEMBER.INFO", set])
    );
}

/// Every row's stored slot, against `CLUSTER KEYSLOT` of its entity.
fn check_stored_slots(cl: &Cluster, pg: &mut postgres::Client, table: &str) -> usize {
    let rows = pg
        .query(&format!("SELECT entity_id, slot FROM {table}"), &[])
        .expect("read slots");
    let entities: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let server = server_slots(&mut cl.nodes[0].conn(), &entities);
    for (r, want) in rows.iter().zip(server) {
        let got: Option<i16> = r.get(1);
        assert_eq!(
            got,
            Some(want as i16),
            "slot of {:?}",
            r.get::<_, String>(0)
        );
    }
    rows.len()
}

fn has_slot_index(pg: &mut postgres::Client, table: &str) -> bool {
    pg.query_one("SELECT to_regclass($1 || '_slot') IS NOT NULL", &[&table])
        .unwrap()
        .get(0)
}

#[test]
fn outside_writers_get_the_slot_filled() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let p = cl.set_owner("ks_outside");
    let mut c = p.conn();
    ok(&mut c, &["MEMBER.CREATE", "ks_outside"]);
    wait_built(&mut c, "ks_outside");
    let mut pg = cl.db().client();
    assert!(has_slot_index(&mut pg, "member_ks_outside"));
    // Plain writes that know nothing of the column: named columns, positional, multi-row, COPY.
    pg.batch_execute(
        "INSERT INTO member_ks_outside (entity_id) VALUES ('alice'), ('{tag}x'), ('中文');
         INSERT INTO member_ks_outside (entity_id, scope, status) VALUES ('bob', 'm1', 1);
         INSERT INTO member_ks_outside VALUES ('carol', '', 1, now(), now(), NULL);
         UPDATE member_ks_outside SET entity_id = 'alicia' WHERE entity_id = 'alice';",
    )
    .expect("outside writes");
    let mut w = pg
        .copy_in("COPY member_ks_outside (entity_id, scope) FROM STDIN")
        .unwrap();
    std::io::Write::write_all(&mut w, "dave\t\n{}\t\n}{é\ts\n".as_bytes()).unwrap();
    w.finish().unwrap();
    assert_eq!(check_stored_slots(cl, &mut pg, "member_ks_outside"), 8);
    // Nobody can store a wrong slot.
    let e = pg
        .execute(
            "INSERT INTO member_ks_outside (entity_id, slot) VALUES ('eve', 1)",
            &[],
        )
        .unwrap_err();
    assert_eq!(
        e.code(),
        Some(&postgres::error::SqlState::GENERATED_ALWAYS),
        "{e:?}"
    );
    // The module's own writes too.
    let mut owner = cl.owner(cl.keyslot("{tag}y")).conn();
    wait_built(&mut owner, "ks_outside");
    assert_eq!(int(&mut owner, &["MEMBER.ADD", "ks_outside", "{tag}y"]), 1);
    assert_eq!(check_stored_slots(cl, &mut pg, "member_ks_outside"), 9);
}

#[test]
fn an_older_table_gets_its_slot_column_when_the_module_meets_it() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let mut pg = cl.db().client();
    // A table as earlier versions created it, with rows, before the set is created.
    pg.batch_execute(
        "CREATE TABLE member_ks_old (
            entity_id text NOT NULL,
            scope text NOT NULL DEFAULT '',
            status smallint NOT NULL DEFAULT 1,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz,
            PRIMARY KEY (entity_id, scope)
         );
         CREATE INDEX member_ks_old_updated_at ON member_ks_old (updated_at);
         INSERT INTO member_ks_old (entity_id)
              SELECT 'old-' || i FROM generate_series(1, 500) i;
         INSERT INTO member_ks_old (entity_id) VALUES ('{x}1'), ('é}{');",
    )
    .unwrap();
    let mut c = cl.set_owner("ks_old").conn();
    ok(&mut c, &["MEMBER.CREATE", "ks_old"]);
    // Every node meets the table (its rebuild); the first adds the column, the rest find it.
    for n in cl.primaries() {
        wait_built(&mut n.conn(), "ks_old");
    }
    assert_eq!(check_stored_slots(cl, &mut pg, "member_ks_old"), 502);
    assert!(has_slot_index(&mut pg, "member_ks_old"));
    // The column is last, as in tables created with it, and was added once.
    let cols: Vec<String> = pg
        .query(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'member_ks_old'::regclass
               AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(cols.last().map(String::as_str), Some("slot"), "{cols:?}");
    // The rows are members, found through the rebuilt filter, on the item's owner.
    let owner = cl.owner(cl.keyslot("old-7"));
    assert_eq!(
        int(&mut owner.conn(), &["MEMBER.EXISTS", "ks_old", "old-7"]),
        1
    );
    // Each primary rebuilds the rows of its own slots: together, the table (REBUILD SYNC,
    // routed by the set name, sums them).
    let total: i64 = redis::cmd("MEMBER.REBUILD")
        .arg("ks_old")
        .arg("SYNC")
        .query(&mut cl.set_owner("ks_old").conn())
        .unwrap();
    assert_eq!(total, 502);
}

/// The exact-match key of an unscoped item of a `NORMALIZE none` set, in cluster form.
fn cluster_cache_key(set: &str, item: &str) -> Vec<u8> {
    let tag = slot::tag_for_slot(slot::keyslot(item.as_bytes()));
    format!("member:{{{tag}}}:{set}:hit:{item}\0").into_bytes()
}

fn exists_key(c: &mut Connection, key: &[u8]) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1
}

#[test]
fn cache_entries_live_in_the_slot_of_their_item() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "ks_cache";
    cl.create_everywhere(set);
    let mut items: Vec<String> = ["alice", "{user1000}.following", "}{", "{}", "é中", "{a}{b}"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    items.extend((0..24).map(|i| format!("item-{i}")));
    let mut nodes_used = std::collections::HashSet::new();
    for item in &items {
        let slot = cl.keyslot(item);
        let owner = cl.owner(slot);
        nodes_used.insert(owner.port());
        let mut c = owner.conn();
        wait_built(&mut c, set);
        assert_eq!(int(&mut c, &["MEMBER.ADD", set, item]), 1, "{item:?}");
        // The database answers, then fills the cache on this node.
        assert_eq!(
            explain(&mut c, set, item),
            (1, "db-hit".to_string()),
            "{item:?}"
        );
        let key = cluster_cache_key(set, item);
        assert!(
            exists_key(&mut c, &key),
            "no cache key for {item:?} on its owner"
        );
        let key_slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut c)
            .unwrap();
        assert_eq!(key_slot, slot, "{item:?}");
        // A key the node owns: CLUSTER COUNTKEYSINSLOT sees it there.
        let in_slot: i64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut c)
            .unwrap();
        assert!(in_slot >= 1, "{item:?}");
        // The module reads the same name it wrote.
        assert_eq!(explain(&mut c, set, item), (1, "cache-hit".to_string()));
        // DEL drops it (the invalidation names the same key); half the items stay cached.
        if item.len() % 2 == 0 {
            assert_eq!(int(&mut c, &["MEMBER.DEL", set, item]), 1);
            assert!(!exists_key(&mut c, &key), "{item:?} still cached after DEL");
            assert_eq!(explain(&mut c, set, item).0, 0);
        }
    }
    assert_eq!(nodes_used.len(), 3, "the items should reach every primary");
    // Every cache key of the set on each primary is in a slot that primary owns.
    let mut seen = 0;
    for p in cl.primaries() {
        let mut c = p.conn();
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(format!("member:{{*}}:{set}:hit:*"))
            .query(&mut c)
            .unwrap();
        for k in keys {
            let s: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&k)
                .query(&mut c)
                .unwrap();
            assert_eq!(cl.owner(s).port(), p.port());
            seen += 1;
        }
    }
    let kept = items.iter().filter(|i| i.len() % 2 == 1).count();
    assert_eq!(seen, kept);
    // The standalone names are not used in a cluster.
    for p in cl.primaries() {
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(format!("member:{set}:hit:*"))
            .query(&mut p.conn())
            .unwrap();
        assert!(keys.is_empty(), "{keys:?}");
    }
}
