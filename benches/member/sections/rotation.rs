//! Bench section `rotation`: an online key rotation (`MEMBER.ALTER <set> ROTATE-KEY <id>`,
//! docs/security.md) of a tokenized set of `--members` rows, from the command to the end of
//! its drain, against the equivalent single SQL `UPDATE` PostgreSQL runs alone (the offline
//! procedure's, on a copy of the table with its key, its generated `slot` and no triggers);
//! and MEMBER.EXISTS of absent items on the set while it rotates against the same at rest,
//! before and after (valkey-benchmark, 50 connections, pipeline 16). On servers of its own,
//! so the rotation's load meets nothing else.

use std::time::{Duration, Instant};

use crate::sections::sync_memory::set_number;
use crate::{progress, support, thousands, vb_absent_exists, vk_conn, Bench, Stats};

const SECTION: &str = "Online key rotation (MEMBER.ALTER ROTATE-KEY)";
const SET: &str = "rot";
const KEY1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const KEY2: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";
/// A rotation that has not ended by then is reported as such.
const GIVE_UP: Duration = Duration::from_secs(3600);

/// MEMBER.INFO's `token_rotation` of the set.
fn rotation_phase(c: &mut redis::Connection) -> String {
    let v: Vec<String> = redis::cmd("MEMBER.INFO")
        .arg(SET)
        .query(c)
        .unwrap_or_default();
    v.chunks(2)
        .find(|p| p[0] == "token_rotation")
        .map(|p| p[1].clone())
        .unwrap_or_default()
}

impl Bench {
    pub(crate) fn rotation(&mut self) {
        let n = self.opts.members;
        progress(&format!(
            "rotation: {n} tokenized rows, a rotation vs one UPDATE"
        ));
        let dir = std::env::temp_dir().join(format!("member-bench-ring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("key dir");
        let ring = dir.join("ring");
        std::fs::write(&ring, format!("default {KEY1}\nk2 {KEY2}\n")).expect("ring file");
        let db = support::fresh_db();
        let vk = support::member::start_loaded(
            &db.url(),
            &[("member.token-key-file", ring.to_str().unwrap())],
        );
        let port = vk.port();
        let mut c = vk_conn(port);
        let _: String = redis::cmd("MEMBER.CREATE")
            .arg(SET)
            .arg("CAPACITY")
            .arg(n)
            .arg("TOKENIZE")
            .arg("hmac-sha256")
            .query(&mut c)
            .expect("MEMBER.CREATE");
        let mut pg = db.client();
        // One statement each: VACUUM runs outside a transaction.
        for sql in [
            "CREATE EXTENSION IF NOT EXISTS pgcrypto".to_string(),
            format!("ALTER TABLE member_{SET} DISABLE TRIGGER USER"),
            format!(
                "INSERT INTO member_{SET} (entity_id)
                   SELECT encode(hmac(convert_to('r' || g, 'UTF8') || '\\x00'::bytea,
                                      decode('{KEY1}', 'hex'), 'sha256'), 'hex')
                     FROM generate_series(1, {n}) g"
            ),
            format!("ALTER TABLE member_{SET} ENABLE TRIGGER USER"),
            format!("VACUUM (ANALYZE) member_{SET}"),
            // With its generated `slot`: the set's table computes it for every row an UPDATE
            // gives a new token, as the offline procedure's does.
            format!(
                "CREATE TABLE rot_copy (LIKE member_{SET}
                   INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING INDEXES)"
            ),
            format!(
                "INSERT INTO rot_copy (entity_id, scope, status, created_at, updated_at, expires_at)
                   SELECT entity_id, scope, status, created_at, updated_at, expires_at
                     FROM member_{SET}"
            ),
            "VACUUM (ANALYZE) rot_copy".to_string(),
            "CHECKPOINT".to_string(),
        ] {
            pg.batch_execute(&sql).expect("load the tokenized rows");
        }
        let loaded: i64 = redis::cmd("MEMBER.REBUILD")
            .arg(SET)
            .arg("SYNC")
            .query(&mut c)
            .expect("MEMBER.REBUILD");
        assert_eq!(loaded as u64, n, "rows the filter was built from");

        // The equivalent UPDATE alone: every row to its wrapped form, one statement.
        progress("rotation: the single UPDATE alone, on a copy of the table");
        let t = Instant::now();
        pg.batch_execute(&format!(
            "UPDATE rot_copy SET entity_id = '2:' ||
                 encode(hmac(convert_to(entity_id, 'UTF8'), decode('{KEY2}', 'hex'), 'sha256'),
                        'hex')"
        ))
        .expect("the UPDATE");
        let update_s = t.elapsed().as_secs_f64();
        pg.batch_execute("DROP TABLE rot_copy")
            .expect("drop the copy");
        pg.batch_execute("CHECKPOINT").expect("checkpoint");

        let half = self.opts.secs / 2.0;
        progress("rotation: EXISTS of absent items at rest");
        let before = vb_absent_exists(port, 16, half, SET);
        progress("rotation: the rotation, with EXISTS of absent items while it runs");
        let t = Instant::now();
        let _: String = redis::cmd("MEMBER.ALTER")
            .arg(SET)
            .arg("ROTATE-KEY")
            .arg("k2")
            .query(&mut c)
            .expect("MEMBER.ALTER ROTATE-KEY");
        // The node follows the catalog: the reply can come before it shows the rotation.
        while rotation_phase(&mut c) == "none" && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        // A watcher on a connection of its own sees each phase within 20 ms; the lookup runs
        // (about a second each) go on beside it until it sees the end.
        let watcher = std::thread::spawn(move || {
            let mut c = vk_conn(port);
            // When each phase was first seen.
            let mut phases: Vec<(String, f64)> = Vec::new();
            while t.elapsed() < GIVE_UP {
                let phase = rotation_phase(&mut c);
                if phases.last().is_none_or(|(p, _)| *p != phase) {
                    phases.push((phase.clone(), t.elapsed().as_secs_f64()));
                }
                if phase == "none" {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            phases
        });
        let mut during = Vec::new();
        while !watcher.is_finished() {
            during.push(vb_absent_exists(port, 16, 1.0, SET));
        }
        let phases = watcher.join().expect("the phase watcher");
        let ended = phases.last().is_some_and(|(p, _)| p == "none");
        let rotate_s = phases
            .last()
            .map_or(t.elapsed().as_secs_f64(), |(_, at)| *at);
        progress("rotation: EXISTS of absent items at rest, after");
        let after = vb_absent_exists(port, 16, half, SET);
        let rest = Stats::pool(&[before, after]);

        let secs = |s: f64| format!("{s:.1} s");
        self.r.row(
            SECTION,
            format!(
                "{} rows to a new key, command to end of drain vs the single UPDATE alone",
                thousands(n)
            ),
            if ended {
                secs(rotate_s)
            } else {
                format!("not ended in {}", secs(rotate_s))
            },
            format!("{} (UPDATE, no triggers)", secs(update_s)),
            Some(rotate_s / update_s.max(1e-9)),
            "≤ 2×",
            Some(ended && rotate_s <= 2.0 * update_s),
        );
        if during.is_empty() {
            self.r
                .note("rotation: ended before a lookup run could be measured during it");
        } else {
            let during = Stats::pool(&during);
            self.r.row(
                SECTION,
                "EXISTS of absent items, pipeline 16, 50 conns: while it rotates vs at rest",
                format!("{}/s", thousands(during.rps() as u64)),
                format!("{}/s (before and after)", thousands(rest.rps() as u64)),
                Some(during.rps() / rest.rps().max(1e-9)),
                "≥ 0.7×",
                Some(during.rps() >= 0.7 * rest.rps()),
            );
        }
        self.r.note(format!(
            "rotation: phases first seen at {}",
            phases
                .iter()
                .map(|(p, at)| format!("{p} {at:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let left = set_number(&mut c, SET, "token_rotation_rows_left");
        if left > 0 {
            self.r
                .note(format!("rotation: {left} rows left when the run stopped"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
