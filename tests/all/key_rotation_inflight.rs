//! A write in flight while a rotating set's forms have two owners (docs/security.md, "A gap the
//! cluster history checker found"): before its statement runs, a write marks its twin on the
//! primary that holds the twin's slot, so that primary's lookups of the twin go to the
//! database until the write's effects land, instead of answering 0 from its filter (an ADD)
//! or 1 from its exact-match key (a DEL) while the other form's owner answers from the
//! database. Held by a lock on the set's table (the statements wait; lookups do not), so the
//! order is the same on any machine; and a twin's owner that does not answer refuses the
//! write before anything is stored.
use crate::support;

use std::time::Duration;

use redis::Connection;
use support::cluster::{Cluster, Node};
use support::member::*;
use support::wait_until;

use super::key_rotation_cluster::{hold_the_drain, load_ring_everywhere, release_the_drain};
use super::key_rotation_held::wait_waiting;
use super::tokenize::{KeyFile, KEY1, KEY2};
use crate::support::rotation::rotate_key;

const SET: &str = "rot_fl";
const TABLE: &str = "member_rot_fl";

/// An item's old form and twin (its new form), under the test's two keys (the twin as
/// docs/security.md's SQL computes it, whatever the set's chain is now).
fn forms(pg: &mut postgres::Client, item: &str) -> (String, String) {
    let row = pg
        .query_one(
            "WITH o AS (SELECT member_catalog_token($1, $2, '', $3) AS t)
             SELECT t, '2:' || encode(hmac(convert_to(t, 'UTF8'), decode($4, 'hex'), 'sha256'),
                                      'hex')
               FROM o",
            &[&SET, &item, &KEY1, &KEY2],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// The first item named `prefix-N` whose two forms belong to two primaries, and whose own
/// bytes route to another node than its twin's: (item, its two forms, the owner of its twin's
/// slot). Before the rotation (the token function wants the keys of the chain as it is).
fn split_item<'c>(
    cl: &'c Cluster,
    pg: &mut postgres::Client,
    prefix: &str,
) -> (String, (String, String), &'c Node) {
    (0..1000)
        .map(|i| format!("{prefix}-{i}"))
        .find_map(|item| {
            let (old, twin) = forms(pg, &item);
            let owner = |text: &str| cl.owner(cl.keyslot(text));
            let (a, b, raw) = (owner(&old), owner(&twin), owner(&item));
            let split = a.port() != b.port() && raw.port() != b.port();
            split.then_some((item, (old, twin), b))
        })
        .expect("an item whose forms have two owners")
}

/// `write` (`MEMBER.ADD` or `MEMBER.DEL`) of `item`, held in its statement by a session that
/// locks the set's table: what `MEMBER.EXPLAIN` of the item says meanwhile. The write is made
/// once the lock goes (its client may have stopped waiting first).
fn explained_while_held(
    cl: &Cluster,
    pg: &mut postgres::Client,
    write: &str,
    item: &str,
) -> (i64, String) {
    let mut lock = cl.db().client();
    lock.batch_execute(&format!("BEGIN; LOCK TABLE {TABLE} IN SHARE MODE"))
        .unwrap();
    std::thread::scope(|s| {
        let made = s.spawn(|| cmd(&mut conn_for(cl, item), &[write, SET, item]));
        wait_waiting(pg, &["relation"], &format!("%{TABLE}%"), 1, &|| {
            format!("{write} {item} never waited for the table")
        });
        let during = explain(&mut conn_for(cl, item), SET, item);
        lock.batch_execute("ROLLBACK").unwrap();
        let _ = made.join().unwrap();
        during
    })
}

/// The connection a cluster client would use for `item`.
fn conn_for(cl: &Cluster, item: &str) -> Connection {
    cl.owner(cl.keyslot(item)).conn()
}

/// Rows of either form.
fn rows(pg: &mut postgres::Client, (old, twin): &(String, String)) -> i64 {
    pg.query_one(
        &format!("SELECT count(*) FROM {TABLE} WHERE entity_id IN ($1, $2)"),
        &[old, twin],
    )
    .unwrap()
    .get(0)
}

#[test]
fn a_write_in_flight_is_marked_on_the_owner_of_its_twin_before_its_statement() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let ring = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    load_ring_everywhere(cl, &ring);
    if cmd(&mut cl.set_owner(SET).conn(), &["MEMBER.INFO", SET]).is_ok() {
        cl.drop_everywhere(SET);
    }
    let mut pg = cl.db().client();
    pg.batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        .unwrap();
    cl.create_everywhere_with(SET, &["TOKENIZE", "hmac-sha256"]);
    cl.wait_ready(SET);
    let (added, ..) = split_item(cl, &mut pg, "added");
    let (deleted, ..) = split_item(cl, &mut pg, "deleted");
    let (refused, refused_forms, asleep) = split_item(cl, &mut pg, "refused");
    assert_eq!(
        int(&mut conn_for(cl, &deleted), &["MEMBER.ADD", SET, &deleted]),
        1
    );

    // Every node computes the new form (it asks the owner of the twin's slot), while writes
    // are still planned in the old form by the owner of its slot: the drain is held.
    hold_the_drain(cl, SET);
    rotate_key(&mut cl.set_owner(SET).conn(), SET, "k2");
    let switched = wait_until(Duration::from_secs(60), || {
        cl.nodes
            .iter()
            .filter(|n| !n.down)
            .all(|n| set_info(&mut n.conn(), SET, "token_rotation_form").as_deref() == Ok("new"))
    });
    assert!(switched, "the nodes never switched");
    // The member's twin is cached on its owner.
    assert!(
        wait_until(Duration::from_secs(30), || {
            explain(&mut conn_for(cl, &deleted), SET, &deleted) == (1, "cache-hit".into())
        }),
        "{deleted} never answered from its exact-match key"
    );

    // While each write waits in its statement, the twin's owner asks the database: 0 for
    // the ADD not yet made (not from the filter, whose bit comes with the effects), 1 for the
    // DEL not yet made (not from the exact-match key, which the other form's owner, asking
    // the database, may no longer agree with).
    assert_eq!(
        explained_while_held(cl, &mut pg, "MEMBER.ADD", &added),
        (0, "recent".to_string()),
        "the ADD's twin while its statement waits"
    );
    assert_eq!(
        explained_while_held(cl, &mut pg, "MEMBER.DEL", &deleted),
        (1, "recent".to_string()),
        "the DEL's twin while its statement waits"
    );
    // The writes were made once the table was let go (their clients may have stopped
    // waiting first).
    assert!(wait_until(Duration::from_secs(30), || {
        int(&mut conn_for(cl, &added), &["MEMBER.EXISTS", SET, &added]) == 1
            && int(
                &mut conn_for(cl, &deleted),
                &["MEMBER.EXISTS", SET, &deleted],
            ) == 0
    }));

    // The owner of the twin's slot does not answer (its main thread asleep): the write is
    // refused before its statement, and nothing is stored.
    let (mut sleeper, mut probe) = (asleep.conn(), asleep.conn());
    probe
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let refusal = std::thread::scope(|s| {
        let sleep = s.spawn(move || cmd(&mut sleeper, &["DEBUG", "SLEEP", "3"]));
        let slept = wait_until(Duration::from_secs(5), || {
            cmd(&mut probe, &["PING"]).is_err() || sleep.is_finished()
        });
        if !slept || sleep.is_finished() {
            panic!("the twin's owner never slept: {:?}", sleep.join());
        }
        let got = cmd(&mut conn_for(cl, &refused), &["MEMBER.ADD", SET, &refused]);
        sleep.join().unwrap().unwrap();
        got
    });
    let e = refusal.expect_err("an ADD whose twin's owner does not answer");
    assert_eq!(e.code(), Some("TRYAGAIN"), "{e}");
    assert!(e.to_string().contains("nothing was stored"), "{e}");
    assert_eq!(rows(&mut pg, &refused_forms), 0, "{refused} was stored");
    assert_eq!(
        int(
            &mut conn_for(cl, &refused),
            &["MEMBER.EXISTS", SET, &refused]
        ),
        0
    );
    // A retry, once the owner answers again, is made.
    assert_eq!(
        int(&mut conn_for(cl, &refused), &["MEMBER.ADD", SET, &refused]),
        1
    );
    // One row, of the new form, naming the old (docs/rotation-in-place.md).
    assert_eq!(rows(&mut pg, &refused_forms), 1, "{refused} in one row");

    release_the_drain(cl);
    assert!(wait_until(Duration::from_secs(120), || {
        cl.nodes
            .iter()
            .filter(|n| !n.down)
            .all(|n| set_info(&mut n.conn(), SET, "token_rotation").as_deref() == Ok("none"))
    }));
    cl.drop_everywhere(SET);
}
