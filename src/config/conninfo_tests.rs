//! Unit tests of conninfo.rs: masking, dropping the TLS keys, and libpq's sslmode rules,
//! each checked against what the driver itself reads from the same text.

use std::str::FromStr;

use super::*;

fn driver(text: &str) -> postgres::Config {
    postgres::Config::from_str(text).unwrap()
}

#[test]
fn masks_the_url_password_and_keeps_the_rest() {
    let c = ConnInfo::parse("postgres://app:s%40cret@db.example:5433/members?application_name=x")
        .unwrap();
    assert_eq!(c.password(), Some("s@cret"));
    assert_eq!(driver(&c.text).get_password(), Some(&b"s@cret"[..]));
    let m = c.masked();
    assert_eq!(
        m,
        "postgres://app:***@db.example:5433/members?application_name=x"
    );
    assert_eq!(driver(&m).get_password(), Some(MASK.as_bytes()));
    assert_eq!(driver(&m).get_dbname(), Some("members"));
}

#[test]
fn masks_a_password_given_as_url_parameter() {
    let c =
        ConnInfo::parse("postgresql://app@h/db?password=top&sslmode=require&password=two").unwrap();
    assert_eq!(c.password(), Some("two"));
    assert_eq!(
        c.masked(),
        "postgresql://app@h/db?password=***&sslmode=require&password=***"
    );
}

#[test]
fn masks_quoted_and_escaped_key_value_passwords() {
    for (text, pw) in [
        ("host=h password=plain user=u", "plain"),
        ("host=h password = 'with space\\'s' user=u", "with space's"),
        ("host=h password=back\\ slash user=u", "back slash"),
        ("password=''  host=h", ""),
        ("host=h  password=\u{e9}t\u{e9} user=u", "\u{e9}t\u{e9}"),
    ] {
        let c = ConnInfo::parse(text).unwrap();
        assert_eq!(c.password(), Some(pw), "{text}");
        assert_eq!(driver(text).get_password(), Some(pw.as_bytes()), "{text}");
        let m = c.masked();
        assert!(!pw.is_empty() && !m.contains(pw) || pw.is_empty(), "{m}");
        assert_eq!(driver(&m).get_password(), Some(MASK.as_bytes()), "{m}");
        assert_eq!(driver(&m).get_user(), driver(text).get_user(), "{m}");
    }
}

/// Found by the `conninfo` fuzz target (input `password=''\0=\x01`): a quoted password
/// followed by the next key without a space was masked as a bare `***`, which then ran into
/// that key: the masked text, set back (or written by CONFIG REWRITE), meant another
/// password and lost the key.
#[test]
fn a_masked_password_never_swallows_the_next_key() {
    for text in ["password=''k=v", "host=h password='s3cret'user=u dbname=d"] {
        let c = ConnInfo::parse(text).unwrap();
        let m = c.masked();
        assert!(!m.contains("s3cret"), "{m}");
        let again = ConnInfo::parse(&m).unwrap();
        assert_eq!(again.password(), Some(MASK), "{m}");
        for k in ["host", "user", "dbname", "k"] {
            assert_eq!(again.get(k), c.get(k), "{k} in {m}");
        }
    }
    let m = ConnInfo::parse("host=h password='s3cret'user=u")
        .unwrap()
        .masked();
    assert_eq!(m, "host=h password='***'user=u");
    assert_eq!(driver(&m).get_password(), Some(MASK.as_bytes()));
    assert_eq!(driver(&m).get_user(), Some("u"));
}

#[test]
fn no_password_means_nothing_masked() {
    let t = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";
    let c = ConnInfo::parse(t).unwrap();
    assert_eq!(c.password(), None);
    assert_eq!(c.masked(), t);
    let u = "postgres://app@h:1/db";
    assert_eq!(ConnInfo::parse(u).unwrap().masked(), u);
}

/// A NUL (or any control character) in a connection string, as written, inside quotes, after
/// a backslash or percent-encoded anywhere in a URL, is refused: it would abort the server
/// where the text becomes a C string (CONFIG GET, INFO, the TLS library) or reach the driver.
#[test]
fn control_characters_are_refused_in_every_form() {
    for bad in [
        "dbname='ac\0l'",
        "host='127.0.0.1\0'",
        "host=h sslrootcert='a\0b'",
        "host=h sslrootcert=a\\\0b",
        "host=h\0",
        "host=h\tuser=u",
        "host=h user=u\n",
        "host=h password='p\x1bw'",
        "postgres://u@h/db?sslrootcert=a%00b",
        "postgres://u@h/db?sslrootcert=a\0b",
        "postgres://u:p%00w@h/db",
        "postgres://u@h%00/db",
        "postgres://u@h/d%0ab",
        "postgres://u@h/db?application_name=%7f",
        "postgres://u@h/db?a%00=b",
    ] {
        assert_eq!(ConnInfo::parse(bad).unwrap_err(), CONTROL, "{bad:?}");
    }
    // No length limit here (it is the config's): a masked text a little longer than the
    // value that was set is read again at every connection.
    let near = format!("host=h password=a dbname={}", "d".repeat(4070));
    let masked = ConnInfo::parse(&near).unwrap().masked();
    assert!(masked.len() > near.len());
    assert_eq!(ConnInfo::parse(&masked).unwrap().password(), Some(MASK));
    // Printable text, percent-encoded or not, is still read.
    let ok = ConnInfo::parse("postgres://u@h/db?sslrootcert=%2Fa%20b").unwrap();
    assert_eq!(ok.get("sslrootcert"), Some("/a b"));
}

#[test]
fn errors_never_quote_the_text() {
    for bad in [
        "host=h password='unterminated",
        "host=h password",
        "host=h password=",
        "postgres://u:p@h/db?novalue",
        "postgres://u:%ff%fe@h/db",
    ] {
        let e = ConnInfo::parse(bad).unwrap_err();
        assert!(!e.contains("unterminated'") && !e.contains("novalue") && !e.contains("%ff"));
    }
}

#[test]
fn drops_tls_keys_in_both_forms() {
    let c = ConnInfo::parse(
        "host=h sslmode=verify-full user=u sslrootcert='/etc/ca dir/ca.pem' password=x",
    )
    .unwrap();
    assert_eq!(c.without(&TLS_KEYS), "host=h user=u password=x");
    driver(&c.without(&TLS_KEYS));
    let u = ConnInfo::parse(
        "postgres://u:p@h/db?sslmode=verify-ca&sslrootcert=%2Ftmp%2Fca.pem&application_name=a",
    )
    .unwrap();
    assert_eq!(u.get("sslrootcert"), Some("/tmp/ca.pem"));
    assert_eq!(
        u.without(&TLS_KEYS),
        "postgres://u:p@h/db?application_name=a"
    );
    let only = ConnInfo::parse("postgres://u@h/db?sslmode=require").unwrap();
    assert_eq!(only.without(&TLS_KEYS), "postgres://u@h/db");
    driver(&only.without(&TLS_KEYS));
}

/// Found by the `conninfo` fuzz target: white space in front of a key=value string whose
/// first key looks like a URL scheme kept it a key=value string, but dropping the TLS keys
/// (and the white space) turned it into a URL with another meaning.
#[test]
fn dropping_tls_keys_keeps_the_form() {
    for text in [" postgres://=?x", "sslmode=require postgresql://=a host=h"] {
        let c = ConnInfo::parse(text).unwrap();
        let out = c.without(&TLS_KEYS);
        let again = ConnInfo::parse(&out).unwrap();
        assert_eq!(again.get("postgres://"), c.get("postgres://"), "{out:?}");
        assert_eq!(
            again.get("postgresql://"),
            c.get("postgresql://"),
            "{out:?}"
        );
        assert_eq!(again.get("sslmode"), None);
    }
}

#[test]
fn sslmode_follows_libpq() {
    let tls = |t: &str| ConnInfo::parse(t).unwrap().tls();
    let mode = |t: &str| tls(t).unwrap().mode;
    assert_eq!(mode("host=h"), SslMode::Prefer);
    assert_eq!(mode("host=h sslmode=disable"), SslMode::Disable);
    assert_eq!(mode("host=h sslmode=prefer"), SslMode::Prefer);
    assert_eq!(mode("host=h sslmode=require"), SslMode::Require);
    // libpq: require with a root certificate verifies the chain.
    assert_eq!(
        mode("host=h sslmode=require sslrootcert=/ca.pem"),
        SslMode::VerifyCa
    );
    assert_eq!(
        mode("host=h sslmode=verify-ca sslrootcert=/ca.pem"),
        SslMode::VerifyCa
    );
    let full = tls("postgres://h/db?sslmode=verify-full&sslrootcert=system").unwrap();
    assert_eq!(full.mode, SslMode::VerifyFull);
    assert_eq!(full.root_cert.as_deref(), Some("system"));
    assert!(tls("host=h sslmode=verify-full").is_err());
    assert!(tls("host=h sslmode=allow").is_err());
    assert!(tls("host=h sslmode=bogus").is_err());
}
