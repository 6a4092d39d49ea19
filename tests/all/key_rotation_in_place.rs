//! The rotation that rewrites rows in place (docs/rotation-in-place.md): while a set's key
//! rotates, a node that computes the old form asks the database for the new form beside it,
//! so a row is found whichever form it holds. Here half the rows are rewritten by hand
//! (`UPDATE … SET entity_id = <new form>, twin = entity_id`), as the rewriting phase does,
//! while a session holds the rotation still before its first step: the order is the same on
//! any machine. A filter built meanwhile reads each rewritten row's old form from its `twin`
//! column; the rewrite merges an old-form row into the new form already there; outside
//! writers match both forms with `member_catalog_forms`.
use crate::support;

use std::time::Duration;

use support::member::*;
use support::rotation::{hold_rotation, mexists, rotate_key, shows_phase};
use support::wait_until;

use super::tokenize::{KeyFile, KEY1, KEY2};

const SET: &str = "in_place_cards";
/// Outside rows put in before the rotation, in the first key's form.
const ROWS: i64 = 60;

fn item(i: i64) -> String {
    format!("item-{i}")
}

/// The SQL of the token of the item `item` under the key `key` (an outside writer's form, a
/// chain of one key), both SQL expressions.
fn token_sql(item: &str, key: &str) -> String {
    format!(
        "encode(hmac(convert_to({item}, 'UTF8') || '\\x00'::bytea, decode({key}, 'hex'),
                     'sha256'), 'hex')"
    )
}

/// The SQL of the next link of the chain-1 token `token` under the key `key`
/// (docs/security.md, "Key rings"), both SQL expressions.
fn wrap_sql(token: &str, key: &str) -> String {
    format!(
        "'2:' || encode(hmac(convert_to({token}, 'UTF8'), decode({key}, 'hex'), 'sha256'), 'hex')"
    )
}

/// A tokenized set of `ROWS` outside rows in a trusted filter, whose rotation is held in its
/// copy by the session returned while the first half of its rows are rewritten in place by
/// hand, `item-1` lapsed.
fn rewritten_half(env: &Env, c: &mut redis::Connection) -> postgres::Client {
    create_synced(c, SET, &["TOKENIZE", "hmac-sha256"]);
    let mut pg = env.pg();
    pg.batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        .unwrap();
    pg.execute(
        &format!(
            "INSERT INTO member_{SET} (entity_id)
             SELECT {} FROM generate_series(1, $2::int8) i",
            token_sql("'item-' || i", "$1")
        ),
        &[&KEY1, &ROWS],
    )
    .unwrap();
    // Every row in the trusted filter (through the change log; one transaction, so the last
    // row's bit means every row's), and none of the rewritten ones asked: no exact-match key
    // answers for them.
    wait_trusted(c, SET, "the set's filter never caught up");
    assert!(
        wait_until(Duration::from_secs(30), || {
            explain(c, SET, &item(ROWS)).1 != "bloom-negative"
        }),
        "the filter never took the outside rows"
    );

    let mut holder = env.pg();
    hold_rotation(&mut holder, SET);
    rotate_key(c, SET, "k2");
    assert!(shows_phase(c, SET, "rewriting"), "never rewriting");

    // Half the rows rewritten in place, one of them lapsed; the other half left as they were.
    let rewritten = pg
        .execute(
            &format!(
                "UPDATE member_{SET} m SET entity_id = {wrap}, twin = m.entity_id,
                        status = CASE WHEN m.entity_id = {lapsed} THEN 0 ELSE m.status END
                  FROM (SELECT {old} AS o FROM generate_series(1, $3::int8) i) r
                 WHERE m.entity_id = r.o",
                wrap = wrap_sql("m.entity_id", "$4"),
                lapsed = token_sql("$2", "$1"),
                old = token_sql("'item-' || i", "$1"),
            ),
            &[&KEY1, &item(1), &(ROWS / 2), &KEY2],
        )
        .unwrap();
    assert_eq!(rewritten, ROWS as u64 / 2);
    holder
}

/// Lets the rotation `holder` holds go on, and waits until `c` says it ended.
fn let_go(holder: &mut postgres::Client, c: &mut redis::Connection) {
    holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || {
            set_info(c, SET, "token_rotation").as_deref() == Ok("none")
        }),
        "the rotation never ended: {:?}",
        set_info(c, SET, "token_rotation_last_error")
    );
}

#[test]
fn a_row_rewritten_in_place_is_found_by_the_old_form_while_the_set_rotates() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    let env = Env::with(&[("member.token-key-file", file.path())]);
    let mut c = env.conn();
    let mut holder = rewritten_half(&env, &mut c);
    let all: Vec<String> = (1..=ROWS).map(item).collect();

    // The node computes the old form: each rewritten row is found by it, as the other half.
    let want: Vec<i64> = (1..=ROWS).map(|i| (i != 1) as i64).collect();
    assert_eq!(mexists(&mut c, SET, &all), want, "MEXISTS");
    for (i, w) in all.iter().zip(&want) {
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", SET, i]), *w, "EXISTS {i}");
    }
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", SET, "never"]), 0);

    // A filter built now (a rebuild, as after a restart or a growth) holds the old form of each
    // rewritten row too: read from its `twin`, where no row of that form is left.
    let _: i64 = redis::cmd("MEMBER.REBUILD")
        .arg(SET)
        .arg("SYNC")
        .query(&mut c)
        .unwrap();
    wait_trusted(&mut c, SET, "the rebuilt filter never became trusted");
    // (A filter without them would answer 0 for each: a trusted filter's negative is final.)
    assert_eq!(mexists(&mut c, SET, &all), want, "after a rebuild");

    // A DEL of a rewritten item deletes it, whichever form its row holds.
    assert_eq!(int(&mut c, &["MEMBER.DEL", SET, &item(2)]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", SET, &item(2)]), 0);

    // Let go: the rotation ends, the rewritten rows as they are; every answer holds.
    let_go(&mut holder, &mut c);
    let want: Vec<i64> = (1..=ROWS).map(|i| (i > 2) as i64).collect();
    assert_eq!(mexists(&mut c, SET, &all), want, "after the rotation");
}

/// The new form of `item` (its first key's token wrapped under the second), in SQL.
fn new_form(pg: &mut postgres::Client, item: &str) -> String {
    let sql = format!("SELECT {}", wrap_sql(&token_sql("$2", "$1"), "$3"));
    pg.query_one(&sql, &[&KEY1, &item, &KEY2]).unwrap().get(0)
}

/// While the set rotates, an ADD stores its item as one row of the new form that names the old
/// one, and answers "added" as before: 1 for an item new to the set or lapsed, 0 for a member,
/// whichever form its row holds.
#[test]
fn an_add_while_the_set_rotates_stores_one_row_of_the_new_form() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    let env = Env::with(&[("member.token-key-file", file.path())]);
    let mut c = env.conn();
    let mut holder = rewritten_half(&env, &mut c);
    let mut pg = env.pg();
    // New; lapsed (rewritten); a member rewritten; a member in the old form.
    for (i, want) in [("fresh", 1), ("item-1", 1), ("item-5", 0), ("item-45", 0)] {
        assert_eq!(int(&mut c, &["MEMBER.ADD", SET, i]), want, "ADD {i}");
    }
    let mut k = redis::cmd("MEMBER.MADD");
    k.arg(SET).arg("ITEMS").arg("fresh-m").arg("item-6");
    assert_eq!(k.query::<Vec<i64>>(&mut c).unwrap(), [1, 0], "MADD");
    // The rows of `i` by either form (`twin`: the column, or NULL once it is gone).
    let forms = |pg: &mut postgres::Client, i: &str, twin: &str| -> Vec<(String, Option<String>)> {
        let w = new_form(pg, i);
        pg.query(
            &format!(
                "SELECT entity_id, {twin}::text FROM member_{SET}
                  WHERE entity_id IN ({old}, $2) ORDER BY 1",
                old = token_sql("$1", "$3")
            ),
            &[&i, &w, &KEY1],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    for i in ["fresh", "fresh-m"] {
        let rows = forms(&mut pg, i, "twin");
        assert_eq!(rows.len(), 1, "{i}: one row, {rows:?}");
        assert!(
            rows[0].0.starts_with("2:") && rows[0].1.is_some(),
            "{i}: {rows:?}"
        );
    }
    let all: Vec<String> = ["fresh", "fresh-m", "item-1", "item-5", "item-45", "item-6"]
        .map(String::from)
        .to_vec();
    assert_eq!(mexists(&mut c, SET, &all), [1; 6]);

    // Let go: the rotation ends; each item is a member, in one row of the new form.
    let_go(&mut holder, &mut c);
    assert_eq!(mexists(&mut c, SET, &all), [1; 6], "after the rotation");
    for i in &all {
        let rows = forms(&mut pg, i, "NULL");
        assert!(
            rows.len() == 1 && rows[0].0.starts_with("2:"),
            "{i}: {rows:?}"
        );
    }
}

/// A node of a build before the rewrite in place does not follow it (one before step 1 asks
/// the database for an item's old form alone; one of steps 1 to 3, rotation level 1, does not
/// know the phase `rewriting`): while one reports (here, a report as such a build writes it),
/// a rotation does not start, and the reply names it; once it is gone, the rotation starts.
#[test]
fn a_rotation_does_not_start_while_a_node_of_an_older_build_reports() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    let env = Env::with(&[("member.token-key-file", file.path())]);
    let mut c = env.conn();
    create_synced(&mut c, SET, &["TOKENIZE", "hmac-sha256"]);
    let mut pg = env.pg();
    let older = "test-older-build";
    assert!(wait_until(Duration::from_secs(30), || {
        pg.execute(
            "INSERT INTO member_nodes (node, port, role, ring, seen_at, rotation_level)
             SELECT $1, port, role, ring, now() + interval '1 hour', 1
               FROM member_nodes WHERE node <> $1 ORDER BY seen_at DESC LIMIT 1
             ON CONFLICT (node) DO NOTHING",
            &[&older],
        )
        .unwrap()
            == 1
    }));
    let e = err(&mut c, &["MEMBER.ALTER", SET, "ROTATE-KEY", "k2"]);
    assert!(
        e.contains(older) && e.contains("older than this node's"),
        "{e}"
    );
    assert_eq!(set_info(&mut c, SET, "token_rotation").unwrap(), "none");
    pg.execute("DELETE FROM member_nodes WHERE node = $1", &[&older])
        .unwrap();
    rotate_key(&mut c, SET, "k2");
    assert!(
        wait_until(Duration::from_secs(60), || set_info(
            &mut c,
            SET,
            "token_rotation"
        )
        .as_deref()
            == Ok("none")
            && set_info(&mut c, SET, "token_key_id").as_deref()
                == Ok("default>k2")),
        "the rotation never ended"
    );
}

/// An old-form row whose item's new form is already there (an outside writer's INSERT of the
/// form `member_catalog_token` gave before the rotation, of an item already rewritten) is
/// merged into the new row by the rewrite: a member if either row was, one row after.
#[test]
fn the_rewrite_merges_an_old_form_row_into_the_new_one_already_there() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    let env = Env::with(&[("member.token-key-file", file.path())]);
    let mut c = env.conn();
    let mut holder = rewritten_half(&env, &mut c);
    let mut pg = env.pg();
    // Beside rewritten rows: item-1's lapsed new row gets an active old one, item-3's active
    // new row a lapsed old one, item-4's an active one expiring in an hour.
    for (i, status, expires) in [
        ("item-1", 1i16, false),
        ("item-3", 0, false),
        ("item-4", 1, true),
    ] {
        pg.execute(
            &format!(
                "INSERT INTO member_{SET} (entity_id, status, expires_at)
                 VALUES ({old}, $3, CASE WHEN $4 THEN now() + interval '1 hour' END)",
                old = token_sql("$1", "$2")
            ),
            &[&i, &KEY1, &status, &expires],
        )
        .unwrap();
    }
    let items: Vec<String> = ["item-1", "item-3", "item-4"].map(String::from).to_vec();
    assert_eq!(mexists(&mut c, SET, &items), [1, 1, 1], "while held");

    let_go(&mut holder, &mut c);
    assert_eq!(
        mexists(&mut c, SET, &items),
        [1, 1, 1],
        "after the rotation"
    );
    // One row per item, each of the new form: the old rows were merged and deleted.
    let rows: Vec<(i64, i64)> = pg
        .query(
            "SELECT count(*), count(*) FILTER (WHERE entity_id LIKE '2:%') FROM member_in_place_cards",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        rows,
        [(ROWS, ROWS)],
        "one row per item, each of the new form"
    );
    // item-4's row lives on without the old row's expiry: none outlives any.
    let w = new_form(&mut pg, "item-4");
    let expiry: Option<std::time::SystemTime> = pg
        .query_one(
            &format!("SELECT expires_at FROM member_{SET} WHERE entity_id = $1"),
            &[&w],
        )
        .unwrap()
        .get(0);
    assert_eq!(expiry, None, "item-4 never expires, as its new row said");
}

/// While the set rotates, `member_catalog_forms` gives an outside writer both forms a row of
/// an item may have (an outside `DELETE` by the old form alone misses a row rewritten); after
/// the rotation, the new form alone.
#[test]
fn an_outside_delete_by_the_forms_deletes_a_row_whichever_form_it_holds() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    let env = Env::with(&[("member.token-key-file", file.path())]);
    let mut c = env.conn();
    let mut holder = rewritten_half(&env, &mut c);
    let mut pg = env.pg();
    let forms = |pg: &mut postgres::Client, i: &str| -> Result<Vec<String>, postgres::Error> {
        pg.query_one(
            &format!("SELECT member_catalog_forms('{SET}', $1, '', $2, $3)"),
            &[&i, &KEY1, &KEY2],
        )
        .map(|r| r.get(0))
    };
    let old = |pg: &mut postgres::Client, i: &str| -> String {
        pg.query_one(&format!("SELECT {}", token_sql("$1", "$2")), &[&i, &KEY1])
            .unwrap()
            .get(0)
    };
    for i in ["item-5", "item-40"] {
        assert_eq!(
            forms(&mut pg, i).unwrap(),
            [old(&mut pg, i), new_form(&mut pg, i)],
            "{i}"
        );
    }
    // The key the set rotates to must be given: without it the rewritten form is unknown.
    let e = pg
        .query_one(
            &format!("SELECT member_catalog_forms('{SET}', 'item-5', '', $1)"),
            &[&KEY1],
        )
        .unwrap_err();
    let e = e.as_db_error().unwrap();
    assert!(e.message().contains("2 key(s), 1 given"), "{e:?}");
    // By the old form alone, a rewritten row is not found; by its forms, either is.
    let o = old(&mut pg, "item-6");
    let by_old = pg
        .execute(
            &format!("DELETE FROM member_{SET} WHERE entity_id = $1"),
            &[&o],
        )
        .unwrap();
    assert_eq!(by_old, 0, "item-6's row holds its new form");
    for i in ["item-5", "item-40"] {
        let gone = pg
            .execute(
                &format!(
                    "DELETE FROM member_{SET}
                      WHERE entity_id = ANY(member_catalog_forms('{SET}', $1, '', $2, $3))"
                ),
                &[&i, &KEY1, &KEY2],
            )
            .unwrap();
        assert_eq!(gone, 1, "{i}");
    }
    let_go(&mut holder, &mut c);
    let items: Vec<String> = ["item-5", "item-40", "item-6"].map(String::from).to_vec();
    assert_eq!(
        mexists(&mut c, SET, &items),
        [0, 0, 1],
        "after the rotation"
    );
    assert_eq!(
        forms(&mut pg, "item-5").unwrap(),
        [new_form(&mut pg, "item-5")]
    );
}
