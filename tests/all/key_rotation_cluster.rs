//! ROTATE-KEY in a cluster (docs/security.md, "In a cluster"): a twin's token hashes to another
//! slot than its old form's, so the two rows of a pair belong to two primaries. Every node
//! switches once every node's filter covers the rotation's end, and a write's twin effects
//! reach the owner of the twin's slot before the write is acknowledged: lookups on every node,
//! by EXISTS and MEXISTS, answer right all through, while MEMBER.ADD, MADD, DEL and an outside
//! writer keep writing.
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::cluster::{Cluster, Node};
use support::member::*;
use support::wait_until;

use super::cluster_slots::move_slot;
use super::key_rotation_cluster_load::{
    check_round, mexists, now_of, rotation_log, write_until, Acked, Conns, Reads, StopOnDrop, BULK,
    SET,
};
use super::tokenize::{KeyFile, KEY1, KEY2};
use crate::support::rotation::{report_lagging_node, LAGGING};

#[test]
fn a_set_rotated_online_in_a_cluster_answers_right_throughout() {
    // The cluster kept for tests that change what every node holds: one at a time.
    let held = Cluster::shared_exclusive();
    rotate_under_load(&held, false, |_| {});
}

/// A slot holding twins (a member's, which the reader asks for all along) moves to another
/// primary and back while every node computes the new form (the drain held by a lagging
/// node's report): the slot's new owner fills it from the table, twins included. A write whose
/// twin lies in it meanwhile may be refused (`TRYAGAIN`, `UNAVAILABLE`), never acknowledged
/// half made.
#[test]
fn a_slot_of_twins_moved_during_a_rotation_in_a_cluster_answers_right_throughout() {
    let held = Cluster::shared_exclusive();
    rotate_under_load(&held, true, |cl| {
        let (slot, src, dst) = twin_slot_once_switched(cl);
        move_slot(cl, slot, src, dst);
        std::thread::sleep(Duration::from_secs(2));
        move_slot(cl, slot, dst, src);
        release_the_drain(cl);
    });
}

/// Loads `ring` (`default` and `k2`) on every node, and waits until each node's report names
/// k2 (a report's ring may be copied: `report_lagging_node`).
pub(crate) fn load_ring_everywhere(cl: &Cluster, ring: &KeyFile) {
    let mut pg = cl.db().client();
    for n in cl.nodes.iter().filter(|n| !n.down) {
        let mut c = n.conn();
        ok(
            &mut c,
            &["CONFIG", "SET", "member.token-key-file", ring.path()],
        );
        let id = super::key_ring::run_id(&mut c);
        assert!(
            wait_until(Duration::from_secs(30), || {
                pg.query_opt(
                    "SELECT 1 FROM member_nodes WHERE node = $1 AND ',' || ring LIKE '%,k2:%'",
                    &[&id],
                )
                .unwrap()
                .is_some()
            }),
            "node :{} never reported k2 in its ring",
            n.port()
        );
    }
}

/// A lagging node's report (`report_lagging_node`) whose filter covers the end: every node
/// switches to the new form, and the drain waits until [`release_the_drain`].
pub(crate) fn hold_the_drain(cl: &Cluster, set: &str) {
    let mut pg = cl.db().client();
    report_lagging_node(&mut pg, set);
    pg.execute(
        "UPDATE member_nodes SET covered = $2 || ':2' WHERE node = $1",
        &[&LAGGING, &set],
    )
    .unwrap();
}

/// The lagging node's report goes: the drain starts.
pub(crate) fn release_the_drain(cl: &Cluster) {
    cl.db()
        .client()
        .execute("DELETE FROM member_nodes WHERE node = $1", &[&LAGGING])
        .unwrap();
}

/// Once every node computes the new form: the slot of a member's twin (`card-0`, which the
/// reader asks for all along), its owner, and another primary.
pub(crate) fn twin_slot_once_switched(cl: &Cluster) -> (u16, &Node, &Node) {
    {
        let mut pg = cl.db().client();
        let switched = wait_until(Duration::from_secs(60), || {
            cl.nodes.iter().all(|n| {
                set_info(&mut n.conn(), SET, "token_rotation_form").as_deref() == Ok("new")
            })
        });
        assert!(switched, "the nodes never switched\n{}", rotation_log(cl));
        let twin: String = pg
            .query_one(
                "SELECT member_catalog_token('rot_cl', 'card-0', '', $1, $2)",
                &[&KEY1, &KEY2],
            )
            .unwrap()
            .get(0);
        let slot = cl.keyslot(&twin);
        let src = cl.owner(slot);
        let dst = cl.primaries().find(|n| n.port() != src.port()).unwrap();
        (slot, src, dst)
    }
}

/// Rotates `SET` on `cl` while a reader checks every answer and a writer writes; `during` runs
/// after the ALTER. With `hold`, a second node's report follows the rotation but never the
/// new form, which holds the drain until `during` deletes it.
pub(crate) fn rotate_under_load(cl: &Cluster, hold: bool, during: impl FnOnce(&Cluster)) {
    let ring = KeyFile::new(&format!("default {KEY1}\nk2 {KEY2}\n"));
    load_ring_everywhere(cl, &ring);
    // A run that failed before its end leaves the set rotated: it starts again from nothing.
    if cmd(&mut cl.set_owner(SET).conn(), &["MEMBER.INFO", SET]).is_ok() {
        cl.drop_everywhere(SET);
    }
    let mut pg = cl.db().client();
    cl.create_everywhere_with(SET, &["TOKENIZE", "hmac-sha256"]);
    cl.wait_ready(SET);
    pg.batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        .unwrap();
    pg.execute(
        "INSERT INTO member_rot_cl (entity_id)
         SELECT member_catalog_token('rot_cl', 'bulk-' || i, '', $1)
           FROM generate_series(1, $2::int8) i",
        &[&KEY1, &BULK],
    )
    .unwrap();
    let mut conns = Conns::new(cl);
    let kept: Vec<String> = (0..60).map(|i| format!("card-{i}")).collect();
    let gone: Vec<String> = (0..20).map(|i| format!("gone-{i}")).collect();
    for i in kept.iter().chain(&gone) {
        assert_eq!(int(conns.to(cl, i), &["MEMBER.ADD", SET, i]), 1, "{i}");
    }
    for i in &gone {
        assert_eq!(int(conns.to(cl, i), &["MEMBER.DEL", SET, i]), 1, "{i}");
    }
    let present: Vec<String> = kept
        .iter()
        .cloned()
        .chain((1..=BULK).step_by(31).map(|i| format!("bulk-{i}")))
        .collect();
    let absent: Vec<String> = gone
        .iter()
        .cloned()
        .chain((0..40).map(|i| format!("never-{i}")))
        .collect();
    let idle = Mutex::new(Acked::default());
    let mut settling = Reads::default();
    let mut round =
        |conns: &mut Conns| check_round(cl, conns, (&present, &absent), (&idle, &mut settling));
    assert!(
        wait_until(Duration::from_secs(60), || round(&mut conns).is_empty()),
        "before the rotation: {:?}",
        round(&mut conns)
    );

    let acked = Arc::new(Mutex::new(Acked::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let (rounds, wrong, reads, written) = std::thread::scope(|s| {
        // Whatever fails below, the reader and the writer stop (the scope waits for them).
        let _stop = StopOnDrop(&stop);
        let reader = s.spawn(|| {
            let mut conns = Conns::new(cl);
            let (mut rounds, mut wrong, mut reads) = (0, Vec::new(), Reads::default());
            while !stop.load(Ordering::Acquire) {
                let checked = (&*acked, &mut reads);
                wrong.extend(check_round(cl, &mut conns, (&present, &absent), checked));
                rounds += 1;
            }
            (rounds, wrong, reads)
        });
        let writer = s.spawn(|| write_until(cl, &stop, &acked));
        if hold {
            hold_the_drain(cl, SET);
        }
        // Refused while a node heard from in the last 30 s lacks the key: a node of this cluster
        // another test restarted leaves its old report (an old run id) that long.
        let mut refusal = None;
        let started = wait_until(Duration::from_secs(60), || {
            match cmd(
                &mut cl.set_owner(SET).conn(),
                &["MEMBER.ALTER", SET, "ROTATE-KEY", "k2"],
            ) {
                Ok(redis::Value::Okay) => true,
                other => {
                    refusal = Some(format!("{other:?}"));
                    false
                }
            }
        });
        assert!(started, "ROTATE-KEY refused: {refusal:?}");
        during(cl);
        // The end: every node says no rotation, and the chain names both keys.
        let ended = wait_until(Duration::from_secs(240), || {
            cl.nodes.iter().all(|n| {
                let mut c = n.conn();
                set_info(&mut c, SET, "token_rotation").as_deref() == Ok("none")
                    && set_info(&mut c, SET, "token_key_id").as_deref() == Ok("default>k2")
            })
        });
        // A few more rounds after the end.
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Release);
        let (rounds, wrong, reads) = reader.join().expect("the reader");
        let written = writer.join().expect("the writer");
        assert!(
            ended,
            "the rotation never ended: {:?}",
            cl.nodes
                .iter()
                .map(|n| {
                    let mut c = n.conn();
                    (
                        n.port(),
                        set_info(&mut c, SET, "token_rotation"),
                        set_info(&mut c, SET, "token_rotation_waiting_for"),
                        set_info(&mut c, SET, "token_rotation_last_error"),
                    )
                })
                .collect::<Vec<_>>()
        );
        (rounds, wrong, reads, written)
    });
    assert!(rounds > 3, "the reader ran {rounds} rounds");
    assert!(
        wrong.is_empty(),
        "{} wrong answers in {rounds} rounds: {:?}\nnow: {:?}\n{}",
        wrong.len(),
        &wrong[..wrong.len().min(30)],
        now_of(cl, &mut conns, &mut pg, &wrong),
        rotation_log(cl)
    );
    // A refusal is no wrong answer, but a reader refused often checked little.
    assert!(
        reads.refused * 20 <= reads.calls,
        "{} of the reader's {} calls were refused",
        reads.refused,
        reads.calls
    );
    assert!(
        written.errors.is_empty(),
        "writes failed: {:?}",
        written.errors
    );
    assert!(
        written.refused * 20 <= written.calls,
        "{} of {} writes refused",
        written.refused,
        written.calls
    );
    // Outside rows answer 1 within a sync interval; and nothing of the old form is left.
    let outside: Vec<String> = acked.lock().unwrap().outside.iter().cloned().collect();
    assert!(
        !outside.is_empty(),
        "no outside row committed: {} tried in {} writer calls; refused: {:?}",
        written.outside_tried,
        written.calls,
        written.outside_refused
    );
    assert!(
        wait_until(Duration::from_secs(30), || mexists(
            conns.0.get_mut(&cl.set_owner(SET).port()).unwrap(),
            &outside
        )
        .is_ok_and(|g| g.iter().all(|&x| x == 1))),
        "outside rows never all answered 1"
    );
    let old_forms: i64 = pg
        .query_one(
            "SELECT count(*) FROM member_rot_cl WHERE entity_id NOT LIKE '2:%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(old_forms, 0, "rows of the old form left");
    cl.drop_everywhere(SET);
}
