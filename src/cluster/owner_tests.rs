//! Unit tests of `owner.rs`: slot sentinel names, and how an atomic slot migration's steps
//! change what this node trusts.

use super::*;

#[test]
fn sentinel_names_sit_in_their_slot_and_are_recognised() {
    for slot in [0u16, 1, 5460, 16383] {
        let n = sentinel_name(slot);
        assert_eq!(crate::model::slot::keyslot(n.as_bytes()), slot);
        assert!(is_sentinel_name(n.as_bytes()));
    }
    assert!(!is_sentinel_name(b"member:{}:owner"));
    assert!(!is_sentinel_name(b"member:s:bloom"));
    assert!(!is_sentinel_name(b"member:{a b}:owner"));
}

/// This thread's view as a poll that showed `slots` owned, accepted at `at`, would leave it.
fn owning(slots: &[u16], at: Instant) {
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        *o = Own::default();
        o.primary = true;
        for &s in slots {
            o.owned[s as usize] = true;
            o.accepted[s as usize] = Some(at);
            o.owned_set.insert(s);
        }
        o.owned_count = slots.len();
        o.unsettled = false;
    });
}

#[test]
fn an_exported_slot_is_served_but_never_trusted_until_its_job_ends() {
    let at = Instant::now();
    let later = Some(at + Duration::from_secs(1));
    owning(&[5, 6, 7], at);
    assert!(ready(6, later) && holds(6));
    slot_migration(Step::ExportStarted, &[(5, 6)]);
    assert!(
        !ready(5, later) && !ready(6, later),
        "no filter negative while exported"
    );
    assert!(
        holds(6),
        "the source keeps taking writes: no ASK under atomic migration"
    );
    let entity = (0..)
        .map(|i| format!("e{i}"))
        .find(|e| crate::model::slot::keyslot(e.as_bytes()) == 6)
        .unwrap();
    assert!(
        !may_cache(&entity),
        "no cache entry read or written while exported"
    );
    assert!(ready(7, later), "a slot outside the job is untouched");
    assert_eq!(exporting_count(), 2);
    // Called off: back, but only after a new acceptance (the next poll) and its grace.
    slot_migration(Step::ExportAborted, &[(5, 6)]);
    assert_eq!(exporting_count(), 0);
    assert!(!ready(6, later) && !holds(6));
    assert!(owns(6), "an aborted export leaves the slot here");
}

#[test]
fn a_completed_export_gives_the_slots_away_before_the_next_poll() {
    let at = Instant::now();
    owning(&[5, 6, 7], at);
    slot_migration(Step::ExportStarted, &[(5, 6)]);
    slot_migration(Step::ExportCompleted, &[(5, 6)]);
    for s in [5, 6] {
        assert!(!owns(s) && !holds(s), "slot {s}");
        assert!(!owned_set().contains(s), "slot {s}");
    }
    assert!(owns(7) && holds(7));
    assert_eq!(exporting_count(), 0);
    assert_eq!(summary(None).0, 1);
}

#[test]
fn every_import_step_makes_a_slot_wait_for_a_new_acceptance() {
    for step in [
        Step::ImportStarted,
        Step::ImportAborted,
        Step::ImportCompleted,
    ] {
        let at = Instant::now();
        owning(&[9], at);
        slot_migration(step, &[(9, 9)]);
        assert!(!holds(9), "{step:?}");
        assert!(!ready(9, Some(at + Duration::from_secs(1))), "{step:?}");
    }
}
