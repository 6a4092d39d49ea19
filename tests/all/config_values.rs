//! No config value or file can crash, hang or exhaust the server: a NUL or another control
//! byte in any string config (as written, quoted or percent-encoded) is refused at CONFIG SET,
//! in a config file and in MODULE LOADEX, and nothing changes; the key and password files
//! must be small regular files (a FIFO, a device, a directory, a huge file are refused, at
//! CONFIG SET and, for the password file, at every connection, as `db_link_error`).
use crate::support;

use std::time::Duration;

use redis::{Connection, Value};
use support::member::*;
use support::{fresh_db, module_path, start_with, wait_until, Valkey};

/// CONFIG SET with raw bytes; the error text, or None when the server accepted it.
fn set_raw(c: &mut Connection, name: &str, value: &[u8]) -> Option<String> {
    match redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query::<Value>(c)
    {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

fn get(c: &mut Connection, name: &str) -> String {
    let v: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(c).unwrap();
    v[1].clone()
}

/// The server answers PING, CONFIG GET * and INFO member (the two replies a stored NUL used
/// to abort), and its log holds no crash or panic.
fn alive(vk: &Valkey, c: &mut Connection, after: &str) {
    let pong: Result<String, _> = redis::cmd("PING").query(c);
    assert_eq!(
        pong.as_deref().ok(),
        Some("PONG"),
        "after {after}:\n{}",
        vk.log()
    );
    let all: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("*").query(c).unwrap();
    assert!(all.iter().all(|v| !v.contains('\0')), "after {after}");
    let info: String = redis::cmd("INFO").arg("member").query(c).unwrap();
    assert!(info.contains("member_sets"), "after {after}: {info}");
    let log = vk.log();
    for bad in ["crashed by signal", "panicked", "BUG REPORT"] {
        assert!(
            !log.contains(bad),
            "after {after}: the log says {bad:?}\n{log}"
        );
    }
}

/// A scratch directory for files the configs name.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("member-cv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_nul_or_control_byte_in_any_string_config_is_refused_and_changes_nothing() {
    let env = Env::new();
    let mut c = env.conn();
    let url = env.db.url();
    let held: Vec<(&str, String)> = [
        "member.pg-url",
        "member.pg-rebuild-url",
        "member.pg-password-file",
        "member.token-key-file",
        "member.attach-allow",
        "member.default-error-rate",
    ]
    .into_iter()
    .map(|n| (n, get(&mut c, n)))
    .collect();
    let conninfo: Vec<Vec<u8>> = vec![
        format!("{url} dbname='ac\0l'").into_bytes(),
        b"host='127.0.0.1\0'".to_vec(),
        format!("{url} sslrootcert='a\0b' sslmode=verify-ca").into_bytes(),
        format!("{url} password='pw\0'").into_bytes(),
        b"postgres://postgres@127.0.0.1/postgres?sslrootcert=a%00b&sslmode=verify-ca".to_vec(),
        b"postgres://postgres:p%00w@127.0.0.1/postgres".to_vec(),
        format!("{url} application_name=a\tb").into_bytes(),
        format!("{url}\n").into_bytes(),
    ];
    let paths: Vec<Vec<u8>> = vec![
        b"a\0b".to_vec(),
        b"/tmp/\0".to_vec(),
        b"/tmp/a\nb".to_vec(),
        b"/tmp/\x1b[2J".to_vec(),
        b"\xff\xfe".to_vec(),
    ];
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    for name in ["member.pg-url", "member.pg-rebuild-url"] {
        cases.extend(conninfo.iter().map(|v| (name, v.clone())));
    }
    for name in ["member.pg-password-file", "member.token-key-file"] {
        cases.extend(paths.iter().map(|v| (name, v.clone())));
    }
    for v in [
        &b"app.us\0ers"[..],
        b"app.users\n",
        b"app.*\tbilling.*",
        b"\x1b.x",
    ] {
        cases.push(("member.attach-allow", v.to_vec()));
    }
    cases.push(("member.default-error-rate", b"0.01\0".to_vec()));
    // Huge values: refused by their length, not scanned or stored.
    for (name, _) in &held {
        cases.push((name, vec![b'a'; 1 << 20]));
    }
    for (name, value) in &cases {
        let shown = String::from_utf8_lossy(&value[..value.len().min(60)]).into_owned();
        let e =
            set_raw(&mut c, name, value).unwrap_or_else(|| panic!("{name} {shown:?} was accepted"));
        assert!(e.contains(name), "{name} {shown:?}: {e}");
        assert!(
            !e.contains('\0') && !e.contains("sslrootcert"),
            "{name}: {e}"
        );
        alive(&env.vk, &mut c, &format!("{name} {shown:?}"));
    }
    for (name, was) in &held {
        assert_eq!(&get(&mut c, name), was, "{name} changed");
    }
    // The refusals say why.
    let e = set_raw(&mut c, "member.token-key-file", b"a\0b").unwrap();
    assert!(e.contains("control character"), "{e}");
    let e = set_raw(&mut c, "member.pg-url", b"host='127.0.0.1\0'").unwrap();
    assert!(e.contains("control character"), "{e}");
    let e = set_raw(&mut c, "member.pg-url", &vec![b'a'; 5000]).unwrap();
    assert!(e.contains("longer than 4096 bytes"), "{e}");
    // A huge password is refused too, though the value without it would fit.
    for name in ["member.pg-url", "member.pg-rebuild-url"] {
        let long_pw = format!("{url} password={}", "p".repeat(1 << 20));
        let e = set_raw(&mut c, name, long_pw.as_bytes()).unwrap();
        assert!(e.contains("longer than 4096 bytes"), "{e}");
        assert!(!e.contains("ppp"), "{e}");
    }
    assert_eq!(&get(&mut c, "member.pg-url"), &held[0].1);
    // And the module still serves.
    ok(&mut c, &["MEMBER.CREATE", "s"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "alice"]), 1);
}

#[test]
fn a_nul_from_a_config_file_or_module_loadex_fails_the_load_cleanly() {
    let db = fresh_db();
    // A config file: the server's parser turns "\x00" inside double quotes into a NUL byte.
    let mut vk = start_with(&db.url(), &[]);
    vk.shutdown(&["NOSAVE"]);
    let dir = scratch("conffile");
    for line in [
        r#"member.pg-url "host='127.0.0.1\x00'""#,
        r#"member.pg-url "postgres://postgres@127.0.0.1/postgres?sslrootcert=a%00b""#,
        r#"member.token-key-file "a\x00b""#,
        r#"member.pg-password-file "a\x00b""#,
    ] {
        let conf = dir.join("member.conf");
        std::fs::write(&conf, format!("{line}\n")).unwrap();
        let before = vk.log().len();
        let status = vk.start_edited_expecting_exit(
            |argv| {
                // The command line's own member.pg-url would override the file's.
                if let Some(at) = argv.iter().position(|a| a == "--member.pg-url") {
                    argv.drain(at..at + 2);
                }
                argv.insert(0, conf.clone().into());
            },
            Duration::from_secs(20),
        );
        let log = vk.log()[before..].to_string();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(1),
            "{line}: the server must refuse to start (exit 1, not a signal)\n{log}"
        );
        assert!(log.contains("control character"), "{line}: {log}");
        assert!(!log.contains("crashed by signal"), "{line}: {log}");
    }
    let _ = std::fs::remove_dir_all(&dir);

    // MODULE LOADEX: an error, the server keeps running, the module is not loaded.
    let vk = Valkey::start_plain_with(&[("enable-module-command", "yes")]);
    let mut c = vk.conn();
    let module = module_path();
    for (name, value) in [
        ("member.pg-url", &b"dbname='ac\0l'"[..]),
        ("member.token-key-file", b"a\0b"),
        ("member.pg-password-file", b"a\0b"),
        ("member.pg-rebuild-url", b"host=h sslrootcert='a\0b'"),
    ] {
        let e = redis::cmd("MODULE")
            .arg("LOADEX")
            .arg(module.to_str().unwrap())
            .arg("CONFIG")
            .arg(name)
            .arg(value)
            .query::<Value>(&mut c)
            .expect_err("a NUL in a LOADEX config");
        assert!(e.to_string().contains("Error loading"), "{name}: {e}");
        let pong: String = redis::cmd("PING").query(&mut c).unwrap();
        assert_eq!(pong, "PONG");
        let unknown = redis::cmd("MEMBER.INFO").arg("x").query::<Value>(&mut c);
        assert!(
            unknown.is_err_and(|e| e.to_string().contains("unknown command")),
            "{name}: the module stayed loaded"
        );
    }
    let log = vk.log();
    assert!(log.contains("control character"), "{log}");
    assert!(!log.contains("crashed by signal"), "{log}");
}

#[test]
fn a_fifo_is_refused_at_once_and_never_blocks_the_server() {
    let env = Env::new();
    let mut c = env.conn();
    // Generous, but far below "until someone opens the FIFO": the old code never answered.
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let dir = scratch("fifo");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let fifo_s = fifo.to_str().unwrap();
    for name in ["member.token-key-file", "member.pg-password-file"] {
        let e = set_raw(&mut c, name, fifo_s.as_bytes())
            .unwrap_or_else(|| panic!("{name}: a FIFO was accepted"));
        assert!(e.contains("a FIFO"), "{name}: {e}");
        alive(&env.vk, &mut c, name);
        assert_eq!(get(&mut c, name), "", "{name} changed");
    }
    // A password file that becomes a FIFO after it was set: each connection attempt says so
    // (db_link_error) instead of blocking a worker forever.
    let pw = dir.join("pw");
    let pw_s = pw.to_str().unwrap().to_string();
    std::fs::write(&pw, "unused-under-trust\n").unwrap();
    ok(&mut c, &["CONFIG", "SET", "member.pg-password-file", &pw_s]);
    std::fs::remove_file(&pw).unwrap();
    mkfifo(&pw);
    reconnect_workers(&mut c, &env.db.url());
    assert!(
        wait_until(Duration::from_secs(30), || {
            let _ = cmd(&mut c, &["MEMBER.CREATE", "probe"]);
            info_field(&mut c, "db_link_error").is_ok_and(|e| e.contains("a FIFO"))
        }),
        "db_link_error: {:?}",
        info_field(&mut c, "db_link_error")
    );
    alive(&env.vk, &mut c, "a FIFO password file");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Makes every worker open a new connection (reading the password file again): the same
/// database under another application name.
fn reconnect_workers(c: &mut Connection, url: &str) {
    ok(
        c,
        &[
            "CONFIG",
            "SET",
            "member.pg-url",
            &format!("{url} application_name=libmember-again"),
        ],
    );
}

/// The server's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib(vk: &Valkey) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", vk.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

#[test]
fn a_device_directory_or_huge_password_file_is_refused_without_reading_it() {
    let env = Env::new();
    let mut c = env.conn();
    let dir = scratch("pwbig");
    let huge = dir.join("huge");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let huge_s = huge.to_str().unwrap().to_string();
    let dir_s = dir.to_str().unwrap().to_string();
    for (name, path, why) in [
        ("member.pg-password-file", "/dev/zero", "a device"),
        ("member.pg-password-file", dir_s.as_str(), "a directory"),
        (
            "member.pg-password-file",
            huge_s.as_str(),
            "larger than 4096 bytes",
        ),
        ("member.token-key-file", "/dev/zero", "a device"),
        ("member.token-key-file", dir_s.as_str(), "a directory"),
        (
            "member.token-key-file",
            huge_s.as_str(),
            "larger than 16384 bytes",
        ),
    ] {
        let e = set_raw(&mut c, name, path.as_bytes())
            .unwrap_or_else(|| panic!("{name} {path} was accepted"));
        assert!(e.contains(why), "{name} {path}: {e}");
        alive(&env.vk, &mut c, path);
    }
    // A good file set, then swapped for the huge one: every connection attempt refuses it
    // (without reading 512 MiB each time), and says why in db_link_error.
    let pw = dir.join("pw");
    let pw_s = pw.to_str().unwrap().to_string();
    std::fs::write(&pw, "unused-under-trust\n").unwrap();
    ok(&mut c, &["CONFIG", "SET", "member.pg-password-file", &pw_s]);
    std::fs::rename(&huge, &pw).unwrap();
    reconnect_workers(&mut c, &env.db.url());
    assert!(
        wait_until(Duration::from_secs(30), || {
            let _ = cmd(&mut c, &["MEMBER.CREATE", "probe"]);
            info_field(&mut c, "db_link_error").is_ok_and(|e| e.contains("larger than 4096"))
        }),
        "db_link_error: {:?}",
        info_field(&mut c, "db_link_error")
    );
    let e = err(&mut c, &["MEMBER.CREATE", "s"]);
    assert!(e.starts_with("UNAVAILABLE"), "{e}");
    alive(&env.vk, &mut c, "a huge password file");
    let peak = peak_rss_kib(&env.vk);
    assert!(
        peak < 256 * 1024,
        "the server's peak RSS is {peak} KiB: the password file was read"
    );
    // Back to a good file: the module serves again.
    std::fs::write(&pw, "unused-under-trust\n").unwrap();
    assert!(wait_until(Duration::from_secs(30), || cmd(
        &mut c,
        &["MEMBER.CREATE", "s"]
    )
    .is_ok()));
    let _ = std::fs::remove_dir_all(&dir);
}
