//! Issue 9: a set created in the first milliseconds after the server starts, before the
//! catalog load has answered, must be complete when CREATE replies, whatever the catalog load
//! does afterwards (it once ended with `filter_complete 0`).
use crate::support;

use std::thread;
use std::time::Duration;

use support::member::*;
use support::{fresh_db, start_with};

#[test]
fn a_set_created_at_start_is_complete_when_create_replies() {
    let db = fresh_db();
    for round in 0..6 {
        // A generous database timeout: this test is about the catalog load racing the
        // CREATE, not about a CREATE that a busy machine slows past the default 2 s.
        let vk = start_with(&db.url(), &[("member.db-timeout-ms", "20000")]);
        let mut c = vk.conn();
        let set = format!("early{round}");
        // At once: the catalog load (which also reads the sets of earlier rounds) is in flight.
        ok(&mut c, &["MEMBER.CREATE", &set]);
        let complete = set_info(&mut c, &set, "filter_complete");
        assert_eq!(
            complete.as_deref(),
            Ok("1"),
            "round {round}: filter_complete right after CREATE's OK\n{}",
            vk.log()
        );
        assert_eq!(int(&mut c, &["MEMBER.ADD", &set, "alice"]), 1);
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", &set, "alice"]), 1);
        assert_eq!(
            explain(&mut c, &set, "never-added"),
            (0, "bloom-negative".to_string()),
            "round {round}: the new set's filter must answer absent by itself\n{}",
            vk.log()
        );
        // And it stays complete once the catalog load has answered.
        assert!(wait_catalog_loaded(&mut c, Duration::from_secs(20)));
        thread::sleep(Duration::from_millis(300));
        assert_eq!(
            set_info(&mut c, &set, "filter_complete").as_deref(),
            Ok("1"),
            "round {round}: filter_complete after the catalog load\n{}",
            vk.log()
        );
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", &set, "alice"]), 1);
        assert_eq!(
            explain(&mut c, &set, "never-added").1,
            "bloom-negative",
            "round {round}: after the catalog load\n{}",
            vk.log()
        );
    }
}
