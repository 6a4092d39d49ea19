//! A tokenized set rotated to a new key offline (docs/security.md, "Rotating a set's key
//! offline"): every node stopped, the stored tokens wrapped under the new key in SQL and the
//! key's fingerprint appended to the set's chain, then the nodes started with a ring holding
//! both keys. The set then answers under the chain: every item stored before is found, a new
//! one is stored in the chain's form, the filter saved under the old form is never believed,
//! and neither key may leave the ring.
use crate::support;

use redis::Connection;
use support::member::*;
use support::wait_until;

use super::tokenize::{KeyFile, KEY1, KEY2};

/// `MEMBER.KEYS LIST` as `(id, fingerprint, role, sets)` rows.
fn list(c: &mut Connection) -> Vec<(String, String, String, i64)> {
    redis::cmd("MEMBER.KEYS").arg("LIST").query(c).unwrap()
}

/// The SQL of docs/security.md, "Rotating a set's key offline", for `set` and the new key.
const ROTATE: &str = "
    WITH c AS (SELECT array_length(string_to_array(token_key_fp, '>'), 1) + 1 AS n
                 FROM member_catalog WHERE name = $1)
    UPDATE member_cards t
       SET entity_id = c.n::text || ':' ||
           encode(hmac(convert_to(t.entity_id, 'UTF8'), decode($2, 'hex'), 'sha256'), 'hex')
      FROM c";
const APPEND: &str = "UPDATE member_catalog SET token_key_fp = token_key_fp || '>' || $2,
                                          form_epoch = form_epoch + 1
                       WHERE name = $1";

/// `item`'s token under KEY1 and then KEY2, computed in SQL (pgcrypto) apart from the module.
fn chained(pg: &mut postgres::Client, item: &str) -> String {
    pg.query_one(
        "SELECT '2:' || encode(hmac(convert_to(
                    encode(hmac(convert_to($1, 'UTF8') || '\\x00'::bytea, decode($2, 'hex'),
                                'sha256'), 'hex'), 'UTF8'), decode($3, 'hex'), 'sha256'), 'hex')",
        &[&item, &KEY1, &KEY2],
    )
    .unwrap()
    .get(0)
}

#[test]
fn a_set_rotated_offline_answers_under_its_chain() {
    let file = KeyFile::new(KEY1);
    let mut env = super::tokenize::env_with_key(&file);
    let mut c = env.conn();
    create_synced(&mut c, "cards", &["TOKENIZE", "hmac-sha256"]);
    let items: Vec<String> = (0..40).map(|i| format!("4111-{i:04}")).collect();
    for i in &items {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "cards", i]), 1);
    }
    let mut pg = env.pg();
    pg.batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        .unwrap();
    // An outside writer's row, in the form of the day.
    pg.execute(
        "INSERT INTO member_cards (entity_id) VALUES (encode(hmac(convert_to('outside-1', 'UTF8')
                 || '\\x00'::bytea, decode($1, 'hex'), 'sha256'), 'hex'))",
        &[&KEY1],
    )
    .unwrap();
    assert!(wait_until(std::time::Duration::from_secs(20), || {
        explain(&mut c, "cards", "outside-1").0 == 1
    }));
    let fp1 = set_info(&mut c, "cards", "token_key_fp").unwrap();
    // A repeated CREATE leaves the form triggers as they are (remaking them would lock the
    // table against its readers).
    let triggers = |pg: &mut postgres::Client| -> Vec<u32> {
        pg.query(
            "SELECT oid FROM pg_trigger WHERE tgrelid = 'member_cards'::regclass
               AND tgname LIKE 'member_form%' ORDER BY tgname",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let made = triggers(&mut pg);
    assert_eq!(made.len(), 2);
    ok(
        &mut c,
        &["MEMBER.CREATE", "cards", "TOKENIZE", "hmac-sha256"],
    );
    assert_eq!(triggers(&mut pg), made);

    // The new key joins every node's ring first; the set keeps its key.
    file.rewrite(&format!("k2 {KEY2}\ndefault {KEY1}\n"));
    assert_eq!(int(&mut c, &["MEMBER.KEYS", "RELOAD"]), 2);
    let fp2 = list(&mut c)[0].1.clone();
    assert_eq!(
        set_info(&mut c, "cards", "token_key_id").unwrap(),
        "default"
    );

    // Offline: the node stopped with its filter saved in the old form, the rows wrapped.
    env.vk.shutdown(&["SAVE"]);
    let mut tx = pg.transaction().unwrap();
    tx.batch_execute("ALTER TABLE member_cards DISABLE TRIGGER USER")
        .unwrap();
    let moved = tx.execute(ROTATE, &[&"cards", &KEY2]).unwrap();
    tx.batch_execute("ALTER TABLE member_cards ENABLE TRIGGER USER")
        .unwrap();

    tx.execute(APPEND, &[&"cards", &fp2]).unwrap();
    tx.execute("SELECT member_catalog_form('cards')", &[])
        .unwrap();
    // As a table whose triggers are missing (made before them): the node's start remakes it.
    tx.batch_execute("DROP TRIGGER member_form_upd ON member_cards")
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(moved, items.len() as u64 + 1);
    env.vk.restart();
    let mut c = env.conn();
    assert!(wait_catalog_loaded(
        &mut c,
        std::time::Duration::from_secs(20)
    ));

    // At once, before any rebuild could end: the saved filter holds the old form only, and
    // must not answer "absent" for the items it holds in that form.
    for i in items.iter().take(10) {
        let (n, how) = explain(&mut c, "cards", i);
        assert_eq!(n, 1, "{i} right after the restart: {how}");
    }
    wait_trusted(&mut c, "cards", "the rotated set's filter never caught up");
    assert_eq!(set_info(&mut c, "cards", "filter_origin").unwrap(), "here");
    for i in items.iter().chain([&"outside-1".to_string()]) {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "cards", i]), 1, "{i}");
    }
    let mut batch = vec!["MEMBER.MEXISTS", "cards", "ITEMS"];
    batch.extend(items.iter().map(String::as_str));
    batch.push("never-added");
    let answers: Vec<i64> = {
        let mut k = redis::cmd(batch[0]);
        k.arg(&batch[1..]);
        k.query(&mut c).unwrap()
    };
    let mut want = vec![1; items.len()];
    want.push(0);
    assert_eq!(answers, want);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "cards", "never-added"]), 0);

    // What it shows: the chain of fingerprints and of ids, never a key.
    assert_eq!(
        set_info(&mut c, "cards", "token_key_fp").unwrap(),
        format!("{fp1}>{fp2}")
    );
    assert_eq!(
        set_info(&mut c, "cards", "token_key_id").unwrap(),
        "default>k2"
    );
    assert_eq!(set_info(&mut c, "cards", "token_key").unwrap(), "loaded");

    // A new item is stored in the chain's form, as outside writers compute it.
    assert_eq!(int(&mut c, &["MEMBER.ADD", "cards", "new-1"]), 1);
    let token = chained(&mut pg, "new-1");
    let rows: i64 = pg
        .query_one(
            "SELECT count(*) FROM member_cards WHERE entity_id = $1",
            &[&token],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "new-1 is not stored as {token}");
    outside_writers_ask_the_catalog(&mut pg, &token);
    assert_eq!(int(&mut c, &["MEMBER.DEL", "cards", "4111-0000"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "cards", "4111-0000"]), 0);

    late_writers_are_refused(&mut pg);
    assert!(wait_until(std::time::Duration::from_secs(20), || {
        int(&mut c, &["MEMBER.EXISTS", "cards", "late-1"]) == 1
    }));

    // Both keys of the chain are in use: neither may leave the ring.
    let used: Vec<i64> = list(&mut c).iter().map(|r| r.3).collect();
    assert_eq!(used, [1, 1]);
    for ring in [format!("k2 {KEY2}\n"), format!("default {KEY1}\n")] {
        file.rewrite(&ring);
        let e = err(&mut c, &["MEMBER.KEYS", "RELOAD"]);
        assert!(e.contains("the key set 'cards' uses"), "{e}");
    }
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "cards", "4111-0001"]), 1);
}

/// `member_catalog_token` gives outside writers the form to store now: the token the module
/// stored for `new-1` under the chain (KEY1, KEY2), each key checked against the chain's
/// fingerprint first; a wrong key or a wrong number of keys is an error that shows no key.
fn outside_writers_ask_the_catalog(pg: &mut postgres::Client, stored: &str) {
    let token: String = pg
        .query_one(
            "SELECT member_catalog_token('cards', 'new-1', '', $1, $2)",
            &[&KEY1, &KEY2],
        )
        .unwrap()
        .get(0);
    assert_eq!(token, stored);
    for (args, why) in [
        (vec![KEY1], "under 2 key(s), 1 given"),
        (
            vec![KEY2, KEY1],
            "key 1 of 2 given is not the key of set 'cards'",
        ),
        (
            vec![KEY1, KEY1],
            "key 2 of 2 given is not the key of set 'cards'",
        ),
    ] {
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> = args
            .iter()
            .map(|k| k as &(dyn postgres::types::ToSql + Sync))
            .collect();
        let marks: Vec<String> = (1..=args.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT member_catalog_token('cards', 'new-1', '', {})",
            marks.join(", ")
        );
        let e = pg.query_one(&sql, &params).unwrap_err();
        let text = e.as_db_error().map(|d| d.message().to_string()).unwrap();
        assert!(text.contains(why), "{text}");
        for k in [KEY1, KEY2] {
            assert!(!text.contains(&k[..16]), "a key was shown: {text}");
        }
    }
    let e = pg
        .query_one("SELECT member_catalog_token('nope', 'x', '', $1)", &[&KEY1])
        .unwrap_err();
    let text = e.as_db_error().map(|d| d.message().to_string());
    assert!(
        text.as_deref()
            .is_some_and(|t| t.contains("no tokenized set named 'nope'")),
        "{text:?}"
    );
}

/// A row no lookup would find is refused by the table: a late writer's token under the first
/// key alone (the form of the day before the rotation), a raw item, a scoped row, or an
/// UPDATE to any of them. The error names the set and the function, never the row.
fn late_writers_are_refused(pg: &mut postgres::Client) {
    let old_form = "encode(hmac(convert_to('late-1', 'UTF8') || '\\x00'::bytea, \
                    decode($1, 'hex'), 'sha256'), 'hex')";
    let refused =
        |pg: &mut postgres::Client, sql: &str, params: &[&(dyn postgres::types::ToSql + Sync)]| {
            let e = pg.execute(sql, params).unwrap_err();
            let db = e.as_db_error().expect("a database error");
            assert_eq!(
                db.code(),
                &postgres::error::SqlState::CHECK_VIOLATION,
                "{sql}"
            );
            assert!(db
                .message()
                .contains("set 'cards' stores tokens of a chain of 2 key(s)"));
            assert!(db
                .hint()
                .is_some_and(|h| h.contains("member_catalog_token('cards'")));
            assert!(!db.message().contains("late-1") && !db.message().contains("4111"));
        };
    refused(
        pg,
        &format!("INSERT INTO member_cards (entity_id) VALUES ({old_form})"),
        &[&KEY1],
    );
    refused(
        pg,
        "INSERT INTO member_cards (entity_id) VALUES ('late-1')",
        &[],
    );
    refused(
        pg,
        "INSERT INTO member_cards (entity_id, scope) \
         VALUES (member_catalog_token('cards', 'late-1', '', $1, $2), 'm-7')",
        &[&KEY1, &KEY2],
    );
    // Near misses of the form the check must still refuse: upper-case digits, a newline after
    // the digits, a digit short with the prefix one longer.
    for near in [
        "upper(member_catalog_token('cards', 'late-1', '', $1, $2))",
        "member_catalog_token('cards', 'late-1', '', $1, $2) || E'\\n'",
        "'12:' || substr(member_catalog_token('cards', 'late-1', '', $1, $2), 4)",
    ] {
        refused(
            pg,
            &format!("INSERT INTO member_cards (entity_id) VALUES ({near})"),
            &[&KEY1, &KEY2],
        );
    }
    refused(
        pg,
        "UPDATE member_cards SET entity_id = 'late-1' \
         WHERE entity_id = (SELECT min(entity_id) FROM member_cards)",
        &[],
    );
    // The form the catalog gives is taken, and found.
    pg.execute(
        "INSERT INTO member_cards (entity_id) \
         VALUES (member_catalog_token('cards', 'late-1', '', $1, $2))",
        &[&KEY1, &KEY2],
    )
    .unwrap();
}

/// A catalog from before the form counter gets it at a node's start, with the value that
/// keeps each row's identity as it was (it used to move one microsecond per key of the
/// chain): a set rotated offline before the upgrade is not distrusted a second time, and a
/// set never rotated keeps 0.
#[test]
fn a_catalog_from_before_the_form_counter_keeps_its_identities() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    let mut env = super::tokenize::env_with_key(&file);
    let mut c = env.conn();
    create_synced(&mut c, "cards", &["TOKENIZE", "hmac-sha256"]);
    create_synced(&mut c, "plain", &[]);
    let fp2 = list(&mut c)[1].1.clone();
    let mut pg = env.pg();
    env.vk.shutdown(&[]);
    pg.batch_execute("ALTER TABLE member_catalog DROP COLUMN form_epoch")
        .unwrap();
    pg.execute(
        "UPDATE member_catalog SET token_key_fp = token_key_fp || '>' || $1 WHERE name = 'cards'",
        &[&fp2],
    )
    .unwrap();
    env.vk.restart();
    let mut c = env.conn();
    assert!(wait_catalog_loaded(
        &mut c,
        std::time::Duration::from_secs(20)
    ));
    let epochs: Vec<(String, i64)> = pg
        .query(
            "SELECT name, form_epoch FROM member_catalog ORDER BY name",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(epochs, [("cards".into(), 1), ("plain".into(), 0)]);
    assert_eq!(
        set_info(&mut c, "cards", "token_key_id").unwrap(),
        "default>k2"
    );
}
