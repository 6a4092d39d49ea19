//! A `member.*` value the server refuses fails the module load cleanly: at start-up the server
//! exits with the reason in its log, and a MODULE LOADEX answers an error while the server
//! keeps running. (Before, the load went on with the configs unset and the server crashed in
//! its own unload path: one out-of-range value took the whole server down. A LOADEX name the
//! module does not have still does, in the server alone: docs/configuration.md.)
use crate::support;

use std::time::Duration;

use support::member::*;
use support::{fresh_db, module_path, start_with, Valkey};

/// What a crash report of the server starts with.
const CRASHED: &str = "crashed by signal";

/// Inserts `args` as the module's own arguments, right after its path on the command line.
fn module_args(argv: &mut Vec<std::ffi::OsString>, args: &[&str]) {
    let at = argv
        .iter()
        .position(|a| a == "--loadmodule")
        .expect("the harness loads the module with --loadmodule")
        + 2;
    for (i, a) in args.iter().enumerate() {
        argv.insert(at + i, a.into());
    }
}

#[test]
fn a_refused_value_at_start_up_stops_the_server_with_the_reason() {
    let db = fresh_db();
    let mut vk = start_with(&db.url(), &[]);
    vk.shutdown(&["NOSAVE"]);
    let cases: &[(&[&str], &[&str], &str)] = &[
        // (server config lines, module arguments, what the log must say)
        (
            &["--member.workers", "1000"],
            &[],
            "Issue during loading of configuration member.workers",
        ),
        (
            &["--member.default-error-rate", "0.9"],
            &[],
            "member.default-error-rate",
        ),
        (
            &[],
            &["workers", "1000"],
            "module argument workers: 1000 is not between 1 and 64",
        ),
        (&[], &["workers", "abc"], "module argument workers:"),
        (
            &[],
            &["acl-sets", "maybe"],
            "module argument acl-sets: \"maybe\" is not yes or no",
        ),
    ];
    for (configs, args, says) in cases {
        let before = vk.log().len();
        let status = vk.start_edited_expecting_exit(
            |argv| {
                module_args(argv, args);
                argv.extend(configs.iter().map(Into::into));
            },
            Duration::from_secs(20),
        );
        let log = vk.log()[before..].to_string();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(1),
            "{configs:?} {args:?}: the server must refuse to start (exit 1, not a signal)\n{log}"
        );
        assert!(
            log.contains(says),
            "{configs:?} {args:?}: the log must say {says:?}\n{log}"
        );
        assert!(
            !log.contains(CRASHED),
            "{configs:?} {args:?}: crashed\n{log}"
        );
    }
    // The same command line without the refused value starts and serves.
    vk.restart();
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "after"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "after", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "after", "alice"]), 1);
}

/// The server's threads whose name starts with `prefix` (libmember names all of its own).
fn threads(vk: &Valkey, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", vk.pid()))
        .expect("the server's task list")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[test]
fn a_refused_value_at_module_load_leaves_the_server_running() {
    let db = fresh_db();
    let vk = Valkey::start_plain_with(&[("enable-module-command", "yes")]);
    let mut c = vk.conn();
    let module = module_path();
    let loadex = |c: &mut redis::Connection, configs: &[(&str, &str)]| {
        let mut cmd = redis::cmd("MODULE");
        cmd.arg("LOADEX").arg(module.to_str().unwrap());
        for (name, value) in configs {
            cmd.arg("CONFIG").arg(*name).arg(*value);
        }
        cmd.query::<()>(c)
    };
    let err = loadex(&mut c, &[("member.workers", "1000")]).expect_err("a refused value");
    assert!(
        err.to_string().contains("Error loading the extension"),
        "{err}"
    );
    let pong: String = redis::cmd("PING")
        .query(&mut c)
        .expect("the server is still up");
    assert_eq!(pong, "PONG");
    let log = vk.log();
    assert!(log.contains("the module is not loaded"), "{log}");
    assert!(!log.contains(CRASHED), "{log}");
    // Nothing of the failed load runs on: no worker, no listener, no command.
    assert_eq!(
        threads(&vk, "member-"),
        0,
        "threads left by the failed load\n{log}"
    );
    let unknown = redis::cmd("MEMBER.INFO").arg("x").query::<()>(&mut c);
    assert!(
        unknown.is_err_and(|e| e.to_string().contains("unknown command")),
        "MEMBER.INFO after a failed load"
    );

    // Loaded again with good values, the module serves, with the values given.
    loadex(
        &mut c,
        &[("member.workers", "3"), ("member.pg-url", &db.url())],
    )
    .expect("a load with good values");
    let workers: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.workers")
        .query(&mut c)
        .unwrap();
    assert_eq!(workers, ["member.workers", "3"]);
    assert!(wait_catalog_loaded(&mut c, Duration::from_secs(20)));
    ok(&mut c, &["MEMBER.CREATE", "loaded"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "loaded", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "loaded", "alice"]), 1);
    assert_eq!(threads(&vk, "member-db-"), 3);
}

/// A module argument no config has (`wokers 3`), a name left without its value, or one given
/// twice was ignored: the server ran with the setting silently lost. Now the load fails with
/// the reason, at start-up and in MODULE LOADEX … ARGS alike.
#[test]
fn an_unknown_or_incomplete_module_argument_fails_the_load() {
    let db = fresh_db();
    let mut vk = start_with(&db.url(), &[]);
    vk.shutdown(&["NOSAVE"]);
    let cases: &[(&[&str], &str)] = &[
        (&["wokers", "3"], "unknown module argument wokers"),
        (&["workers"], "module argument workers: no value given"),
        (
            &["workers", "3", "batch-size"],
            "module argument batch-size: no value given",
        ),
        (
            &["workers", "3", "workers", "4"],
            "module argument workers: given twice",
        ),
        (
            &["member.workers", "3"],
            "unknown module argument member.workers",
        ),
        (&["token-key-file", "a\u{1b}b"], "control character"),
    ];
    for (args, says) in cases {
        let before = vk.log().len();
        let status =
            vk.start_edited_expecting_exit(|argv| module_args(argv, args), Duration::from_secs(20));
        let log = vk.log()[before..].to_string();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(1),
            "{args:?}: the server must refuse to start (exit 1, not a signal)\n{log}"
        );
        assert!(
            log.contains(says),
            "{args:?}: the log must say {says:?}\n{log}"
        );
        assert!(!log.contains(CRASHED), "{args:?}: crashed\n{log}");
    }
    // Good arguments still load, and count.
    let status =
        vk.start_edited_expecting_exit(|argv| module_args(argv, &["workers", "2"]), Duration::ZERO);
    assert_eq!(status, None, "the server exited:\n{}", vk.log());
    assert!(
        support::wait_until(Duration::from_secs(20), || redis::Client::open(vk.url())
            .and_then(|cl| cl.get_connection_with_timeout(Duration::from_secs(1)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()),
        "the server never answered:\n{}",
        vk.log()
    );
    let mut c = vk.conn();
    let workers: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.workers")
        .query(&mut c)
        .unwrap();
    assert_eq!(workers, ["member.workers", "2"]);

    // MODULE LOADEX … ARGS: an error, the server keeps running, nothing of the module stays.
    let plain = Valkey::start_plain_with(&[("enable-module-command", "yes")]);
    let mut c = plain.conn();
    let module = module_path();
    for args in [&["wokers", "3"][..], &["workers"]] {
        let e = redis::cmd("MODULE")
            .arg("LOADEX")
            .arg(module.to_str().unwrap())
            .arg("ARGS")
            .arg(args)
            .query::<()>(&mut c)
            .expect_err("a bad module argument");
        assert!(e.to_string().contains("Error loading"), "{args:?}: {e}");
        let pong: String = redis::cmd("PING").query(&mut c).unwrap();
        assert_eq!(pong, "PONG");
        let unknown = redis::cmd("MEMBER.INFO").arg("x").query::<()>(&mut c);
        assert!(
            unknown.is_err_and(|e| e.to_string().contains("unknown command")),
            "{args:?}: the module stayed loaded"
        );
    }
    let log = plain.log();
    assert!(log.contains("unknown module argument wokers"), "{log}");
    assert!(!log.contains(CRASHED), "{log}");
    assert_eq!(threads(&plain, "member-"), 0, "threads left\n{log}");
}
