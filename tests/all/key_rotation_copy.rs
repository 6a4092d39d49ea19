//! A rotation an earlier build started, by copy and drain (phase `copying`: every row copied
//! to a twin, triggers keeping the two alike, the old rows deleted in the drain), goes on to
//! its end under this build, which starts rotations that rewrite rows in place
//! (docs/rotation-in-place.md). The state such a build left is made by hand: the phase, no
//! page count, the twin index and the twin triggers of that build
//! (`tests/fixtures/rotation_copy/twin_functions.sql`).
use crate::support;

use std::time::Duration;

use support::member::*;
use support::rotation::{hold_rotation, mexists, rotate_key, shows_phase};
use support::wait_until;

use super::tokenize::{KeyFile, KEY1, KEY2};

const SET: &str = "copied_cards";

/// The twin triggers' functions of the build before the rewrite in place.
const TWIN_FUNCTIONS: &str = include_str!("../fixtures/rotation_copy/twin_functions.sql");

#[test]
fn a_rotation_an_earlier_build_began_by_copy_goes_on_to_its_end() {
    let file = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    let env = Env::with(&[("member.token-key-file", file.path())]);
    let mut c = env.conn();
    create_synced(&mut c, SET, &["TOKENIZE", "hmac-sha256"]);
    let before: Vec<String> = (0..40).map(|i| format!("before-{i}")).collect();
    for i in &before {
        assert_eq!(int(&mut c, &["MEMBER.ADD", SET, i]), 1);
    }
    let mut pg = env.pg();
    let mut holder = env.pg();
    hold_rotation(&mut holder, SET);
    rotate_key(&mut c, SET, "k2");
    assert!(shows_phase(&mut c, SET, "rewriting"));

    // As the earlier build left it: in its copy, with its twin index and triggers.
    let t = format!("member_{SET}");
    pg.batch_execute(TWIN_FUNCTIONS).unwrap();
    pg.batch_execute(&format!(
        "CREATE INDEX \"member_{SET}$twin\" ON {t} (twin) WHERE twin IS NOT NULL;
         CREATE TRIGGER member_twin_del AFTER DELETE ON {t}
           REFERENCING OLD TABLE AS member_twin_old FOR EACH STATEMENT
           EXECUTE FUNCTION member_twin_del();
         CREATE TRIGGER member_twin_upd AFTER UPDATE ON {t}
           REFERENCING NEW TABLE AS member_twin_new FOR EACH STATEMENT
           EXECUTE FUNCTION member_twin_upd();
         UPDATE member_catalog SET rotate_phase = 'copying', rotate_page = NULL,
                                   rotate_pages = NULL
          WHERE name = '{SET}';
         UPDATE member_catalog_version SET version = version + 1;"
    ))
    .unwrap();
    assert!(
        shows_phase(&mut c, SET, "copying"),
        "the node never read the copy"
    );
    // Written during the copy: one row of the new form each (this build's ADD), and a DEL of
    // an item whose row has no twin yet.
    let during: Vec<String> = (0..10).map(|i| format!("during-{i}")).collect();
    for i in &during {
        assert_eq!(int(&mut c, &["MEMBER.ADD", SET, i]), 1);
    }
    assert_eq!(int(&mut c, &["MEMBER.DEL", SET, "before-0"]), 1);

    holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || {
            set_info(&mut c, SET, "token_rotation").as_deref() == Ok("none")
                && set_info(&mut c, SET, "token_key_id").as_deref() == Ok("default>k2")
        }),
        "the copy never ended: {:?}\n{}",
        set_info(&mut c, SET, "token_rotation_last_error"),
        support::lifecycle::log_tail(&env.vk)
    );
    let log = env.vk.log();
    assert!(
        log.contains("every row has its twin"),
        "not ended by the copy:\n{log}"
    );
    assert!(
        log.contains("deleted in the last step"),
        "not drained by deletes:\n{log}"
    );

    let all: Vec<String> = before.iter().chain(&during).cloned().collect();
    let want: Vec<i64> = all.iter().map(|i| (i != "before-0") as i64).collect();
    assert_eq!(mexists(&mut c, SET, &all), want);
    // One row per member, of the new form; no twin column, index or trigger left.
    let r = pg
        .query_one(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE entity_id LIKE '2:%'),
                        (SELECT count(*) FROM pg_attribute
                          WHERE attrelid = '{t}'::regclass AND attname = 'twin'
                            AND NOT attisdropped),
                        (SELECT count(*) FROM pg_class WHERE relname = 'member_{SET}$twin'),
                        (SELECT count(*) FROM pg_trigger
                          WHERE tgrelid = '{t}'::regclass AND tgname LIKE 'member_twin%')
                   FROM {t}"
            ),
            &[],
        )
        .unwrap();
    let counts: Vec<i64> = (0..5).map(|i| r.get(i)).collect();
    assert_eq!(
        counts,
        [49, 49, 0, 0, 0],
        "rows, new-form rows, twin column, index, triggers"
    );
}
