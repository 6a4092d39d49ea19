//! Happy paths of every command, against a real valkey-server and PostgreSQL.
mod support;

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
