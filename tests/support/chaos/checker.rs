//! The history checker: verifies a chaos run's operations against the correctness contract
//! (PRODUCT.md), exactly about concurrency: an operation is the interval [start, end].
//!
//! Per item (each item has one writer, so its writes never overlap one another):
//! * a write that was answered took effect somewhere inside its interval; one that failed
//!   (error, lost connection) may or may not take effect, at any time until `settle_us`
//!   after its end (docs/contract.md: a timed-out write may commit later);
//! * **false absent**: EXISTS answered 0 although an ADD was acknowledged before it began and
//!   no DEL may have taken effect since that ADD began;
//! * **false present**: EXISTS answered 1 although the item was never written, or a DEL was
//!   acknowledged before it began and no ADD may have taken effect since that DEL began;
//! * **flip**: one EXISTS answered 1, a later one (begun after the first ended) 0, and no DEL
//!   may have taken effect in between (or 0 then 1 with no ADD): the first answer was the
//!   database's, so the second contradicts the truth as it stood when it began (PRODUCT.md:
//!   "a write that is committed but not yet in the filter can never be answered absent");
//! * **wrong write reply**: ADD answered 1 for a known member or 0 for a known non-member
//!   (DEL likewise);
//! * **hang**: any operation that took longer than the bound (db-timeout plus slack).
//!
//! A read sent to a replica ([`Op::replica`]) answers from a state at most a stated bound old
//! (docs/contract.md, Replicas): a 0 there may miss an ADD acknowledged up to
//! [`Rules::replica_absent_us`] before it began, a 1 a DEL up to [`Rules::replica_present_us`]
//! before. The checker judges such a read as if it had begun that much earlier; every rule
//! above then applies to it unchanged.
//!
//! An INSERT made outside the module ([`Kind::Insert`], into an attached set's table) counts
//! as an ADD acknowledged `outside_us` after its commit: the module learns such a row from the
//! change log, within about one sync interval (docs/attach.md). Until then either answer is
//! right, and answers may differ between nodes (a flip in that window is no violation); from
//! then on the item is a member like any other.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::history::{Kind, Op, Outcome};

/// One broken rule, with the operations that show it.
#[derive(Clone, Debug)]
pub struct Violation {
    pub rule: &'static str,
    pub text: String,
}

/// The checker's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Longest acceptable operation, in µs.
    pub hang_us: u64,
    /// How long after its end a failed write may still take effect, in µs.
    pub settle_us: u64,
    /// How long after its commit an INSERT made outside the module may go unanswered, in µs.
    pub outside_us: u64,
    /// How long before a replica's 0 an acknowledged ADD may be missing from it, in µs: the
    /// staleness bound (`sync-interval-ms` + `db-timeout-ms` + 1 s).
    pub replica_absent_us: u64,
    /// How long before a replica's 1 an acknowledged DEL may be missing from it, in µs: the
    /// set's CACHE-TTL, and the staleness bound.
    pub replica_present_us: u64,
}

/// What a switchover of Valkey changes in the judging of reads, as periods in µs: a 1 asked
/// inside one of `stale_ones` may come from a cache entry a DEL lost with the switchover never
/// dropped (Valkey replicates asynchronously; the new primary's cached 1 stands until its
/// CACHE-TTL, as after a DELETE made outside the module); a replica read begun inside one of
/// `link_down` (a demoted node from its `REPLICAOF` until its link to the new primary is up)
/// gets no window at all: with its link down a replica answers "absent" only from the
/// database (docs/contract.md, Replicas).
#[derive(Clone, Debug, Default)]
pub struct Switchovers {
    pub stale_ones: Vec<(u64, u64)>,
    pub link_down: Vec<(u64, u64)>,
}

fn within(periods: &[(u64, u64)], t: u64) -> bool {
    periods.iter().any(|(a, b)| (*a..*b).contains(&t))
}

/// `op` as the checker judges it: a replica's answer as if asked that much earlier, and so a
/// 1 asked just after a switchover.
fn as_judged(op: &Op, sw: &Switchovers, r: &Rules) -> Op {
    let mut j = op.clone();
    let linked = op.replica && !within(&sw.link_down, op.start);
    let window = match op.outcome.answer() {
        Some(0) if linked => r.replica_absent_us,
        Some(1) if linked || within(&sw.stale_ones, op.start) => r.replica_present_us,
        _ => 0,
    };
    j.start = j.start.saturating_sub(window);
    j
}

/// When the module answers for `w` as done: its end, or for an outside INSERT `outside_us`
/// after it.
fn acked_at(w: &Op, r: &Rules) -> u64 {
    match w.kind {
        Kind::Insert => w.end.saturating_add(r.outside_us),
        _ => w.end,
    }
}

/// The time until which `w` may take effect.
fn effect_end(w: &Op, r: &Rules) -> u64 {
    match w.outcome {
        Outcome::Int(_) => acked_at(w, r),
        Outcome::Failed(_) => acked_at(w, r).saturating_add(r.settle_us),
    }
}

/// True when `w` may have taken effect inside the open interval (from, to).
fn may_act_within(w: &Op, from: u64, to: u64, r: &Rules) -> bool {
    w.start < to && effect_end(w, r) > from
}

/// What the item is at an operation [s, e], as far as the writes tell: `Some(true)` a member,
/// `Some(false)` not one, `None` unknown (a write in flight or unsettled). `skip` is the
/// operation itself when it is a write. Returns the deciding write too.
fn known_state<'a>(
    writes: &[&'a Op],
    s: u64,
    e: u64,
    skip: Option<&Op>,
    r: &Rules,
) -> (Option<bool>, Option<&'a Op>) {
    let others = || {
        writes
            .iter()
            .copied()
            .filter(move |w| skip.is_none_or(|k| !std::ptr::eq(*w, k)))
    };
    let last = others()
        .filter(|w| w.outcome.answer().is_some() && acked_at(w, r) < s)
        .max_by_key(|w| acked_at(w, r));
    // Only a write of the other kind can change what the deciding write left: a failed DEL
    // cannot make a non-member a member, a failed ADD cannot remove one.
    match last {
        None => {
            if others().any(|w| w.kind != Kind::Del && w.start < e) {
                (None, None)
            } else {
                (Some(false), None)
            }
        }
        Some(l) => {
            let adds = |w: &Op| w.kind != Kind::Del;
            let disturbed = others().any(|w| {
                !std::ptr::eq(w, l) && adds(w) != adds(l) && may_act_within(w, l.start, e, r)
            });
            if disturbed {
                (None, Some(l))
            } else {
                (Some(adds(l)), Some(l))
            }
        }
    }
}

/// What the item is at time `t` (after every write, for the final check).
pub fn known_state_at<'a>(writes: &[&'a Op], t: u64, r: &Rules) -> (Option<bool>, Option<&'a Op>) {
    known_state(writes, t, t, None, r)
}

/// Checks the whole history; returns every violation found.
pub fn check(ops: &[Op], r: &Rules) -> Vec<Violation> {
    check_with(ops, &[], &Switchovers::default(), r)
}

/// [`check`], with writes no client made that the per-item rules count too (what a failover
/// of PostgreSQL took back: `faults::taken_back`; they are no client's, so no hang), and what
/// each switchover of Valkey changes in judging reads (`faults::switchovers`).
pub fn check_with(
    ops: &[Op],
    taken_back: &[Op],
    switchovers: &Switchovers,
    r: &Rules,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for op in ops {
        let took = op.end.saturating_sub(op.start);
        if took > r.hang_us {
            out.push(Violation {
                rule: "hang",
                text: format!(
                    "answered after {:.3} s (bound {:.3} s): {}",
                    took as f64 / 1e6,
                    r.hang_us as f64 / 1e6,
                    op.describe()
                ),
            });
        }
    }
    let judged: Vec<Op> = ops.iter().map(|o| as_judged(o, switchovers, r)).collect();
    let mut by_item: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for op in judged.iter().chain(taken_back) {
        by_item.entry((&op.set, &op.item)).or_default().push(op);
    }
    for ops in by_item.values() {
        check_item(ops, r, &mut out);
    }
    out
}

fn check_item(ops: &[&Op], r: &Rules, out: &mut Vec<Violation>) {
    let writes: Vec<&Op> = ops
        .iter()
        .copied()
        .filter(|o| o.kind != Kind::Exists)
        .collect();
    let mut reads: Vec<&Op> = ops
        .iter()
        .copied()
        .filter(|o| o.kind == Kind::Exists && o.outcome.answer().is_some())
        .collect();
    // Answers against the writes.
    for rd in &reads {
        let a = rd.outcome.answer().unwrap();
        let (state, by) = known_state(&writes, rd.start, rd.end, None, r);
        let (rule, why) = match (state, a) {
            (Some(true), 0) if by.is_some_and(|w| w.kind == Kind::Insert) => (
                "false absent",
                "an outside INSERT was due before it began, no DEL since",
            ),
            (Some(true), 0) => (
                "false absent",
                "acknowledged ADD before it began, no DEL since",
            ),
            (Some(false), 1) if by.is_none() => ("false present", "the item was never written"),
            (Some(false), 1) => (
                "false present",
                "acknowledged DEL before it began, no ADD since",
            ),
            _ => continue,
        };
        let mut text = format!("{}: {why}", rd.describe());
        if let Some(w) = by {
            let _ = write!(text, "\n      decided by {}", w.describe());
        }
        out.push(Violation { rule, text });
    }
    // Write replies against the state before them (an outside INSERT has no reply).
    for w in &writes {
        let Some(a) = w.outcome.answer().filter(|_| w.kind != Kind::Insert) else {
            continue;
        };
        let (Some(member), by) = known_state(&writes, w.start, w.end, Some(w), r) else {
            continue;
        };
        let want = match w.kind {
            Kind::Add => !member as i64,
            _ => member as i64,
        };
        if a != want {
            let mut text = format!(
                "{}: the item was {}a member",
                w.describe(),
                if member { "" } else { "not " }
            );
            if let Some(b) = by {
                let _ = write!(text, "\n      decided by {}", b.describe());
            }
            out.push(Violation {
                rule: "wrong write reply",
                text,
            });
        }
    }
    // Flips: for each read, the latest-beginning earlier read with the other answer.
    reads.sort_by_key(|o| o.end);
    let mut by_start: Vec<&Op> = reads.clone();
    by_start.sort_by_key(|o| o.start);
    let mut i = 0;
    let mut latest: [Option<&Op>; 2] = [None, None];
    for r2 in by_start {
        while i < reads.len() && reads[i].end < r2.start {
            let a = reads[i].outcome.answer().unwrap().clamp(0, 1) as usize;
            if latest[a].is_none_or(|p| p.start < reads[i].start) {
                latest[a] = Some(reads[i]);
            }
            i += 1;
        }
        let a2 = r2.outcome.answer().unwrap().clamp(0, 1) as usize;
        let Some(r1) = latest[1 - a2] else { continue };
        let explain = if a2 == 0 { Kind::Del } else { Kind::Add };
        // Nodes learn an outside INSERT at different moments: either answer, either order,
        // until it is due.
        let explained = writes.iter().any(|w| {
            (w.kind == explain || w.kind == Kind::Insert) && may_act_within(w, r1.start, r2.end, r)
        });
        if !explained {
            out.push(Violation {
                rule: "flip",
                text: format!(
                    "{}\n      after {}\n      and no {} of the item in between",
                    r2.describe(),
                    r1.describe(),
                    explain.command()
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: Kind, start: u64, end: u64, outcome: Outcome) -> Op {
        Op {
            client: 0,
            kind,
            set: "s".into(),
            item: "x".into(),
            port: 0,
            replica: false,
            start,
            end,
            outcome,
        }
    }
    const R: Rules = Rules {
        hang_us: 1000,
        settle_us: 500,
        outside_us: 300,
        replica_absent_us: 100,
        replica_present_us: 200,
    };
    use Kind::*;
    use Outcome::*;

    fn rules(ops: &[Op]) -> Vec<&'static str> {
        check(ops, &R).into_iter().map(|v| v.rule).collect()
    }

    #[test]
    fn catches_each_rule_and_allows_overlaps() {
        assert_eq!(
            rules(&[op(Add, 0, 10, Int(1)), op(Exists, 20, 30, Int(0))]),
            ["false absent"]
        );
        assert!(rules(&[op(Add, 0, 10, Int(1)), op(Exists, 5, 30, Int(0))]).is_empty());
        assert_eq!(rules(&[op(Exists, 20, 30, Int(1))]), ["false present"]);
        assert_eq!(
            rules(&[
                op(Add, 0, 10, Int(1)),
                op(Del, 12, 15, Int(1)),
                op(Exists, 20, 30, Int(1))
            ]),
            ["false present"]
        );
        // A failed ADD may land later: unknown until it settles.
        assert!(rules(&[
            op(Add, 0, 10, Failed("UNAVAILABLE".into())),
            op(Del, 100, 110, Int(0)),
            op(Exists, 200, 210, Int(1)),
        ])
        .is_empty());
        assert_eq!(
            rules(&[
                op(Add, 0, 10, Failed("UNAVAILABLE".into())),
                op(Del, 600, 610, Int(1)),
                op(Exists, 700, 710, Int(1)),
            ]),
            ["false present"]
        );
        // A failed DEL cannot make the item a member.
        assert_eq!(
            rules(&[
                op(Del, 0, 10, Failed("conn".into())),
                op(Exists, 20, 30, Int(1))
            ]),
            ["false present"]
        );
        // A flip during an ADD in flight.
        assert_eq!(
            rules(&[
                op(Add, 0, 100, Int(1)),
                op(Exists, 10, 20, Int(1)),
                op(Exists, 30, 40, Int(0)),
            ]),
            ["flip"]
        );
        assert!(rules(&[
            op(Add, 0, 100, Int(1)),
            op(Exists, 10, 20, Int(0)),
            op(Exists, 30, 40, Int(1)),
        ])
        .is_empty());
        assert_eq!(rules(&[op(Add, 0, 2000, Int(1))]), ["hang"]);
        // An outside INSERT: either answer until outside_us after its commit, then a member.
        assert!(rules(&[
            op(Insert, 0, 10, Int(1)),
            op(Exists, 20, 30, Int(1)),
            op(Exists, 40, 50, Int(0)),
            op(Exists, 60, 70, Int(1)),
        ])
        .is_empty());
        assert_eq!(
            rules(&[op(Insert, 0, 10, Int(1)), op(Exists, 320, 330, Int(0))]),
            ["false absent"]
        );
        assert_eq!(
            rules(&[
                op(Insert, 0, 10, Int(1)),
                op(Exists, 320, 330, Int(1)),
                op(Exists, 340, 350, Int(0))
            ]),
            ["false absent", "flip"]
        );
        assert_eq!(
            rules(&[op(Exists, 0, 5, Int(1)), op(Insert, 10, 20, Int(1))]),
            ["false present"]
        );
        assert_eq!(
            rules(&[op(Add, 0, 10, Int(1)), op(Add, 20, 30, Int(1))]),
            ["wrong write reply"]
        );
    }

    fn on_replica(mut o: Op) -> Op {
        o.replica = true;
        o
    }

    #[test]
    fn a_replica_answers_within_its_window_and_never_past_it() {
        // A 0 on the replica within the staleness bound after the ADD, and a flip from the
        // primary's 1 to the replica's 0 in it, are the stated window.
        assert!(rules(&[
            op(Add, 0, 10, Int(1)),
            op(Exists, 20, 30, Int(1)),
            on_replica(op(Exists, 50, 60, Int(0))),
        ])
        .is_empty());
        // Past the bound the same 0 is a false absent (and a flip).
        assert_eq!(
            rules(&[
                op(Add, 0, 10, Int(1)),
                on_replica(op(Exists, 120, 130, Int(0)))
            ]),
            ["false absent"]
        );
        // A 1 after a DEL: within CACHE-TTL on the replica, never past it, never for an item
        // nobody wrote.
        let del = [op(Add, 0, 10, Int(1)), op(Del, 20, 30, Int(1))];
        assert!(rules(&[
            del[0].clone(),
            del[1].clone(),
            on_replica(op(Exists, 150, 160, Int(1)))
        ])
        .is_empty());
        assert_eq!(
            rules(&[
                del[0].clone(),
                del[1].clone(),
                on_replica(op(Exists, 240, 250, Int(1)))
            ]),
            ["false present"]
        );
        assert_eq!(
            rules(&[on_replica(op(Exists, 500, 510, Int(1)))]),
            ["false present"]
        );
        // With its link down (a demoted node before its sync) a replica has no window.
        let down = Switchovers {
            link_down: vec![(40, 100)],
            ..Switchovers::default()
        };
        let judged = |ops: &[Op]| -> Vec<&'static str> {
            check_with(ops, &[], &down, &R)
                .into_iter()
                .map(|v| v.rule)
                .collect()
        };
        assert_eq!(
            judged(&[
                op(Add, 0, 10, Int(1)),
                on_replica(op(Exists, 50, 60, Int(0)))
            ]),
            ["false absent"]
        );
        assert!(judged(&[
            op(Add, 0, 10, Int(1)),
            on_replica(op(Exists, 30, 35, Int(0)))
        ])
        .is_empty());
        // After a switchover a cached 1 may outlive a DEL lost with it, on any node.
        let stale = Switchovers {
            stale_ones: vec![(0, 300)],
            ..Switchovers::default()
        };
        assert!(check_with(
            &[del[0].clone(), del[1].clone(), op(Exists, 150, 160, Int(1))],
            &[],
            &stale,
            &R
        )
        .is_empty());
    }
}
