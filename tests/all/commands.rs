//! Happy paths of every command, against a real valkey-server and PostgreSQL.
use crate::support;

use support::member::*;

#[test]
fn create_add_exists_del_roundtrip() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "users"]);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "users", "alice"]), 0);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "users", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "users", "alice"]), 0);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "users", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "users", "bob"]), 0);
    let mut pg = env.pg();
    let n: i64 = pg
        .query_one(
            "SELECT count(*) FROM member_users WHERE entity_id = 'alice' AND scope = '' AND status = 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    assert_eq!(int(&mut c, &["MEMBER.DEL", "users", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.DEL", "users", "alice"]), 0);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "users", "alice"]), 0);
    let n: i64 = pg
        .query_one("SELECT count(*) FROM member_users", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

/// The item is declared as a routing key (NOT_KEY), not as a key: users whose key patterns
/// exclude it, or who may touch no key at all, still use every per-item command.
#[test]
fn item_is_not_an_acl_key() {
    let env = Env::new();
    let mut admin = env.conn();
    ok(&mut admin, &["MEMBER.CREATE", "users"]);
    ok(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "keyed",
            "on",
            "nopass",
            "~member:*",
            "+@all",
        ],
    );
    ok(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "keyless",
            "on",
            "nopass",
            "resetkeys",
            // Only the set's own ACL name (issue 9's per-set check): no pattern matches the
            // items, which must not need one.
            "~member:users",
            "+@all",
        ],
    );
    for user in ["keyed", "keyless"] {
        let mut c = env.conn();
        ok(&mut c, &["AUTH", user, "any"]);
        let item = format!("{user}_item");
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "users", &item]), 0, "{user}");
        assert_eq!(int(&mut c, &["MEMBER.ADD", "users", &item]), 1, "{user}");
        assert_eq!(int(&mut c, &["MEMBER.EXISTS", "users", &item]), 1, "{user}");
        assert_eq!(explain(&mut c, "users", &item).0, 1, "{user}");
        assert_eq!(int(&mut c, &["MEMBER.DEL", "users", &item]), 1, "{user}");
        // The ACL is in force: a real key named like the item is refused.
        let e = err(&mut c, &["GET", &item]);
        assert!(e.starts_with("NOPERM"), "{user}: GET -> {e}");
    }
}

/// A CREATE without options takes the module's defaults (docs/configuration.md), read when
/// the set is created: `member.default-capacity`, `member.default-error-rate`,
/// `member.cache-ttl`, `member.recent-ttl`.
#[test]
fn create_takes_the_configured_defaults() {
    let env = Env::new();
    let mut c = env.conn();
    for (name, value) in [
        ("member.default-capacity", "5000"),
        ("member.default-error-rate", "0.02"),
        ("member.cache-ttl", "77"),
        ("member.recent-ttl", "9"),
    ] {
        ok(&mut c, &["CONFIG", "SET", name, value]);
    }
    ok(&mut c, &["MEMBER.CREATE", "d"]);
    for (field, want) in [
        ("capacity", "5000"),
        ("error_rate", "0.02"),
        ("cache_ttl", "77"),
        ("recent_ttl", "9"),
        ("filter_capacity", "5000"),
    ] {
        assert_eq!(set_info(&mut c, "d", field).as_deref(), Ok(want), "{field}");
    }
    // Given options win over the defaults.
    ok(
        &mut c,
        &["MEMBER.CREATE", "e", "CAPACITY", "700", "CACHE-TTL", "5"],
    );
    assert_eq!(set_info(&mut c, "e", "capacity").as_deref(), Ok("700"));
    assert_eq!(set_info(&mut c, "e", "cache_ttl").as_deref(), Ok("5"));
    assert_eq!(set_info(&mut c, "e", "recent_ttl").as_deref(), Ok("9"));
}

/// MEMBER.INFO is a map: under RESP3 a map reply, under RESP2 the same fields as one flat
/// field, value … array, in the same order.
#[test]
fn info_is_a_map_under_resp3_and_a_flat_array_under_resp2() {
    let env = Env::new();
    let mut c = env.conn();
    ok(&mut c, &["MEMBER.CREATE", "shape"]);
    let flat: Vec<String> = redis::cmd("MEMBER.INFO")
        .arg("shape")
        .query(&mut c)
        .unwrap();
    assert_eq!(flat[..2], ["name".to_string(), "shape".to_string()]);

    let _: redis::Value = redis::cmd("HELLO").arg(3).query(&mut c).unwrap();
    let v: redis::Value = redis::cmd("MEMBER.INFO")
        .arg("shape")
        .query(&mut c)
        .unwrap();
    let redis::Value::Map(fields) = v else {
        panic!("MEMBER.INFO under RESP3 is not a map: {v:?}");
    };
    let text = |v: &redis::Value| match v {
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("{other:?}"),
    };
    let pairs: Vec<String> = fields
        .iter()
        .flat_map(|(k, v)| [text(k), text(v)])
        .collect();
    assert_eq!(pairs.len(), flat.len());
    // The same fields in the same order (values that move, such as counters, aside).
    let names = |v: &[String]| v.iter().step_by(2).cloned().collect::<Vec<_>>();
    assert_eq!(names(&pairs), names(&flat));
    assert_eq!(pairs[1], "shape");
}
