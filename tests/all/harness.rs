//! Self-test of the test harness (tests/support): no module involved.
use crate::support;

use support::{fresh_db, OwnPg, Valkey};

#[test]
fn pg_database_answers_select_1() {
    let db = fresh_db();
    assert!(db.url().contains(&format!("dbname={}", db.name)));
    let one: i32 = db.client().query_one("SELECT 1", &[]).unwrap().get(0);
    assert_eq!(one, 1);
    let v = Valkey::start_plain();
    let pong: String = redis::cmd("PING").query(&mut v.conn()).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn valkey_answers_ping_and_databases_are_separate() {
    let a = fresh_db();
    let b = fresh_db();
    assert_ne!(a.name, b.name);
    a.client()
        .batch_execute("CREATE TABLE only_in_a (x int)")
        .unwrap();
    let n: i64 = b
        .client()
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    let v = Valkey::start_plain();
    let mut con = v.conn();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    assert!(
        v.log().contains("Ready to accept connections"),
        "{}",
        v.log()
    );
}

#[test]
fn own_pg_stops_and_restarts_on_the_same_port() {
    let mut pg = OwnPg::start_new();
    let port = pg.port();
    let mut c = pg.client();
    c.batch_execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)")
        .unwrap();
    pg.stop();
    assert!(
        c.query_one("SELECT 1", &[]).is_err(),
        "old session must be gone"
    );
    assert!(postgres::Client::connect(&pg.url(), postgres::NoTls).is_err());
    pg.start();
    assert_eq!(pg.port(), port);
    let x: i32 = pg
        .client()
        .query_one("SELECT x FROM kept", &[])
        .unwrap()
        .get(0);
    assert_eq!(x, 7);
}
