//! The online rotation of a tokenized set's key (docs/security.md, "Rotating a tokenized
//! set's key online"): `MEMBER.ALTER <set> ROTATE-KEY <id>` is refused while a node lacks the
//! key, then copies every row to its twin under the new key, lengthens the chain, lets each
//! node switch as its filter passes the end, and deletes the old forms; a primary and its
//! replica answer every lookup right throughout, while MEMBER.ADD, MADD, DEL and an outside
//! writer keep writing.
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{Connection, Value};
use support::lifecycle::wait_linked;
use support::member::*;
use support::rotation::{
    add_each, check_round, hold_rotation, mexists, rotate_key, shows_phase, stamp, Acked,
};
use support::wait_until;

use super::tokenize::{KeyFile, KEY1, KEY2};

/// Rows an outside writer puts in before the rotation, in the first key's form.
const BULK: i64 = 12_000;

fn bulk(i: i64) -> String {
    format!("bulk-{i}")
}

#[test]
fn a_set_rotated_online_answers_right_throughout_on_a_primary_and_its_replica() {
    let ring = format!("default {KEY1}\nk2 {KEY2}\n");
    let file = KeyFile::new(&ring);
    // Correctness is checked here, not latency: a generous database timeout keeps a loaded
    // machine's slow statement from failing a lookup (a lock that held readers for seconds
    // would still show).
    let env = Env::with(&[
        ("member.token-key-file", file.path()),
        ("member.db-timeout-ms", "10000"),
    ]);
    let mut c = env.conn();
    create_synced(&mut c, "cards", &["TOKENIZE", "hmac-sha256"]);
    let mut pg = env.pg();
    pg.batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        .unwrap();
    // An outside writer's rows, in the first key's form, and some through the module.
    pg.execute(
        "INSERT INTO member_cards (entity_id)
         SELECT encode(hmac(convert_to('bulk-' || i, 'UTF8') || '\\x00'::bytea,
                            decode($1, 'hex'), 'sha256'), 'hex')
           FROM generate_series(1, $2::int8) i",
        &[&KEY1, &BULK],
    )
    .unwrap();
    let kept: Vec<String> = (0..60).map(|i| format!("card-{i}")).collect();
    let doomed: Vec<String> = (0..40).map(|i| format!("doomed-{i}")).collect();
    for i in kept.iter().chain(&doomed) {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "cards", i]), 1);
    }
    let gone: Vec<String> = (0..20).map(|i| format!("gone-{i}")).collect();
    for i in &gone {
        int(&mut c, &["MEMBER.ADD", "cards", i]);
        int(&mut c, &["MEMBER.DEL", "cards", i]);
    }
    assert!(wait_until(Duration::from_secs(30), || mexists(
        &mut c,
        "cards",
        &[bulk(1), bulk(BULK)]
    ) == [1, 1]));
    wait_trusted(&mut c, "cards", "the set's filter never caught up");

    // A replica without the new key: the rotation is refused, naming it.
    let replica_file = KeyFile::new(&format!("default {KEY1}\n"));
    let replica = start_loaded(
        &env.db.url(),
        &[
            ("member.token-key-file", replica_file.path()),
            ("member.db-timeout-ms", "10000"),
        ],
    );
    let mut r = replica.conn();
    let _: Value = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(env.vk.port())
        .query(&mut r)
        .unwrap();
    wait_linked(&replica, &mut r, Duration::from_secs(30));
    let replica_id = super::key_ring::run_id(&mut r);
    assert!(wait_until(Duration::from_secs(30), || {
        let e = err(&mut c, &["MEMBER.ALTER", "cards", "ROTATE-KEY", "k2"]);
        e.contains(&replica_id) && e.contains("is not loaded on every node")
    }));
    assert_eq!(set_info(&mut c, "cards", "token_rotation").unwrap(), "none");
    replica_file.rewrite(&ring);
    assert_eq!(int(&mut r, &["MEMBER.KEYS", "RELOAD"]), 2);
    // Once the replica's report says so, the key is everywhere.
    assert!(wait_until(Duration::from_secs(30), || {
        err(&mut c, &["MEMBER.ALTER", "nosuch", "ROTATE-KEY", "k2"])
            == "ERR no such set: create it with MEMBER.CREATE"
    }));
    for (args, want) in [
        (
            &["MEMBER.ALTER", "cards", "ROTATE-KEY"][..],
            "ERR wrong number of arguments for 'member.alter' command",
        ),
        (
            &["MEMBER.ALTER", "cards", "ROTATE-KEY", "k9"],
            "ERR no key with id 'k9' in this node's ring (MEMBER.KEYS LIST)",
        ),
        (
            &["MEMBER.ALTER", "nosuch", "ROTATE-KEY", "k2"],
            "ERR no such set: create it with MEMBER.CREATE",
        ),
        (
            &["MEMBER.ALTER", "cards", "ROTATE-KEY", "default"],
            "ERR set 'cards' already uses key 'default': a rotation moves it to a key it never used",
        ),
    ] {
        assert_eq!(err(&mut c, args), want, "{args:?}");
    }

    // Readers on both nodes and writers on the primary, while the rotation runs.
    let acked = Arc::new(Mutex::new(Acked::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let present: Vec<String> = kept
        .iter()
        .cloned()
        .chain((1..=BULK).step_by(97).map(bulk))
        .collect();
    let absent: Vec<String> = gone
        .iter()
        .cloned()
        .chain((0..30).map(|i| format!("never-{i}")))
        .collect();
    let readers: Vec<_> = [env.vk.port(), replica.port()]
        .into_iter()
        .map(|port| {
            let (acked, stop) = (acked.clone(), stop.clone());
            let (present, absent) = (present.clone(), absent.clone());
            let primary = port == env.vk.port();
            std::thread::spawn(move || {
                let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let mut wrong = Vec::new();
                let mut rounds = 0;
                while !stop.load(Ordering::Acquire) {
                    // The replica is checked on what was there before: its copy of an
                    // acknowledged write may still be on its way.
                    let none = Mutex::new(Acked::default());
                    let acked = if primary { &*acked } else { &none };
                    wrong.extend(check_round(&mut c, "cards", &present, &absent, acked));
                    rounds += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                (rounds, wrong)
            })
        })
        .collect();
    let writer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        let doomed = doomed.clone();
        let port = env.vk.port();
        let url = env.db.url();
        std::thread::spawn(move || {
            let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .unwrap()
                .get_connection()
                .unwrap();
            let mut pg = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let mut i = 0;
            let mut errors = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let item = format!("new-{i}");
                if i % 3 == 0 {
                    let mut k = redis::cmd("MEMBER.MADD");
                    k.arg("cards")
                        .arg("ITEMS")
                        .arg(&item)
                        .arg(format!("{item}-m"));
                    // An error leaves the outcome unknown: the item is not checked then.
                    match k.query::<Vec<i64>>(&mut c) {
                        Ok(_) => {
                            let mut a = acked.lock().unwrap();
                            a.added.insert(format!("{item}-m"));
                            a.added.insert(item.clone());
                        }
                        Err(e) => errors.push(format!("{} MADD {item}: {e}", stamp())),
                    }
                } else {
                    match cmd(&mut c, &["MEMBER.ADD", "cards", &item]) {
                        Ok(_) => {
                            acked.lock().unwrap().added.insert(item.clone());
                        }
                        Err(e) => errors.push(format!("{} ADD {item}: {e}", stamp())),
                    }
                }
                if let Some(d) = doomed.get(i / 2).filter(|_| i % 2 == 0) {
                    match cmd(&mut c, &["MEMBER.DEL", "cards", d]) {
                        Ok(_) => {
                            acked.lock().unwrap().deleted.insert(d.clone());
                        }
                        Err(e) => errors.push(format!("{} DEL {d}: {e}", stamp())),
                    }
                }
                if i % 10 == 0 {
                    // An outside writer, in the form the catalog gives now (its keys: the
                    // chain's, which the end lengthens).
                    let keys: Vec<&str> = match pg
                        .query_one(
                            "SELECT token_key_fp LIKE '%>%' FROM member_catalog WHERE name = 'cards'",
                            &[],
                        )
                        .map(|r| r.get::<_, bool>(0))
                    {
                        Ok(true) => vec![KEY1, KEY2],
                        _ => vec![KEY1],
                    };
                    let outside = format!("outside-{i}");
                    let sql = format!(
                        "INSERT INTO member_cards (entity_id)
                         VALUES (member_catalog_token('cards', $1, '', {}))",
                        (2..keys.len() + 2)
                            .map(|k| format!("${k}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![&outside];
                    for k in &keys {
                        params.push(k);
                    }
                    // The chain may have grown between the two statements: refused then
                    // (the form check), never stored unfindable.
                    let _ = pg.execute(&sql, &params);
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(15));
            }
            (i, errors)
        })
    };

    rotate_key(&mut c, "cards", "k2");
    // Once the replica follows the rotation, its ring may not drop the key it moves to.
    assert!(wait_until(Duration::from_secs(30), || set_info(
        &mut r,
        "cards",
        "token_rotation"
    )
    .is_ok_and(|p| p != "none")));
    replica_file.rewrite(&format!("default {KEY1}\n"));
    let e = err(&mut r, &["MEMBER.KEYS", "RELOAD"]);
    assert!(e.contains("the key set 'cards' uses"), "{e}");
    replica_file.rewrite(&ring);
    let again = err(&mut c, &["MEMBER.ALTER", "cards", "ROTATE-KEY", "k2"]);
    assert!(
        again.contains("is rotating already") || again.contains("already uses key 'k2'"),
        "{again}"
    );
    let ended = wait_until(Duration::from_secs(120), || {
        [&mut c, &mut r].into_iter().all(|n| {
            set_info(n, "cards", "token_rotation").as_deref() == Ok("none")
                && set_info(n, "cards", "token_key_id").as_deref() == Ok("default>k2")
        })
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    let (writes, write_errors) = writer.join().unwrap();
    let mut wrong = Vec::new();
    for (who, t) in ["primary", "replica"].iter().zip(readers) {
        let (rounds, w) = t.join().unwrap();
        assert!(rounds > 3, "{who}: only {rounds} rounds");
        wrong.extend(w.into_iter().map(|w| format!("{who}: {w}")));
    }
    assert!(
        ended,
        "the rotation never ended: {:?} {:?}\n{}",
        set_info(&mut c, "cards", "token_rotation"),
        set_info(&mut c, "cards", "token_rotation_last_error"),
        support::lifecycle::log_tail(&env.vk)
    );
    assert!(
        wrong.is_empty(),
        "{} wrong answers: {:?}\n{}",
        wrong.len(),
        &wrong[..wrong.len().min(20)],
        support::lifecycle::log_tail(&env.vk)
    );
    assert!(writes > 10, "only {writes} writes ran");
    assert!(
        write_errors.is_empty(),
        "writes failed during the rotation: {write_errors:?}\n{}",
        support::lifecycle::log_tail(&env.vk)
    );

    // After: the chain names both keys, no row of the old form is left, nor the twin column,
    // and every answer is still right, on both nodes.
    assert_eq!(
        set_info(&mut c, "cards", "token_key_id").unwrap(),
        "default>k2"
    );
    let old: i64 = pg
        .query_one(
            "SELECT count(*) FROM member_cards WHERE entity_id !~ '^2:'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(old, 0, "rows of the old form are left");
    let twin: bool = pg
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'member_cards'::regclass
                              AND attname = 'twin' AND NOT attisdropped)",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!twin, "the twin column is left");
    for conn in [&mut c, &mut r] {
        let w = check_round(conn, "cards", &present, &absent, &acked);
        assert!(w.is_empty(), "after the rotation: {w:?}");
    }
    // A late writer of the old form is refused now.
    let late = pg.execute(
        "INSERT INTO member_cards (entity_id) VALUES (encode(hmac(convert_to('late', 'UTF8')
             || '\\x00'::bytea, decode($1, 'hex'), 'sha256'), 'hex'))",
        &[&KEY1],
    );
    assert!(
        late.is_err(),
        "an old-form row was taken after the rotation"
    );
}

/// Waits up to 30 s until `c` says the set `cards` rotates in `phase`.
fn wait_phase(c: &mut Connection, phase: &str) {
    assert!(
        shows_phase(c, "cards", phase),
        "the rotation never showed phase {phase}"
    );
}

/// A rotation survives a kill -9 of the primary driving it: held still in its copying phase
/// (a session holds the set's rotation lock, so no step can run: deterministic, whatever the
/// machine's speed), the node is killed and restarted, learns the rotation from the catalog,
/// answers and writes right meanwhile (its ADDs store one row of the new form naming the old),
/// and once the lock is let go the rotation goes on from the catalog to its end.
#[test]
fn a_rotation_resumes_after_a_kill_9_of_its_primary() {
    let ring = format!("default {KEY1}\nk2 {KEY2}\n");
    let file = KeyFile::new(&ring);
    let mut env = Env::with(&[
        ("member.token-key-file", file.path()),
        ("member.db-timeout-ms", "10000"),
    ]);
    let mut c = env.conn();
    create_synced(&mut c, "cards", &["TOKENIZE", "hmac-sha256"]);
    let before: Vec<String> = (0..50).map(|i| format!("before-{i}")).collect();
    add_each(&mut c, "cards", &before);
    let mut holder = env.pg();
    hold_rotation(&mut holder, "cards");
    rotate_key(&mut c, "cards", "k2");
    wait_phase(&mut c, "rewriting");

    env.vk.kill9_and_restart();
    let mut c = env.conn();
    wait_phase(&mut c, "rewriting");
    // Written while the rotation is held: both forms stored.
    let during: Vec<String> = (0..20).map(|i| format!("during-{i}")).collect();
    for i in &during {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "cards", i]), 1);
    }
    assert_eq!(int(&mut c, &["MEMBER.DEL", "cards", "before-0"]), 1);
    let mut pg = env.pg();
    let twins: i64 = pg
        .query_one(
            "SELECT count(*) FROM member_cards WHERE twin IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        twins,
        during.len() as i64,
        "only the ADDs made twins while held"
    );
    let all: Vec<String> = before.iter().chain(&during).cloned().collect();
    let want: Vec<i64> = all.iter().map(|i| (i != "before-0") as i64).collect();
    assert_eq!(mexists(&mut c, "cards", &all), want);

    // Let go: the rotation goes on from the catalog, on the restarted node.
    holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || {
            set_info(&mut c, "cards", "token_rotation").as_deref() == Ok("none")
                && set_info(&mut c, "cards", "token_key_id").as_deref() == Ok("default>k2")
        }),
        "the rotation never ended: {:?}\n{}",
        set_info(&mut c, "cards", "token_rotation_last_error"),
        support::lifecycle::log_tail(&env.vk)
    );
    assert_eq!(mexists(&mut c, "cards", &all), want);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "cards", "never"]), 0);
    let rows: Vec<(i64, i64)> = pg
        .query(
            "SELECT count(*) FILTER (WHERE entity_id ~ '^2:'), count(*) FROM member_cards",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, [(69, 69)], "every row in the new form, each once");
    // The restarted node says it took the rotation over (the log file outlives the restart).
    let log = env.vk.log();
    assert_eq!(
        log.matches("rotation of set 'cards' taken over by this node in its rewriting phase")
            .count(),
        1,
        "{log}"
    );
}
