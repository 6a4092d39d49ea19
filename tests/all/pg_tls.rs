//! The secured database link against a real PostgreSQL with `ssl=on` (one per test file):
//! sslmode require / verify-ca / verify-full, a password that is never shown, and
//! member.pg-password-file with rotation.
use crate::support;

use std::time::Duration;

use redis::{Connection, Value};
use support::member::*;
use support::tls::{self, PASSWORD, PW_ROLE};
use support::{start_with, wait_until, Valkey};

/// Held by the tests that log in as `PW_ROLE` with its password: one of them changes that
/// password for a while, which fails the other's logins if they overlap.
static PW_ROLE_PASSWORD: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pw_role_password() -> std::sync::MutexGuard<'static, ()> {
    PW_ROLE_PASSWORD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh database of the TLS cluster.
fn db() -> String {
    tls::pg().create_db()
}

fn kv(host: &str, user: &str, db: &str, rest: &str) -> String {
    let port = tls::pg().port();
    format!("host={host} port={port} user={user} dbname={db} {rest}")
}

/// Sessions of the module in `db`, each as (ssl, tls version).
fn module_sessions(db: &str) -> Vec<(bool, Option<String>)> {
    let mut admin = tls::pg().client("postgres");
    admin
        .query(
            "SELECT s.ssl, s.version FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.application_name = 'libmember' AND a.datname = $1",
            &[&db],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// CREATE, ADD and a lookup that goes to the database.
fn serves(c: &mut Connection, set: &str) {
    ok(c, &["MEMBER.CREATE", set]);
    assert_eq!(int(c, &["MEMBER.ADD", set, "alice"]), 1);
    assert_eq!(explain(c, set, "alice"), (1, "db-hit".into()));
    assert_eq!(int(c, &["MEMBER.EXISTS", set, "alice"]), 1);
}

/// A Valkey whose module reaches `db` through `url`, once it answered (catalog loaded). The
/// timeout is generous: a refused session fails at once, and a TLS handshake on a busy
/// machine can take seconds.
fn loaded(url: &str) -> Valkey {
    start_loaded(url, &[("member.db-timeout-ms", "10000")])
}

#[test]
fn require_encrypts_every_module_session() {
    let d = db();
    let vk = loaded(&kv("127.0.0.1", "postgres", &d, "sslmode=require"));
    let mut c = vk.conn();
    serves(&mut c, "s");
    let sessions = module_sessions(&d);
    assert!(!sessions.is_empty());
    assert!(
        sessions.iter().all(|(ssl, v)| *ssl && v.is_some()),
        "{sessions:?}"
    );
    assert_eq!(info_field(&mut c, "db_link_error").as_deref(), Ok("none"));
}

#[test]
fn disable_stays_plain() {
    let d = db();
    let vk = loaded(&kv("127.0.0.1", "postgres", &d, "sslmode=disable"));
    let mut c = vk.conn();
    serves(&mut c, "s");
    let sessions = module_sessions(&d);
    assert!(sessions.iter().all(|(ssl, _)| !*ssl), "{sessions:?}");
}

#[test]
fn verify_full_with_the_right_ca_and_host() {
    let d = db();
    let ca = tls::ca();
    // By name (DNS SAN), in URL form...
    let port = tls::pg().port();
    let url =
        format!("postgres://postgres@localhost:{port}/{d}?sslmode=verify-full&sslrootcert={ca}");
    let vk = loaded(&url);
    let mut c = vk.conn();
    serves(&mut c, "s");
    assert!(module_sessions(&d).iter().all(|(ssl, _)| *ssl));
    // ...and by address (IP SAN), in key=value form.
    let by_ip = kv(
        "127.0.0.1",
        "postgres",
        &d,
        &format!("sslmode=verify-full sslrootcert={ca}"),
    );
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &by_ip]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "bob"]), 1);
    assert_eq!(explain(&mut c, "s", "bob"), (1, "db-hit".into()));
}

/// Waits until a lookup that needs the database fails, and returns its error.
fn unavailable_error(c: &mut Connection, set: &str, item: &str) -> String {
    let mut last = String::new();
    let failed = wait_until(Duration::from_secs(20), || {
        match cmd(c, &["MEMBER.EXPLAIN", set, item]) {
            Ok(v) => {
                // Only a correct answer may come (a session opened before the change).
                assert!(format!("{v:?}").contains("db-hit"), "{v:?}");
                false
            }
            Err(e) => {
                last = format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""));
                true
            }
        }
    });
    assert!(failed, "the lookup never failed");
    last
}

#[test]
fn verify_full_refuses_a_wrong_ca_or_host_and_never_answers() {
    let d = db();
    let ca = tls::ca();
    let vk = loaded(&kv(
        "localhost",
        "postgres",
        &d,
        &format!("sslmode=verify-full sslrootcert={ca}"),
    ));
    let mut c = vk.conn();
    serves(&mut c, "s");
    for item in ["x", "y"] {
        assert_eq!(int(&mut c, &["MEMBER.ADD", "s", item]), 1);
    }

    let wrong_ca = kv(
        "localhost",
        "postgres",
        &d,
        &format!("sslmode=verify-full sslrootcert={}", tls::wrong_ca()),
    );
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &wrong_ca]);
    let e = unavailable_error(&mut c, "s", "x");
    assert!(e.starts_with("UNAVAILABLE"), "{e}");
    assert!(e.contains("certificate verify failed"), "{e}");
    assert!(e.contains("sslmode=verify-full"), "{e}");
    let info = info_field(&mut c, "db_link_error").unwrap();
    assert!(info.contains("certificate verify failed"), "{info}");

    // The certificate names localhost and 127.0.0.1, not this name (hostaddr connects to the
    // right server all the same).
    let wrong_host = format!("host=db.invalid hostaddr=127.0.0.1 port={} user=postgres dbname={d} sslmode=verify-full sslrootcert={ca}", tls::pg().port());
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &wrong_host]);
    let e = unavailable_error(&mut c, "s", "y");
    assert!(e.starts_with("UNAVAILABLE"), "{e}");
    assert!(e.to_lowercase().contains("hostname mismatch"), "{e}");
    // verify-ca checks the chain only: the same host then works.
    let ca_only = wrong_host.replace("verify-full", "verify-ca");
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &ca_only]);
    assert!(wait_until(Duration::from_secs(20), || cmd(
        &mut c,
        &["MEMBER.EXISTS", "s", "y"]
    )
    .is_ok()));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "y"]), 1);
    assert_eq!(info_field(&mut c, "db_link_error").as_deref(), Ok("none"));
}

/// Every place a password could show: CONFIG GET, INFO, MEMBER.INFO, SLOWLOG, the log file.
fn assert_nowhere(vk: &Valkey, c: &mut Connection, secret: &str) {
    let get: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.*")
        .query(c)
        .unwrap();
    let info: String = redis::cmd("INFO").arg("everything").query(c).unwrap();
    let set: Vec<String> = redis::cmd("MEMBER.INFO")
        .arg("s")
        .query(c)
        .unwrap_or_else(|e| panic!("MEMBER.INFO s: {e}"));
    let slowlog = format!("{:?}", cmd(c, &["SLOWLOG", "GET", "1000"]).unwrap());
    for (place, text) in [
        ("CONFIG GET", get.join(" ")),
        ("INFO", info),
        ("MEMBER.INFO", set.join(" ")),
        ("SLOWLOG", slowlog),
        ("log", vk.log()),
    ] {
        assert!(
            !text.contains(secret),
            "{place} shows the password:\n{text}"
        );
    }
}

#[test]
fn the_password_is_never_shown() {
    let _role = pw_role_password();
    let d = db();
    let url = kv(
        "127.0.0.1",
        PW_ROLE,
        &d,
        &format!("password='{PASSWORD}' sslmode=require"),
    );
    // A generous database timeout: TLS and SCRAM on a machine shared with the other tests.
    let vk = start_loaded(
        &url,
        &[
            ("slowlog-log-slower-than", "0"),
            ("member.db-timeout-ms", "10000"),
        ],
    );
    let mut c = vk.conn();
    serves(&mut c, "s");
    let shown: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.pg-url")
        .query(&mut c)
        .unwrap();
    assert_eq!(
        shown[1],
        kv("127.0.0.1", PW_ROLE, &d, "password=*** sslmode=require")
    );

    // The URL form, set at run time: CONFIG SET's argument is redacted from SLOWLOG by the server.
    let port = tls::pg().port();
    let as_url = format!("postgres://{PW_ROLE}:{PASSWORD}@127.0.0.1:{port}/{d}?sslmode=require");
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &as_url]);
    let shown: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.pg-url")
        .query(&mut c)
        .unwrap();
    assert_eq!(
        shown[1],
        format!("postgres://{PW_ROLE}:***@127.0.0.1:{port}/{d}?sslmode=require")
    );
    // What CONFIG GET showed, set back, keeps the real password.
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &shown[1]]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "carol"]), 1);
    assert_eq!(explain(&mut c, "s", "carol"), (1, "db-hit".into()));
    assert_nowhere(&vk, &mut c, PASSWORD);

    // A wrong password: a clear UNAVAILABLE, without the password, and never an answer.
    assert_eq!(int(&mut c, &["MEMBER.ADD", "s", "dave"]), 1);
    let wrong = "Wrong-pw-4417-never-shown";
    let bad = kv(
        "127.0.0.1",
        PW_ROLE,
        &d,
        &format!("password={wrong} sslmode=require"),
    );
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &bad]);
    let e = unavailable_error(&mut c, "s", "dave");
    assert!(e.starts_with("UNAVAILABLE"), "{e}");
    assert!(e.contains("password authentication failed"), "{e}");
    let add = err(&mut c, &["MEMBER.ADD", "s", "erin"]);
    assert!(add.starts_with("UNAVAILABLE"), "{add}");
    let info = info_field(&mut c, "db_link_error").unwrap();
    assert!(info.contains("password authentication failed"), "{info}");
    for secret in [PASSWORD, wrong] {
        assert!(!e.contains(secret) && !add.contains(secret));
        assert_nowhere(&vk, &mut c, secret);
    }
}

#[test]
fn password_file_is_read_at_each_connection() {
    let _role = pw_role_password();
    let d = db();
    let dir = std::env::temp_dir().join(format!("member-pw-{}-{d}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pgpass");
    let file_s = file.to_string_lossy().into_owned();
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    // The password comes from the file only; the URL shows none.
    let url = kv("127.0.0.1", PW_ROLE, &d, "sslmode=require");
    // A generous timeout: each session here opens TLS and SCRAM anew, which a busy machine
    // can stretch past the default; a file that cannot be read fails at once whatever it is.
    let vk = start_loaded(
        &url,
        &[
            ("member.pg-password-file", &file_s),
            ("member.db-timeout-ms", "10000"),
        ],
    );
    let mut c = vk.conn();
    serves(&mut c, "s");
    let shown: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("member.pg-password-file")
        .query(&mut c)
        .unwrap();
    assert_eq!(shown[1], file_s);

    // Rotation: the role's password changes, then the file; the next connections use it.
    let rotated = "Rotated-pw-8812-never-shown";
    let mut admin = tls::pg().client("postgres");
    let _restore = RestorePassword;
    admin
        .batch_execute(&format!("ALTER ROLE {PW_ROLE} PASSWORD '{rotated}'"))
        .unwrap();
    std::fs::write(&file, format!("{rotated}\n")).unwrap();
    let kick = |admin: &mut postgres::Client| {
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'libmember' AND datname = $1",
                &[&d],
            )
            .unwrap();
    };
    kick(&mut admin);
    assert_eq!(add_after_kick(&mut c, "s", "bob"), 1);
    assert_eq!(explain(&mut c, "s", "bob"), (1, "db-hit".into()));

    // An unreadable file: a clear error, no answer.
    assert_eq!(add_after_kick(&mut c, "s", "carol"), 1);
    std::fs::remove_file(&file).unwrap();
    kick(&mut admin);
    let e = unavailable_error(&mut c, "s", "carol");
    assert!(e.contains("cannot read member.pg-password-file"), "{e}");
    assert!(e.contains(&file_s), "{e}");
    std::fs::write(&file, rotated).unwrap();
    assert!(wait_until(Duration::from_secs(20), || cmd(
        &mut c,
        &["MEMBER.EXISTS", "s", "carol"]
    )
    .is_ok()));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "carol"]), 1);
    for secret in [PASSWORD, rotated] {
        assert_nowhere(&vk, &mut c, secret);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Gives `PW_ROLE` its usual password back however the test ends, so that a failure here
/// does not turn into login failures in the next test that uses the role.
struct RestorePassword;

impl Drop for RestorePassword {
    fn drop(&mut self) {
        let _ = tls::pg()
            .client("postgres")
            .batch_execute(&format!("ALTER ROLE {PW_ROLE} PASSWORD '{PASSWORD}'"));
    }
}

/// MEMBER.ADD right after the module's sessions were terminated. A pooled session that was
/// killed while idle answers its next statement with the termination (the statement never
/// ran, and a write is not retried by the module: UNAVAILABLE, the write contract); each
/// worker meets that once, so the call is repeated until a live session takes it. Over TLS
/// the session may also meet it as the socket closed before the termination notice was read
/// (`connection closed`, seen once in a clean-clone run): the same dead session.
fn add_after_kick(c: &mut Connection, set: &str, item: &str) -> i64 {
    for _ in 0..20 {
        match cmd(c, &["MEMBER.ADD", set, item]) {
            Ok(Value::Int(n)) => return n,
            Err(e)
                if e.to_string().contains("terminating connection")
                    || e.to_string().contains("connection closed") =>
            {
                continue
            }
            other => panic!("MEMBER.ADD {set} {item}: {other:?}"),
        }
    }
    panic!("MEMBER.ADD {set} {item}: every attempt met a terminated session");
}

/// The masked text (as CONFIG REWRITE would write it) with no real password behind it: the
/// module says so instead of sending `***`.
#[test]
fn a_masked_password_alone_is_refused_clearly() {
    let d = db();
    let masked = kv("127.0.0.1", PW_ROLE, &d, "password=*** sslmode=require");
    let vk = start_with(&masked, &[("member.db-timeout-ms", "500")]);
    let mut c = vk.conn();
    assert!(wait_until(Duration::from_secs(20), || {
        info_field(&mut c, "db_link_error").is_ok_and(|e| e.contains("masked password"))
    }));
    let e = err(&mut c, &["MEMBER.CREATE", "s"]);
    assert!(
        e.starts_with("UNAVAILABLE") && e.contains("member.pg-password-file"),
        "{e}"
    );
}

/// `sslrootcert` naming a FIFO, a device or a huge file: each connection attempt fails with
/// the reason, at once, without reading it (a FIFO blocked the worker that opened it forever,
/// `/dev/zero` was read without end); the right CA file then serves again.
#[test]
fn an_sslrootcert_that_is_not_a_small_regular_file_is_refused_unread() {
    let d = db();
    let ca = tls::ca();
    let vk = loaded(&kv(
        "localhost",
        "postgres",
        &d,
        &format!("sslmode=verify-full sslrootcert={ca}"),
    ));
    let mut c = vk.conn();
    serves(&mut c, "s");
    let dir = std::env::temp_dir().join(format!("member-rootcert-{}-{d}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let cpath = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let huge = dir.join("huge.pem");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    for (file, why) in [
        (fifo.to_str().unwrap(), "it is a FIFO"),
        ("/dev/zero", "it is a device"),
        (huge.to_str().unwrap(), "larger than 1048576 bytes"),
    ] {
        let url = kv(
            "localhost",
            "postgres",
            &d,
            &format!("sslmode=verify-full sslrootcert={file}"),
        );
        ok(&mut c, &["CONFIG", "SET", "member.pg-url", &url]);
        let mut last = info_field(&mut c, "db_link_error");
        let said = wait_until(Duration::from_secs(30), || {
            let _ = cmd(&mut c, &["MEMBER.EXPLAIN", "s", "alice"]);
            last = info_field(&mut c, "db_link_error");
            last.as_deref().is_ok_and(|e| e.contains(why))
        });
        assert!(said, "{file}: db_link_error {last:?}");
        let pong: String = redis::cmd("PING").query(&mut c).unwrap();
        assert_eq!(pong, "PONG");
    }
    let good = kv(
        "localhost",
        "postgres",
        &d,
        &format!("sslmode=verify-full sslrootcert={ca}"),
    );
    ok(&mut c, &["CONFIG", "SET", "member.pg-url", &good]);
    assert!(wait_until(Duration::from_secs(30), || cmd(
        &mut c,
        &["MEMBER.EXISTS", "s", "alice"]
    )
    .is_ok()));
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "s", "alice"]), 1);
    let log = vk.log();
    assert!(
        !log.contains("panicked") && !log.contains("crashed by signal"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
