//! An online key rotation across PostgreSQL restarts: a fast shutdown while the rotation is
//! held in its rewriting phase (a session holds its lock), and a crash (immediate shutdown)
//! while it is held in its switching phase (a node report that lacks the new form). Lookups
//! never answer wrong meanwhile (an error while the database is down, never a false 0 or 1),
//! writes after each restart are found by both forms, and the rotation resumes from the
//! catalog to its end.
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use support::member::*;
use support::{wait_until, OwnPg};

use super::tokenize::{KeyFile, KEY1, KEY2};
use crate::support::rotation::{
    add_each, hold_rotation, report_lagging_node, rotate_key, shows_phase, LAGGING,
};

fn catalog_phase(pg: &OwnPg) -> Option<String> {
    let mut c = pg.try_client().ok()?;
    c.query_one(
        "SELECT rotate_phase FROM member_catalog WHERE name = 'cards'",
        &[],
    )
    .ok()?
    .get(0)
}

/// Every item of `present` answers 1 and every item of `absent` 0, or an error (the database
/// is down): the wrong answers seen, by EXISTS and MEXISTS.
fn check_round(c: &mut redis::Connection, present: &[String], absent: &[String]) -> Vec<String> {
    let mut wrong = Vec::new();
    let items: Vec<&String> = present.iter().chain(absent).collect();
    let want: Vec<i64> = present
        .iter()
        .map(|_| 1)
        .chain(absent.iter().map(|_| 0))
        .collect();
    let mut k = redis::cmd("MEMBER.MEXISTS");
    k.arg("cards").arg("ITEMS").arg(&items);
    if let Ok(got) = k.query::<Vec<i64>>(c) {
        for ((i, g), w) in items.iter().zip(&got).zip(&want) {
            if g != w {
                wrong.push(format!("MEXISTS {i}: {g}, not {w}"));
            }
        }
    }
    for (i, w) in items.iter().zip(&want).step_by(7) {
        if let Ok(Value::Int(g)) = cmd(c, &["MEMBER.EXISTS", "cards", i]) {
            if g != *w {
                wrong.push(format!("EXISTS {i}: {g}, not {w}"));
            }
        }
    }
    wrong
}

/// Rows the restart test writes by SQL besides its ADDs: more than one of the rewrite's steps
/// (`rotation_rewrite::PAGES` pages, about 16 000 rows).
const BULK: usize = 25_000;

#[test]
fn a_rotation_resumes_after_postgres_restarts_in_its_copying_and_switching_phases() {
    let ring = format!("default {KEY1}\nk2 {KEY2}\n");
    let file = KeyFile::new(&ring);
    let mut pg = OwnPg::start_new();
    let vk = start_loaded(
        &pg.url(),
        &[
            ("member.token-key-file", file.path()),
            ("member.db-timeout-ms", "5000"),
        ],
    );
    let mut c = vk.conn();
    create_synced(&mut c, "cards", &["TOKENIZE", "hmac-sha256"]);
    let before: Vec<String> = (0..200).map(|i| format!("before-{i}")).collect();
    add_each(&mut c, "cards", &before);
    let mut admin = pg.client();
    // Rows enough for the copy and the drain to take several steps each, written by SQL.
    admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        .unwrap();
    admin
        .execute(
            "INSERT INTO member_cards (entity_id)
               SELECT member_catalog_token('cards', 'bulk-' || g, '', $1)
                 FROM generate_series(1, $2) g",
            &[&KEY1, &(BULK as i32)],
        )
        .unwrap();
    report_lagging_node(&mut admin, "cards");
    let mut holder = pg.client();
    hold_rotation(&mut holder, "cards");
    rotate_key(&mut c, "cards", "k2");
    assert!(shows_phase(&mut c, "cards", "rewriting"));
    // No step has run: nothing counted yet.
    assert!(set_info(&mut c, "cards", "token_rotation_rows_left").is_err());

    // A reader on its own connection throughout.
    let present = Arc::new(Mutex::new(before.clone()));
    let absent: Vec<String> = (0..30).map(|i| format!("never-{i}")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (present, stop, port) = (present.clone(), stop.clone(), vk.port());
        std::thread::spawn(move || {
            let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .unwrap()
                .get_connection()
                .unwrap();
            let (mut wrong, mut rounds) = (Vec::new(), 0);
            while !stop.load(Ordering::Acquire) {
                let p = present.lock().unwrap().clone();
                wrong.extend(check_round(&mut c, &p, &absent));
                rounds += 1;
                std::thread::sleep(Duration::from_millis(30));
            }
            (rounds, wrong)
        })
    };

    // A fast shutdown while the copy is held (the holder's session ends with it).
    drop(holder);
    drop(admin);
    pg.stop();
    let e = err(&mut c, &["MEMBER.ADD", "cards", "while-down"]);
    assert!(
        e.starts_with("UNAVAILABLE"),
        "an ADD while the database is down: {e}"
    );
    // The steps find the database gone: the rotation pauses (and says why) before it is back.
    assert!(
        wait_until(Duration::from_secs(30), || set_info(
            &mut c,
            "cards",
            "token_rotation_last_error"
        )
        .is_ok_and(|e| !e.is_empty())),
        "no step failed while the database was down"
    );
    // Down for more than two of the failed steps' one-second retries, so the log's check
    // below sees one pause for several failures. (Longer only makes more failures; the check
    // holds however many.)
    std::thread::sleep(Duration::from_millis(2500));
    pg.start();
    // Slow statements and lock waits logged, for the failure's message below.
    for sql in [
        "ALTER SYSTEM SET log_min_duration_statement = 2000",
        "ALTER SYSTEM SET log_lock_waits = on",
        "SELECT pg_reload_conf()",
    ] {
        pg.client().batch_execute(sql).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(60), || catalog_phase(&pg).as_deref()
            == Some("switching")),
        "the rotation never reached its end after the restart: {:?}\n{}\n{}",
        set_info(&mut c, "cards", "token_rotation_last_error"),
        support::lifecycle::log_tail(&vk),
        pg.log_tail(60)
    );
    // Written while the rotation is held before its drain: one row each, of the new form
    // naming the old.
    let mid: Vec<String> = (0..20).map(|i| format!("mid-{i}")).collect();
    for i in &mid {
        let added = wait_until(Duration::from_secs(20), || {
            cmd(&mut c, &["MEMBER.ADD", "cards", i]).is_ok()
        });
        assert!(added, "ADD {i} after the restart");
    }
    present.lock().unwrap().extend(mid.iter().cloned());
    // Held before the drain: nothing is left to delete (every row was rewritten in place,
    // and the ADDs stored the new form alone).
    assert!(
        wait_until(Duration::from_secs(30), || set_info(
            &mut c,
            "cards",
            "token_rotation_rows_left"
        )
        .as_deref()
            == Ok("0")),
        "rows left: {:?}",
        set_info(&mut c, "cards", "token_rotation_rows_left")
    );

    // A crash while the switch is held, then the lagging node goes: the drain runs. (The
    // test clusters commit asynchronously: a checkpoint first, or the crash would lose the
    // last acknowledged ADDs, as such a cluster may.)
    pg.client().batch_execute("CHECKPOINT").unwrap();
    pg.kill();
    pg.start();
    let mut admin = pg.client();
    admin
        .execute("DELETE FROM member_nodes WHERE node = $1", &[&LAGGING])
        .unwrap();
    let ended = wait_until(Duration::from_secs(60), || {
        set_info(&mut c, "cards", "token_rotation").as_deref() == Ok("none")
            && set_info(&mut c, "cards", "token_key_id").as_deref() == Ok("default>k2")
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    let (rounds, wrong) = reader.join().unwrap();
    assert!(
        ended,
        "the rotation never ended: {:?}\n{}",
        set_info(&mut c, "cards", "token_rotation_last_error"),
        support::lifecycle::log_tail(&vk)
    );
    assert!(rounds > 3, "only {rounds} rounds");
    assert!(
        wrong.is_empty(),
        "{} wrong answers: {:?}\n{}",
        wrong.len(),
        &wrong[..wrong.len().min(20)],
        support::lifecycle::log_tail(&vk)
    );
    let all: Vec<String> = before.iter().chain(&mid).cloned().collect();
    assert!(check_round(&mut c, &all, &["never-0".to_string()]).is_empty());
    let mut k = redis::cmd("MEMBER.MEXISTS");
    k.arg("cards").arg("ITEMS").arg(&all);
    assert_eq!(k.query::<Vec<i64>>(&mut c).unwrap(), vec![1; all.len()]);
    let rows: (i64, i64) = {
        let r = admin
            .query_one(
                "SELECT count(*) FILTER (WHERE entity_id ~ '^2:'), count(*) FROM member_cards",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    // Each phase's change is made, and logged, once: a step planned from a view of the
    // catalog the rotation had left does nothing.
    let log = vk.log();
    for line in [
        "every row is in the new form",
        "draining the old forms a late writer adds",
        "no row of the old form is left",
    ] {
        assert_eq!(log.matches(line).count(), 1, "{line}:\n{log}");
    }
    // Each outage is logged when it starts and when it ends, whatever the steps that failed
    // in it (one a second while the database was down).
    let (paused, resumed) = (
        log.matches("rotation of set 'cards' paused").count(),
        log.matches("rotation of set 'cards' resumed after").count(),
    );
    assert!(
        (1..=2).contains(&paused) && resumed == paused,
        "{paused} pauses, {resumed} resumptions:\n{log}"
    );
    assert!(
        !log.contains("taken over"),
        "the node that started it drove it:\n{log}"
    );
    // The ADD while the database was down never reached it.
    let stored = 220 + BULK as i64;
    assert_eq!(
        rows,
        (stored, stored),
        "every row in the new form, each once"
    );
    let bulk: Vec<String> = (1..=BULK)
        .step_by(25)
        .map(|g| format!("bulk-{g}"))
        .collect();
    let mut k = redis::cmd("MEMBER.MEXISTS");
    k.arg("cards").arg("ITEMS").arg(&bulk);
    assert_eq!(
        k.query::<Vec<i64>>(&mut c).unwrap(),
        vec![1; bulk.len()],
        "rows written by SQL before the rotation"
    );
}

/// A Valkey failover during a rotation: the primary that started it is killed while the copy
/// is held, its replica is promoted, and the new primary carries the rotation from the catalog
/// to its end; every write acknowledged before (both forms, replicated as such) and after
/// answers 1 on it, throughout.
#[test]
fn a_rotation_goes_on_on_the_replica_promoted_after_its_primary_dies() {
    let ring = format!("default {KEY1}\nk2 {KEY2}\n");
    let file = KeyFile::new(&ring);
    let settings = [
        ("member.token-key-file", file.path()),
        ("member.db-timeout-ms", "10000"),
    ];
    let mut env = Env::with(&settings);
    let mut c = env.conn();
    create_synced(&mut c, "cards", &["TOKENIZE", "hmac-sha256"]);
    let before: Vec<String> = (0..100).map(|i| format!("before-{i}")).collect();
    add_each(&mut c, "cards", &before);
    let replica = start_loaded(&env.db.url(), &settings);
    let mut r = replica.conn();
    let _: Value = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(env.vk.port())
        .query(&mut r)
        .unwrap();
    support::lifecycle::wait_linked(&replica, &mut r, Duration::from_secs(30));

    let mut holder = env.pg();
    hold_rotation(&mut holder, "cards");
    rotate_key(&mut c, "cards", "k2");
    for n in [&mut c, &mut r] {
        assert!(shows_phase(n, "cards", "rewriting"));
    }
    // Written on the old primary while the copy is held: both forms, to the replica too.
    let during: Vec<String> = (0..20).map(|i| format!("during-{i}")).collect();
    add_each(&mut c, "cards", &during);
    let synced: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut c).unwrap();
    assert_eq!(synced, 1, "the replica never acknowledged the writes");

    env.vk.kill9();
    ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
    let mut all: Vec<String> = before.iter().chain(&during).cloned().collect();
    let mut k = redis::cmd("MEMBER.MEXISTS");
    k.arg("cards").arg("ITEMS").arg(&all);
    assert_eq!(k.query::<Vec<i64>>(&mut r).unwrap(), vec![1; all.len()]);
    let after: Vec<String> = (0..20).map(|i| format!("after-{i}")).collect();
    add_each(&mut r, "cards", &after);
    all.extend(after.iter().cloned());
    let twins: i64 = env
        .pg()
        .query_one(
            "SELECT count(*) FROM member_cards WHERE twin IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        twins, 40,
        "the writes of both primaries made twins while held"
    );

    // Let go: the promoted node drives the rotation. Its drain waits for the dead primary's
    // report to grow stale (30 s), since that node never said it computes the new form.
    drop(holder);
    let mut wrong = Vec::new();
    let ended = wait_until(Duration::from_secs(120), || {
        wrong.extend(check_round(&mut r, &all, &["never-1".to_string()]));
        set_info(&mut r, "cards", "token_rotation").as_deref() == Ok("none")
            && set_info(&mut r, "cards", "token_key_id").as_deref() == Ok("default>k2")
    });
    assert!(
        ended,
        "the rotation never ended on the promoted node: {:?} {:?}\n{}",
        set_info(&mut r, "cards", "token_rotation"),
        set_info(&mut r, "cards", "token_rotation_last_error"),
        support::lifecycle::log_tail(&replica)
    );
    assert!(wrong.is_empty(), "wrong answers: {wrong:?}");
    let mut k = redis::cmd("MEMBER.MEXISTS");
    k.arg("cards").arg("ITEMS").arg(&all);
    assert_eq!(k.query::<Vec<i64>>(&mut r).unwrap(), vec![1; all.len()]);
    assert_eq!(int(&mut r, &["MEMBER.EXISTS", "cards", "never"]), 0);
    let rows: (i64, i64) = {
        let row = env
            .pg()
            .query_one(
                "SELECT count(*) FILTER (WHERE entity_id ~ '^2:'), count(*) FROM member_cards",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(rows, (140, 140), "every row in the new form, each once");
    let log = replica.log();
    assert_eq!(
        log.matches("rotation of set 'cards' taken over by this node")
            .count(),
        1,
        "{log}"
    );
}

/// A transaction that holds the set's table (a writer's lock, kept open) through every try of
/// the start's DDL: ROTATE-KEY answers TRYAGAIN, says why, and changes nothing (no phase, the
/// chain as it was, lookups as before); once the transaction ends, the same command starts it.
#[test]
fn a_rotation_refused_by_a_table_held_busy_changes_nothing_and_starts_on_a_retry() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    let env = Env::with(&[("member.token-key-file", file.path())]);
    let mut c = env.conn();
    create_synced(&mut c, "cards", &["TOKENIZE", "hmac-sha256"]);
    add_each(&mut c, "cards", &["kept".to_string()]);
    let mut writer = env.pg();
    writer
        .batch_execute("BEGIN; LOCK TABLE member_cards IN ROW EXCLUSIVE MODE")
        .unwrap();
    let e = err(&mut c, &["MEMBER.ALTER", "cards", "ROTATE-KEY", "k2"]);
    assert_eq!(
        e,
        "TRYAGAIN libmember: the set's table stayed locked by other sessions; the rotation \
         did not start; retry"
    );
    assert_eq!(set_info(&mut c, "cards", "token_rotation").unwrap(), "none");
    assert_eq!(
        set_info(&mut c, "cards", "token_key_id").unwrap(),
        "default"
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "cards", "kept"]), 1);
    writer.batch_execute("ROLLBACK").unwrap();
    rotate_key(&mut c, "cards", "k2");
    assert!(
        wait_until(Duration::from_secs(60), || set_info(
            &mut c,
            "cards",
            "token_key_id"
        )
        .as_deref()
            == Ok("default>k2")),
        "the rotation never ended: {:?}",
        set_info(&mut c, "cards", "token_rotation_last_error")
    );
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "cards", "kept"]), 1);
}
