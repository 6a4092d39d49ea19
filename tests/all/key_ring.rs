//! The ring of tokenization keys (docs/security.md, "Key rings"): a file of one key is a ring
//! of one; a file of `<id> <hex key>` lines holds several, the first being the one new sets
//! are created under; `MEMBER.KEYS RELOAD` reads the same path again, as a secrets manager
//! rewrites it in place; a malformed ring, or one that drops a key a set uses, changes nothing
//! and says why; INFO and MEMBER.KEYS LIST show ids and fingerprints, never a key.
use crate::support;

use redis::{Connection, Value};
use support::member::*;

use super::tokenize::{env_with_key, KeyFile, KEY1, KEY2};

/// `MEMBER.KEYS LIST` as `(id, fingerprint, role, sets)` rows.
fn list(c: &mut Connection) -> Vec<(String, String, String, i64)> {
    redis::cmd("MEMBER.KEYS")
        .arg("LIST")
        .query(c)
        .unwrap_or_else(|e| panic!("MEMBER.KEYS LIST: {e}"))
}

fn fingerprint(c: &mut Connection, set: &str) -> String {
    set_info(c, set, "token_key_fp").unwrap()
}

/// Every error and every INFO field must leave the keys out.
fn shows_no_key(text: &str) {
    for k in [KEY1, KEY2] {
        assert!(!text.contains(&k[..16]), "a key was shown: {text}");
    }
}

#[test]
fn a_key_file_rewritten_in_place_is_reloaded_as_a_ring() {
    let file = KeyFile::new(KEY1);
    let env = env_with_key(&file);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "t", "TOKENIZE", "hmac-sha256"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "t", "alice"]), 1);
    let fp1 = fingerprint(&mut c, "t");
    // Today's file, one key: a ring of one, named `default`.
    assert_eq!(info_field(&mut c, "token_ring_keys").unwrap(), "1");
    assert_eq!(
        info_field(&mut c, "token_ring").unwrap(),
        format!("default:{fp1}")
    );
    assert_eq!(
        list(&mut c),
        [("default".into(), fp1.clone(), "current".into(), 1)]
    );
    assert_eq!(set_info(&mut c, "t", "token_key_id").unwrap(), "default");

    // The file rewritten in place as a ring, a new key first. CONFIG SET of the same path
    // answers OK and loads nothing (the server skips a value that does not change).
    file.rewrite(&format!("# rotated\nk2 {KEY2}\ndefault {KEY1}\n"));
    ok(
        &mut c,
        &["CONFIG", "SET", "member.token-key-file", file.path()],
    );
    assert_eq!(info_field(&mut c, "token_ring_keys").unwrap(), "1");
    assert_eq!(int(&mut c, &["MEMBER.KEYS", "RELOAD"]), 2);
    assert_eq!(info_field(&mut c, "token_ring_keys").unwrap(), "2");
    let ring = list(&mut c);
    assert_eq!(ring.len(), 2);
    let fp2 = ring[0].1.clone();
    assert_ne!(fp2, fp1);
    assert_eq!(ring[0], ("k2".into(), fp2.clone(), "current".into(), 0));
    assert_eq!(ring[1], ("default".into(), fp1.clone(), "kept".into(), 1));
    assert_eq!(
        info_field(&mut c, "token_ring").unwrap(),
        format!("k2:{fp2},default:{fp1}")
    );
    // The set keeps its key; a new set is created under the current one.
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "t", "alice"]), 1);
    ok(&mut c, &["MEMBER.CREATE", "u", "TOKENIZE", "hmac-sha256"]);
    assert_eq!(fingerprint(&mut c, "u"), fp2);
    assert_eq!(set_info(&mut c, "u", "token_key_id").unwrap(), "k2");
    assert_eq!(int(&mut c, &["MEMBER.ADD", "u", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "u", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "u", "bob"]), 0);
    // Under its own key: the two sets store different tokens for one item.
    let mut pg = env.pg();
    let token = |pg: &mut postgres::Client, set: &str| -> String {
        pg.query_one(&format!("SELECT entity_id FROM member_{set}"), &[])
            .unwrap()
            .get(0)
    };
    assert_ne!(token(&mut pg, "t"), token(&mut pg, "u"));
    let ring = list(&mut c);
    assert_eq!(ring[0].3, 1, "u is counted under k2: {ring:?}");

    // A malformed ring changes nothing, and says which line.
    file.rewrite(&format!("k2 {KEY2}\nk2 {KEY1}\n"));
    let e = err(&mut c, &["MEMBER.KEYS", "RELOAD"]);
    assert!(e.contains("line 2 repeats the key id of line 1"), "{e}");
    shows_no_key(&e);
    assert_eq!(list(&mut c), ring);
    // So does one that drops a key a set uses, naming the set.
    file.rewrite(&format!("k2 {KEY2}\n"));
    let e = err(&mut c, &["MEMBER.KEYS", "RELOAD"]);
    assert!(e.contains("the key set 't' uses"), "{e}");
    shows_no_key(&e);
    assert_eq!(list(&mut c), ring);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "t", "alice"]), 1);
    // Once no set uses it, the key may go.
    ok(&mut c, &["MEMBER.DROP", "t"]);
    assert_eq!(int(&mut c, &["MEMBER.KEYS", "RELOAD"]), 1);
    assert_eq!(
        list(&mut c),
        [("k2".into(), fp2.clone(), "current".into(), 1)]
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "u", "alice"]), 1);

    let info: String = redis::cmd("INFO").arg("everything").query(&mut c).unwrap();
    shows_no_key(&info);
    shows_no_key(&env.vk.log());
    assert!(
        env.vk.log().contains("key ring reloaded"),
        "the log does not say the ring was reloaded"
    );
}

#[test]
fn keys_rejects_bad_input_and_needs_a_file() {
    let env = Env::new();
    let mut c = env.conn();
    // No file configured: nothing to reload, an empty ring.
    let e = err(&mut c, &["MEMBER.KEYS", "RELOAD"]);
    assert_eq!(
        e,
        "ERR no key file to reload: member.token-key-file is not set"
    );
    assert_eq!(list(&mut c), []);
    assert_eq!(info_field(&mut c, "token_ring_keys").unwrap(), "0");
    assert_eq!(info_field(&mut c, "token_ring").unwrap(), "");
    for (args, want) in [
        (
            &["MEMBER.KEYS"][..],
            "ERR wrong number of arguments for 'member.keys' command",
        ),
        (
            &["MEMBER.KEYS", "RELOAD", "now"],
            "ERR wrong number of arguments for 'member.keys' command",
        ),
        (&["MEMBER.KEYS", "ROTATE"], "ERR unknown option 'ROTATE'"),
    ] {
        assert_eq!(err(&mut c, args), want, "{args:?}");
    }
    // A bad ring named by CONFIG SET is refused the same way.
    let bad = KeyFile::new(&format!("a {KEY1}\nb {KEY1}\n"));
    let e = err(
        &mut c,
        &["CONFIG", "SET", "member.token-key-file", bad.path()],
    );
    assert!(e.contains("line 2 holds the same key as line 1"), "{e}");
    shows_no_key(&e);
    // A good ring through CONFIG SET, and MEMBER.KEYS on a replica (each node holds its own).
    let ring = KeyFile::new(&format!("a {KEY1}\nb {KEY2}\n"));
    ok(
        &mut c,
        &["CONFIG", "SET", "member.token-key-file", ring.path()],
    );
    assert_eq!(info_field(&mut c, "token_ring_keys").unwrap(), "2");
    let replica = start_loaded(&env.db.url(), &[("member.token-key-file", ring.path())]);
    let mut r = replica.conn();
    let _: Value = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(env.vk.port())
        .query(&mut r)
        .unwrap();
    assert_eq!(int(&mut r, &["MEMBER.KEYS", "RELOAD"]), 2);
}

/// The SQL a DBA or an outside writer runs to move a stored token one link forward
/// (docs/security.md, "Rotating a tokenized set's key") gives, from the token the module
/// stored, the known answers the module's own chain is tested against
/// (`src/model/token_chain.rs`, computed by another HMAC implementation).
#[test]
fn a_chain_link_in_sql_is_the_modules() {
    const CHAIN_K2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
    const T1: &str = "52a55be7ff7ec35ff3475e1d00a03ab40332ca5fc890ee8478d78f357b35e595";
    const T2: &str = "2:1db6914acb82d7bf15cdf7ba78432d2bf07dec222203256874ea628e7f038a65";
    const T3: &str = "3:ea7ba49cbedd32fb44f0c7f03b896d95a18779212c4f46caaef85734b31110da";
    let file = KeyFile::new(KEY1);
    let env = env_with_key(&file);
    let mut c = env.conn();
    ok(
        &mut c,
        &["MEMBER.CREATE", "cards", "TOKENIZE", "hmac-sha256"],
    );
    let add = [
        "MEMBER.ADD",
        "cards",
        "4111111111111111",
        "SCOPE",
        "merchant-7",
    ];
    assert_eq!(int(&mut c, &add), 1);
    let mut pg = env.pg();
    pg.batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        .unwrap();
    let t1: String = pg
        .query_one("SELECT entity_id FROM member_cards", &[])
        .unwrap()
        .get(0);
    assert_eq!(t1, T1);
    // The catalog's function gives outside writers the same token for a set never rotated.
    let asked: String = pg
        .query_one(
            "SELECT member_catalog_token('cards', '4111111111111111', 'merchant-7', $1)",
            &[&KEY1],
        )
        .unwrap()
        .get(0);
    assert_eq!(asked, T1);
    let link = |pg: &mut postgres::Client, n: i32, previous: &str, key: &str| -> String {
        pg.query_one(
            "SELECT $1::int::text || ':' ||
                    encode(hmac(convert_to($2, 'UTF8'), decode($3, 'hex'), 'sha256'), 'hex')",
            &[&n, &previous, &key],
        )
        .unwrap()
        .get(0)
    };
    let t2 = link(&mut pg, 2, &t1, CHAIN_K2);
    assert_eq!(t2, T2);
    assert_eq!(link(&mut pg, 3, &t2, &"0f".repeat(48)), T3);
}

/// `MEMBER.KEYS NODES` as `(run id, port, role, ring as [(id, fingerprint)])`, leaving out
/// how long ago each node reported.
type NodeRow = (String, i64, String, Ring);
type Ring = Vec<(String, String)>;

fn nodes(c: &mut Connection) -> Vec<NodeRow> {
    let rows: Vec<(String, i64, String, i64, Ring)> = redis::cmd("MEMBER.KEYS")
        .arg("NODES")
        .query(c)
        .unwrap_or_else(|e| panic!("MEMBER.KEYS NODES: {e}"));
    rows.into_iter()
        .map(|(node, port, role, ago, ring)| {
            assert!(
                (0..30_000).contains(&ago),
                "a stale report was shown: {ago} ms"
            );
            (node, port, role, ring)
        })
        .collect()
}

/// The server's run id: the name its report to `member_nodes` goes by.
pub(super) fn run_id(c: &mut Connection) -> String {
    let info: String = redis::cmd("INFO").arg("server").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .unwrap()
        .trim()
        .to_string()
}

/// Waits (the reports are written every few seconds) until `MEMBER.KEYS NODES` on `c` shows
/// exactly `want`, in any order; panics with what it last showed.
fn nodes_become(c: &mut Connection, mut want: Vec<NodeRow>) {
    want.sort();
    let mut seen = Vec::new();
    let shown = support::wait_until(std::time::Duration::from_secs(30), || {
        seen = nodes(c);
        seen.sort();
        seen == want
    });
    assert!(shown, "MEMBER.KEYS NODES showed {seen:?}, not {want:?}");
}

/// Every node that shares the database reports its run id, port, role and ring there, and
/// any node shows them all: what an operator checks before a rotation needs a key on every
/// node. A ring reloaded, and a node made a replica, are shown as they now are.
#[test]
fn every_node_shows_which_keys_every_node_holds() {
    let file = KeyFile::new(KEY1);
    let env = env_with_key(&file);
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "t", "TOKENIZE", "hmac-sha256"]);
    let fp1 = fingerprint(&mut c, "t");
    let ring2 = KeyFile::new(&format!("a {KEY1}\nb {KEY2}\n"));
    let other = start_loaded(&env.db.url(), &[("member.token-key-file", ring2.path())]);
    let mut o = other.conn();
    let fp2 = list(&mut o)[1].1.clone();
    let (id_c, id_o) = (run_id(&mut c), run_id(&mut o));
    let (port_c, port_o) = (env.vk.port() as i64, other.port() as i64);
    let one = vec![("default".to_string(), fp1.clone())];
    let two = vec![
        ("a".to_string(), fp1.clone()),
        ("b".to_string(), fp2.clone()),
    ];
    nodes_become(
        &mut c,
        vec![
            (id_c.clone(), port_c, "primary".into(), one),
            (id_o.clone(), port_o, "primary".into(), two.clone()),
        ],
    );
    // The first node's file gains the new key, and the other becomes its replica: both are
    // shown from either node, the reload right after it, the role within a report or two.
    file.rewrite(&format!("default {KEY1}\nk2 {KEY2}\n"));
    assert_eq!(int(&mut c, &["MEMBER.KEYS", "RELOAD"]), 2);
    let _: Value = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(env.vk.port())
        .query(&mut o)
        .unwrap();
    let both = vec![("default".to_string(), fp1), ("k2".to_string(), fp2)];
    nodes_become(
        &mut o,
        vec![
            (id_c, port_c, "primary".into(), both),
            (id_o, port_o, "replica".into(), two),
        ],
    );
    shows_no_key(&format!("{:?}", nodes(&mut c)));
    assert_eq!(
        err(&mut c, &["MEMBER.KEYS", "NODES", "now"]),
        "ERR wrong number of arguments for 'member.keys' command"
    );
}
