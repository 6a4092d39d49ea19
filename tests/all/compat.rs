//! Sets made by an earlier build keep answering with this one, with no rebuild or migration
//! (issue 44: the canonical forms and their hashes do not change). The fixture in
//! `tests/fixtures/compat` was made by the build of commit 5534f56 (`make.sh` there): four
//! sets, NORMALIZE none, lower, username and username + TOKENIZE hmac-sha256, filled by MADD
//! with `items.txt` (ASCII with spaces and controls at the ends, accents, full-width, CJK,
//! compatibility forms), unscoped and in scope `Shop 1`.
use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::member::*;
use support::wait_until;

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const SETS: [(&str, &[&str]); 4] = [
    ("none", &["NORMALIZE", "none"]),
    ("lower", &["NORMALIZE", "lower"]),
    ("username", &["NORMALIZE", "username"]),
    (
        "token",
        &["NORMALIZE", "username", "TOKENIZE", "hmac-sha256"],
    ),
];
const SCOPE: &str = "Shop 1";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/compat")
        .join(name)
}

fn items() -> Vec<String> {
    std::fs::read_to_string(fixture("items.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The tokenization key in a file of its own (the fixture's sets were made under it).
fn key_file() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("member-compat-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("token.key");
    std::fs::write(&path, KEY).unwrap();
    path
}

/// Every item answers 1 from `set`, unscoped and in SCOPE, one by one and in one MEXISTS; items
/// never added answer 0.
fn assert_members(c: &mut redis::Connection, set: &str, items: &[String], when: &str) {
    for item in items {
        assert_eq!(
            int(c, &["MEMBER.EXISTS", set, item]),
            1,
            "{when}: {set} {item:?}"
        );
        let scoped = ["MEMBER.EXISTS", set, item, "SCOPE", SCOPE];
        assert_eq!(int(c, &scoped), 1, "{when}: {set} {item:?} in scope");
    }
    let mut args = vec!["MEMBER.MEXISTS", set, "ITEMS"];
    args.extend(items.iter().map(String::as_str));
    let all: Vec<i64> = redis::cmd(args[0]).arg(&args[1..]).query(c).unwrap();
    assert_eq!(all, vec![1; items.len()], "{when}: MEXISTS {set}");
    for absent in ["never-added", "ＮＯＢＯＤＹ", "école2", "alice "] {
        let expect = i64::from(absent == "alice " && set != "compat_none");
        assert_eq!(
            int(c, &["MEMBER.EXISTS", set, absent]),
            expect,
            "{when}: {set} {absent:?}"
        );
    }
}

/// The rows the earlier build stored (loaded from its SQL) are exactly the rows this build
/// stores for the same MADDs, and every item answers 1 from the sets it made.
#[test]
fn the_earlier_builds_stored_forms_are_this_builds() {
    let db = support::fresh_db();
    let sql = std::fs::read_to_string(fixture("members.sql")).unwrap();
    db.client()
        .batch_execute(&sql)
        .expect("load the fixture's SQL");
    let key = key_file();
    let vk = start_loaded(
        &db.url(),
        &[("member.token-key-file", key.to_str().unwrap())],
    );
    let mut c = vk.conn();
    let items = items();
    let mut pg = db.client();
    for (name, opts) in SETS {
        let (old, new) = (format!("compat_{name}"), format!("now_{name}"));
        let mut create = vec!["MEMBER.CREATE", &new, "CAPACITY", "1000"];
        create.extend_from_slice(opts);
        ok(&mut c, &create);
        for scope in [None, Some(SCOPE)] {
            let mut madd = vec!["MEMBER.MADD", &new];
            if let Some(s) = scope {
                madd.extend(["SCOPE", s]);
            }
            madd.push("ITEMS");
            madd.extend(items.iter().map(String::as_str));
            let _: Vec<i64> = redis::cmd(madd[0]).arg(&madd[1..]).query(&mut c).unwrap();
        }
        let mut rows = |table: &str| -> Vec<(String, String)> {
            let q = format!("SELECT entity_id, scope FROM member_{table} ORDER BY 1, 2");
            pg.query(&q, &[])
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()
        };
        let (was, is) = (rows(&old), rows(&new));
        assert!(was.len() >= items.len(), "{old}: {} rows", was.len());
        assert_eq!(was, is, "{name}: the stored forms changed");
        assert_members(&mut c, &old, &items, "the earlier build's set");
    }
    let _ = std::fs::remove_dir_all(key.parent().unwrap());
}

/// With `MEMBER_PREVIOUS_MODULE` naming an earlier build (e.g. main's
/// `target/release/libmember.so`): that build makes the four sets and saves its RDB; this build
/// loads the RDB on the same database and serves from the filters it found there (no rebuild,
/// the filters trusted and saying "absent"), every member answering 1.
#[test]
#[ignore = "needs MEMBER_PREVIOUS_MODULE, the path of an earlier build of the module"]
fn an_rdb_made_by_an_earlier_build_is_served_without_a_rebuild() {
    let previous = PathBuf::from(
        std::env::var("MEMBER_PREVIOUS_MODULE")
            .expect("MEMBER_PREVIOUS_MODULE: the path of an earlier build's libmember.so"),
    );
    let db = support::fresh_db();
    let key = key_file();
    let key_cfg = ("member.token-key-file", key.to_str().unwrap());
    let url = db.url();
    let items = items();
    let rdb = {
        let cfg = [("member.pg-url", url.as_str()), key_cfg];
        let mut old = support::Valkey::start_module(&previous, &cfg);
        let mut c = old.conn();
        assert!(wait_catalog_loaded(&mut c, Duration::from_secs(20)));
        for (name, opts) in SETS {
            let set = format!("compat_{name}");
            let mut create = vec!["MEMBER.CREATE", &set, "CAPACITY", "1000"];
            create.extend_from_slice(opts);
            ok(&mut c, &create);
            for scope in [None, Some(SCOPE)] {
                let mut madd = vec!["MEMBER.MADD", &set];
                if let Some(s) = scope {
                    madd.extend(["SCOPE", s]);
                }
                madd.push("ITEMS");
                madd.extend(items.iter().map(String::as_str));
                let _: Vec<i64> = redis::cmd(madd[0]).arg(&madd[1..]).query(&mut c).unwrap();
            }
        }
        ok(&mut c, &["SAVE"]);
        let rdb = std::fs::read(old.dir().join("dump.rdb")).unwrap();
        old.shutdown(&["NOSAVE"]);
        rdb
    };
    let mut vk = support::start_with(&url, &[key_cfg]);
    vk.shutdown(&["NOSAVE"]);
    std::fs::write(vk.dir().join("dump.rdb"), rdb).unwrap();
    vk.restart();
    let mut c = vk.conn();
    assert!(wait_catalog_loaded(&mut c, Duration::from_secs(20)));
    for (name, _) in SETS {
        let set = format!("compat_{name}");
        let trusted = wait_until(Duration::from_secs(20), || {
            set_info(&mut c, &set, "filter_serves_absent").as_deref() == Ok("1")
        });
        assert!(
            trusted,
            "{set}: the loaded filter is not trusted:\n{}",
            vk.log()
        );
        assert_members(&mut c, &set, &items, "loaded by this build");
        assert!(bloom_negative_now(&mut c, &set, "never-added"), "{set}");
    }
    assert_eq!(
        info_field(&mut c, "rebuilds_done").unwrap(),
        "0",
        "the filters were rebuilt instead of served as loaded:\n{}",
        vk.log()
    );
    let _ = std::fs::remove_dir_all(key.parent().unwrap());
}
