//! ROTATE-KEY in a cluster outlives the primary driving it (docs/security.md, "In a cluster"):
//! the primary holding the slot of the set's name is killed with SIGKILL while it copies, its
//! replica takes over and carries the rotation on, and a manual `CLUSTER FAILOVER` hands the
//! slots back while every node computes the new form. The cluster history load (writers,
//! readers, batch clients, through routers that follow the cluster's changes) runs all along,
//! and the checker finds no false 0 and no false 1 in the history or the final state.
use crate::chaos_harness as chaos;
use crate::support;

use std::thread;
use std::time::{Duration, Instant};

use chaos::cluster_load;
use chaos::history::Recorder;
use support::cluster::Cluster;
use support::member::*;
use support::wait_until;

use super::cluster_reshard::{
    enough_operations, event, failover_cluster, finish, load_config, seeds, SET_OPTIONS,
};
use super::key_ring::run_id;
use super::key_rotation_cluster::{hold_the_drain, load_ring_everywhere, release_the_drain};
use super::tokenize::{KeyFile, KEY1, KEY2};
use crate::support::rotation::hold_rotation;

/// How long a promotion, a rotation's phase or its end may take before the test gives up.
const WAIT: Duration = Duration::from_secs(120);

/// Every live node says `field` of `set` is `want`.
fn every_live_node_says(cl: &Cluster, set: &str, field: &str, want: &str) -> bool {
    cl.nodes
        .iter()
        .filter(|n| !n.down)
        .all(|n| set_info(&mut n.conn(), set, field).as_deref() == Ok(want))
}

/// Whether `member_nodes` holds a report of the run `node`.
fn reported(pg: &mut postgres::Client, node: &str) -> bool {
    pg.query_opt("SELECT 1 FROM member_nodes WHERE node = $1", &[&node])
        .unwrap()
        .is_some()
}

/// Held in its copy (a session holds the set's rotation lock: no step runs, whatever the
/// machine's speed), the driving primary is killed and its replica promoted; the killed node
/// comes back as a replica with the ring loaded again. The copy is let go with the drain held
/// by a lagging node's report, so the rotation stops with every node computing the new form;
/// there the old primary takes its slots back by `CLUSTER FAILOVER`, and the drain runs to
/// the end under it.
#[test]
fn a_rotation_goes_on_after_its_primary_is_killed_and_failed_over() {
    let began = Instant::now();
    let mut guard = failover_cluster();
    let cl: &mut Cluster = &mut guard;
    cl.wait_healthy(Duration::from_secs(30), true)
        .expect("cluster healthy before the rotation");
    cl.refresh_roles();
    let ring = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    load_ring_everywhere(cl, &ring);
    let set = format!("rot_fo_{}", std::process::id());
    let mut options = SET_OPTIONS.to_vec();
    options.extend(["TOKENIZE", "hmac-sha256"]);
    cl.create_everywhere_with(&set, &options);
    cl.wait_ready(&set);
    let driver = cl.set_owner(&set).port();
    let heir = cl.replica_of(cl.node_by_port(driver)).port();
    let mut cfg = load_config(cl.slots_of(cl.node_by_port(driver)), None);
    cfg.chain_keys = vec![KEY1.to_string(), KEY2.to_string()];
    // Half the reshard tests' pace: the final check asks for every item written, and a
    // tokenized member's lookup, forwarded to its token's slot owner, costs a bus round trip
    // and a query.
    cfg.pause_ms *= 2;
    let rec = Recorder::new();
    let mut problems = Vec::new();
    let seeds = seeds(cl);
    let mut holder = cl.db().client();
    // The final check reads each item's token in SQL (`member_catalog_token`).
    holder
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        .unwrap();
    hold_rotation(&mut holder, &set);
    cluster_load::run(&cfg, &set, &seeds, &rec, || {
        thread::sleep(Duration::from_secs(2));
        // Refused while a node heard from in the last 30 s lacks k2: a node another test
        // killed leaves its report that long.
        let start = rec.now();
        let mut refusal = String::new();
        let rotating = wait_until(Duration::from_secs(60), || {
            match cmd(
                &mut cl.node_by_port(driver).conn(),
                &["MEMBER.ALTER", &set, "ROTATE-KEY", "k2"],
            ) {
                Ok(redis::Value::Okay) => true,
                other => {
                    refusal = format!("{other:?}");
                    false
                }
            }
        });
        assert!(rotating, "ROTATE-KEY refused: {refusal}");
        event(
            &rec,
            start,
            "rotate-key",
            format!("on :{driver}, held in its copy"),
        );
        thread::sleep(Duration::from_secs(2));

        let start = rec.now();
        let killed = run_id(&mut cl.node_by_port(driver).conn());
        cl.kill9(driver);
        event(&rec, start, "kill -9", format!("driving primary :{driver}"));
        let start = rec.now();
        let promoted =
            wait_until(WAIT, || cl.is_primary_now(heir)) && cl.wait_healthy(WAIT, false).is_ok();
        event(
            &rec,
            start,
            "promotion",
            format!(":{heir} primary: {promoted}"),
        );
        if !promoted {
            problems.push(format!(":{heir} was not promoted after :{driver} died"));
        }
        let start = rec.now();
        cl.restart(driver);
        ok(
            &mut cl.node_by_port(driver).conn(),
            &["CONFIG", "SET", "member.token-key-file", ring.path()],
        );
        cl.refresh_roles();
        event(&rec, start, "restart", format!(":{driver}, ring loaded"));
        // Its first report replaces the killed run's (one cluster node id): the rotation's
        // waits do not count the dead run for the 30 s its report would stay fresh.
        let restarted = run_id(&mut cl.node_by_port(driver).conn());
        let mut pg = cl.db().client();
        let first = wait_until(WAIT, || reported(&mut pg, &restarted));
        if !first || reported(&mut pg, &killed) {
            problems.push(format!(
                "the restarted node's report (made: {first}) did not replace the killed run's"
            ));
        }

        // The copy goes on under the new primary, up to the drain.
        hold_the_drain(cl, &set);
        holder
            .execute("SELECT pg_advisory_unlock_all()", &[])
            .unwrap();
        let start = rec.now();
        let switched = wait_until(WAIT, || {
            every_live_node_says(cl, &set, "token_rotation_form", "new")
        });
        event(&rec, start, "switched", format!("every node: {switched}"));
        if !switched {
            problems.push("the nodes never switched to the new form".into());
        }

        // The old primary takes its slots back; the drain runs under it. It came back as a
        // primary of no slots, and becomes a replica once it hears of the promotion: the
        // manual failover waits for that and for its link (a primary, or a replica without
        // its link, refuses it).
        let start = rec.now();
        let demoted =
            wait_until(WAIT, || !cl.is_primary_now(driver)) && cl.wait_healthy(WAIT, true).is_ok();
        let mut asked = Err(String::from("not asked"));
        let took = demoted
            && wait_until(WAIT, || {
                asked = redis::cmd("CLUSTER")
                    .arg("FAILOVER")
                    .query::<String>(&mut cl.node_by_port(driver).conn())
                    .map_err(|e| e.to_string());
                asked.is_ok()
            })
            && wait_until(WAIT, || cl.is_primary_now(driver))
            && cl.wait_healthy(WAIT, false).is_ok();
        event(&rec, start, "manual failover", format!(":{driver}: {took}"));
        if !took {
            problems.push(format!(
                "CLUSTER FAILOVER on :{driver} (a linked replica: {demoted}): {asked:?}"
            ));
        }
        cl.refresh_roles();
        release_the_drain(cl);
        let start = rec.now();
        let ended = wait_until(Duration::from_secs(240), || {
            every_live_node_says(cl, &set, "token_rotation", "none")
                && every_live_node_says(cl, &set, "token_key_id", "default>k2")
        });
        event(&rec, start, "rotation end", format!("every node: {ended}"));
        if !ended {
            problems.push("the rotation never ended".into());
        }
        thread::sleep(Duration::from_secs(3));
        enough_operations(&rec);
    });
    cl.refresh_roles();
    if let Err(e) = cl.wait_healthy(Duration::from_secs(30), true) {
        problems.push(format!("the cluster did not heal after the failovers: {e}"));
    }
    finish(
        "key_rotation_failover",
        cl,
        &set,
        &cfg,
        &rec,
        began,
        problems,
    );
    cl.drop_everywhere(&set);
}
