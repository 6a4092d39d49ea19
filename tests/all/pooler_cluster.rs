//! A cluster behind pgbouncer in transaction pooling (docs/pooler.md): three primaries, each
//! node's workers and sync loop on pooled connections, serve every command, batches split
//! among the owners of their items included, and follow an outside INSERT.
use crate::support;

use std::time::Duration;

use support::cluster::Cluster;
use support::pgbouncer::{Mode, Pgbouncer};
use support::{fresh_db, wait_until};

fn exists(c: &mut impl redis::ConnectionLike, item: &str) -> i64 {
    redis::cmd("MEMBER.EXISTS")
        .arg("s")
        .arg(item)
        .query(c)
        .unwrap_or_else(|e| panic!("EXISTS {item}: {e}"))
}

fn many(c: &mut impl redis::ConnectionLike, cmd: &str, items: &[String]) -> Vec<i64> {
    redis::cmd(cmd)
        .arg("s")
        .arg("ITEMS")
        .arg(items)
        .query(c)
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

#[test]
fn a_cluster_behind_a_transaction_pooler_serves_every_command() {
    let db = fresh_db();
    let pb = Pgbouncer::get(Mode::Transaction);
    let cl = Cluster::start_primaries_on(&pb.url(&db.name), &[("member.sync-interval-ms", "200")]);
    cl.create_everywhere("s");
    cl.wait_ready("s");
    let mut c = cl.client();
    let logs = || format!("pgbouncer:\n{}", pb.log());

    // ADDs spread over the three owners by their slots, then each asked, present and absent.
    let added: Vec<String> = (0..90).map(|i| format!("user-{i}")).collect();
    for item in &added {
        let n: i64 = redis::cmd("MEMBER.ADD")
            .arg("s")
            .arg(item)
            .query(&mut c)
            .unwrap_or_else(|e| panic!("ADD {item}: {e}\n{}", logs()));
        assert_eq!(n, 1, "ADD {item}");
    }
    for item in &added {
        assert_eq!(exists(&mut c, item), 1, "{item}");
        assert_eq!(
            exists(&mut c, &format!("absent-{item}")),
            0,
            "absent-{item}"
        );
    }

    // Batches, sent to the set's node, split among the owners and answered in order.
    let mut owner = cl.set_owner("s").conn();
    let fresh: Vec<String> = (0..60).map(|i| format!("batch-{i}")).collect();
    assert_eq!(many(&mut owner, "MEMBER.MADD", &fresh), vec![1; 60]);
    let mixed: Vec<String> = added[..30]
        .iter()
        .cloned()
        .chain((0..30).map(|i| format!("never-{i}")))
        .chain(fresh[..30].iter().cloned())
        .collect();
    let want: Vec<i64> = [vec![1; 30], vec![0; 30], vec![1; 30]].concat();
    assert_eq!(many(&mut owner, "MEMBER.MEXISTS", &mixed), want);

    // An outside INSERT reaches every owner's filter through its pooled sync loop.
    let mut pg = db.client();
    for i in 0..30 {
        pg.execute(
            "INSERT INTO member_s (entity_id) VALUES ($1)",
            &[&format!("outside-{i}")],
        )
        .unwrap();
    }
    for i in 0..30 {
        let item = format!("outside-{i}");
        assert!(
            wait_until(Duration::from_secs(10), || exists(&mut c, &item) == 1),
            "{item}, inserted outside, never answered 1\n{}",
            logs()
        );
    }

    let removed: i64 = redis::cmd("MEMBER.DEL")
        .arg("s")
        .arg("user-7")
        .query(&mut c)
        .unwrap();
    assert_eq!(removed, 1);
    assert_eq!(exists(&mut c, "user-7"), 0);
}
