//! The connection string parser (`conninfo::ConnInfo`, both libpq forms): `member.pg-url` as
//! an operator types it. Beyond never panicking: a masked string holds no password (it parses
//! back with `***` in its place), and dropping the TLS keys keeps the rest readable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use member::config::conninfo::{ConnInfo, MASK, TLS_KEYS};

fuzz_target!(|text: &str| {
    let Ok(c) = ConnInfo::parse(text) else {
        return;
    };
    let _ = c.tls();
    let masked = c.masked();
    let m = ConnInfo::parse(&masked).expect("a masked string parses");
    match c.password() {
        Some(_) => assert_eq!(m.password(), Some(MASK), "masked {masked:?}"),
        None => assert_eq!(m.password(), None),
    }
    let plain = c.without(&TLS_KEYS);
    let p = ConnInfo::parse(&plain).expect("a string without the TLS keys parses");
    for k in TLS_KEYS {
        assert_eq!(p.get(k), None, "{k} left in {plain:?}");
    }
    for k in ["host", "port", "user", "dbname"] {
        assert_eq!(p.get(k), c.get(k), "{k} changed in {plain:?}");
    }
});
