//! What a finished sync pass does, on the main thread: each set's rows go into its filter,
//! whose watermark moves to the pass's horizon when the pass covered everything it lacked
//! (`catch_up`); trust, blindness and the loop's counters follow.

use std::collections::BTreeSet;
use std::time::Instant;

use redis_module::Context;

use super::{Member, LOOP};
use crate::db::sql::{self, Changes};
use crate::db::DbErr;
use crate::filter::origin::{NodeDb, Verdict};
use crate::filter::value::FilterValue;
use crate::model::slotset::SlotSet;
use crate::{filter::store, server::reply, sets::state};

/// How a pass left one filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    /// Covers everything below the pass's horizon now; the value's identity when it is
    /// complete (for the set to trust it, whatever its history: loaded, moved back, copied).
    CaughtUp(Option<u64>),
    /// A filter swapped in meanwhile covers less than the pass read from: its watermark
    /// stays, the next pass reads from it.
    Kept,
    /// Rows it needs may have been pruned from the log: now incomplete (it gets rebuilt).
    /// Reported once, when a complete filter turns incomplete.
    Pruned,
    /// Its table does not feed the change log: not trusted, incomplete (rebuilt, which
    /// retries installing the triggers).
    Blind,
    /// Built from another set's rows (restored or copied across sets), from another
    /// database, or of unknown origin (an older payload): incomplete for this set, never
    /// trusted (rebuilt).
    Foreign,
    /// This node does not know its database yet: its rows are added, its watermark stays,
    /// and it is not trusted; a later pass judges it again.
    Unverified,
}

/// The per-set step of a pass: adds `hashes` (its set's rows logged since `from`, the
/// watermark the filter had when the pass started) and advances the watermark to `horizon`,
/// if the pass covered everything the filter lacks. `floor` is the log's prune floor.
/// `(node, set_id)`: this node's database and the set's catalog row, which a value must
/// have been made from to be caught up (`FilterValue::verdict`); a transaction id means
/// nothing in another database, even one of the same cluster.
#[allow(clippy::too_many_arguments)]
pub fn catch_up(
    set: &str,
    f: &mut FilterValue,
    hashes: &[u128],
    from: i64,
    horizon: i64,
    floor: i64,
    blind: bool,
    (node, set_id): (NodeDb, Option<i64>),
) -> CatchUp {
    for h in hashes {
        f.add(*h);
    }
    match f.verdict(set, node, set_id) {
        Verdict::Here => {}
        Verdict::Foreign => {
            f.cov.complete = false;
            return CatchUp::Foreign;
        }
        Verdict::Unverified => return CatchUp::Unverified,
    }
    let Some(covered) = f.cov.watermark else {
        return CatchUp::Kept;
    };
    // The pass read everything from `from`: that covers this filter only if it did not need
    // anything older (a rebuild may have swapped in a newer one, never mind an older one).
    if covered < from {
        return CatchUp::Kept;
    }
    if blind || covered < floor {
        let was_complete = std::mem::replace(&mut f.cov.complete, false);
        return match (blind, was_complete) {
            (true, _) => CatchUp::Blind,
            (false, true) => CatchUp::Pruned,
            // Already waiting for its rebuild: said once.
            (false, false) => CatchUp::Kept,
        };
    }
    f.cov.watermark = Some(covered.max(horizon));
    CatchUp::CaughtUp(f.cov.complete.then_some(f.id))
}

pub(super) fn apply(
    ctx: &Context,
    (started, epoch, generation): (Instant, u64, u64),
    members: Vec<Member>,
    read: Option<&SlotSet>,
    res: Result<Changes, DbErr>,
) {
    // A change of the database's history is answered before anything of this pass applies
    // (docs/failover.md); a pass read in another generation than the node's now moves no
    // watermark, and the next one reads on the history the node follows.
    crate::upkeep::history::react(ctx);
    let res = match res {
        Ok(_) if generation != crate::db::identity::generation() => Err(DbErr::Unavailable(
            "the database's history changed during the sync pass; it is made again".into(),
        )),
        res => res,
    };
    let again = LOOP.with(|l| {
        let mut l = l.borrow_mut();
        l.in_flight = false;
        std::mem::take(&mut l.again)
    });
    if again {
        // Promoted while the pass ran: the next sweep starts one in the new epoch.
        LOOP.with(|l| l.borrow_mut().next = None);
    }
    let mut ch = match res {
        Ok(ch) => ch,
        Err(e) => {
            let text = e.reply_text();
            state::with(|r| {
                for m in &members {
                    if let Some(s) = r.sets.get_mut(&m.name) {
                        s.sync.last_error = Some(text.clone());
                    }
                }
            });
            return;
        }
    };
    let blind_tables: BTreeSet<&str> = ch.blind.iter().map(String::as_str).collect();
    let mut rows = 0u64;
    let mut newly_blind = Vec::new();
    for m in &members {
        // Its rows went into its filter page by page (`page.rs`) while the pass ran.
        let paged = super::page::take(&m.name);
        let blind = blind_tables.contains(sql::table(&m.name).as_str());
        // A polled set covers up to its own poll's time; the log's horizon and floor are not
        // its business.
        let (horizon, floor, blind) = match ch.time_horizons.get(&m.name) {
            Some(&h) => (h, 0, false),
            None if m.time => {
                let e = ch.poll_errors.remove(&m.name);
                state::with(|r| {
                    if let Some(s) = r.sets.get_mut(&m.name) {
                        s.sync.last_error = e;
                    }
                });
                continue;
            }
            None => (ch.horizon, ch.floor, blind),
        };
        rows += paged.rows;
        let key = state::with(|r| {
            let s = r.sets.get_mut(&m.name)?;
            if s.incarnation != m.incarnation {
                return None;
            }
            s.sync.last_ok = Some(Instant::now());
            s.sync.last_error = blind.then(|| sql::blind_reason(&m.name, "triggers missing"));
            Some((s.filter_key.clone(), s.catalog_id, s.cover_extra.clone()))
        });
        let Some((key, set_id, extra)) = key else {
            continue;
        };
        let here = (crate::db::identity::node(), set_id);
        let outcome = store::with_mut(ctx, &key, |f| {
            // A value that missed a page (swapped in meanwhile) waits for the next pass.
            if !paged.received_all(f.id) {
                return CatchUp::Kept;
            }
            // So does one that covers (or will) a slot whose rows the pass did not read.
            if !m.time && !read_covers(read, f.slots.as_ref(), extra.as_ref()) {
                return CatchUp::Kept;
            }
            catch_up(&m.name, f, &[], m.from, horizon, floor, blind, here)
        });
        // Trust follows the value the pass caught up; rows it added to any other value at
        // the key mean the trusted one (elsewhere, if anywhere) missed them.
        let caught = match outcome {
            Some(CatchUp::CaughtUp(id)) => id,
            _ => None,
        };
        state::with(|r| {
            if let Some(s) = r.sets.get_mut(&m.name) {
                s.filter_synced(caught, paged.rows > 0, started);
            }
        });
        match outcome {
            Some(CatchUp::CaughtUp(_)) => {
                state::with(|r| state::synced(r, &m.name, epoch, started))
            }
            Some(CatchUp::Pruned) => reply::log(
                ctx,
                reply::Level::Warning,
                &format!(
                    "libmember: set '{}': the change log was pruned past its filter's \
                     watermark (member.change-retention-s): rebuilding",
                    m.name
                ),
            ),
            _ => {}
        }
        let was_blind = LOOP.with(|l| l.borrow().blind.contains(&m.name));
        if blind && !was_blind {
            newly_blind.push(m.name.clone());
        }
        if !blind && was_blind {
            reply::log(
                ctx,
                reply::Level::Notice,
                &format!(
                    "libmember: set '{}' feeds the change log again: sync horizon visible",
                    m.name
                ),
            );
        }
    }
    for name in &newly_blind {
        reply::log(
            ctx,
            reply::Level::Warning,
            &format!(
                "libmember: set '{name}' is blind to outside writes (sync_horizon blind): {}",
                sql::blind_reason(name, "triggers missing")
            ),
        );
    }
    let first = LOOP.with(|l| {
        let mut l = l.borrow_mut();
        for m in &members {
            if blind_tables.contains(sql::table(&m.name).as_str()) {
                l.blind.insert(m.name.clone());
            } else {
                l.blind.remove(&m.name);
            }
        }
        l.passes += 1;
        l.statements += ch.statements;
        l.rows += rows;
        l.rows_read += ch.rows_read;
        l.last_statements = ch.statements;
        l.last_rows = rows;
        !std::mem::replace(&mut l.announced, true)
    });
    if first && newly_blind.is_empty() {
        reply::log(
            ctx,
            reply::Level::Notice,
            &format!(
                "libmember: sync horizon visible: {} set(s) follow the change log by transaction \
             id, whatever the database role",
                members.len()
            ),
        );
    }
}

/// Cluster mode: whether a pass that read only the logged rows of the slots `read` (`None`:
/// all rows) read every row a filter needs: those of the slots it covers (`covers`, `None`:
/// all) and of the slots a fill or a rebuild in flight adds (`extra`). A slot this node took
/// on after the pass started is not in `read`, and the pass's snapshot may be younger than the
/// fill's: the filter's watermark then stays, and the next pass, reading that slot too, reads
/// its rows from there.
pub(super) fn read_covers(
    read: Option<&SlotSet>,
    covers: Option<&SlotSet>,
    extra: Option<&SlotSet>,
) -> bool {
    let Some(read) = read else {
        return true;
    };
    let within = |s: &SlotSet| s.minus(read).is_empty();
    covers.is_some_and(within) && extra.is_none_or(within)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::origin::Origin;
    use crate::filter::Bloom;

    const DB: u128 = 42;
    const HERE: (NodeDb, Option<i64>) = (NodeDb::Known(DB), Some(1));

    fn filter(watermark: i64) -> FilterValue {
        let mut f = FilterValue::built(Bloom::new(100, 0.01), watermark, "s");
        f.origin = Some(Origin {
            db: DB,
            set_id: Some(1),
        });
        f
    }

    #[test]
    fn a_pass_advances_a_filter_it_covers() {
        let mut f = filter(100);
        let id = f.id;
        assert_eq!(
            catch_up("s", &mut f, &[7], 100, 150, 0, false, HERE),
            CatchUp::CaughtUp(Some(id))
        );
        assert_eq!(f.cov.watermark, Some(150));
        assert!(f.trusted(Some(id)) && f.bloom.contains(7));
        // A newer filter swapped in meanwhile keeps what it covers, or more.
        let mut newer = filter(200);
        let id = newer.id;
        assert_eq!(
            catch_up("s", &mut newer, &[], 100, 150, 0, false, HERE),
            CatchUp::CaughtUp(Some(id))
        );
        assert_eq!(newer.cov.watermark, Some(200));
    }

    #[test]
    fn a_pass_that_read_some_slots_covers_only_filters_within_them() {
        let set = |v: &[u16]| v.iter().copied().collect::<SlotSet>();
        let read = set(&[1, 2, 3]);
        // Standalone, or a pass that read every row: any filter.
        assert!(read_covers(None, Some(&set(&[9])), Some(&set(&[10]))));
        assert!(read_covers(None, None, None));
        assert!(read_covers(Some(&read), Some(&set(&[1, 3])), None));
        assert!(read_covers(Some(&read), Some(&set(&[1])), Some(&set(&[2]))));
        // A slot gained since the pass started, covered or being filled: not read.
        assert!(!read_covers(Some(&read), Some(&set(&[1, 4])), None));
        assert!(!read_covers(
            Some(&read),
            Some(&set(&[1])),
            Some(&set(&[4]))
        ));
        // A filter of every slot needs every row.
        assert!(!read_covers(Some(&read), None, None));
    }

    #[test]
    fn a_pass_does_not_advance_an_older_filter() {
        let mut f = filter(50);
        assert_eq!(
            catch_up("s", &mut f, &[7], 100, 150, 0, false, HERE),
            CatchUp::Kept
        );
        assert_eq!(f.cov.watermark, Some(50));
    }

    #[test]
    fn pruned_or_blind_filters_become_incomplete() {
        let mut f = filter(100);
        let id = f.id;
        assert_eq!(
            catch_up("s", &mut f, &[], 100, 150, 120, false, HERE),
            CatchUp::Pruned
        );
        assert!(!f.cov.complete && !f.trusted(Some(id)));
        assert_eq!(
            catch_up("s", &mut f, &[], 100, 150, 120, false, HERE),
            CatchUp::Kept
        );
        assert_eq!(f.cov.watermark, Some(100));
        let mut f = filter(100);
        let id = f.id;
        assert_eq!(
            catch_up("s", &mut f, &[], 100, 150, 0, true, HERE),
            CatchUp::Blind
        );
        assert!(!f.cov.complete && !f.trusted(Some(id)));
    }

    #[test]
    fn another_sets_filter_is_never_caught_up() {
        let mut f = filter(100);
        assert_eq!(
            catch_up("t", &mut f, &[], 100, 150, 0, false, HERE),
            CatchUp::Foreign
        );
        assert!(!f.cov.complete);
        assert_eq!(f.cov.watermark, Some(100));
    }

    #[test]
    fn another_databases_filter_is_never_caught_up() {
        // Same set name, a watermark of the same shared transaction-id counter: still not
        // this database's rows.
        let mut f = filter(100);
        let elsewhere = (NodeDb::Known(DB + 1), Some(1));
        assert_eq!(
            catch_up("s", &mut f, &[7], 100, 150, 0, false, elsewhere),
            CatchUp::Foreign
        );
        assert!(!f.cov.complete && f.bloom.contains(7));
        // Another incarnation of the set (dropped and created again) in this database.
        let mut f = filter(100);
        let recreated = (NodeDb::Known(DB), Some(2));
        assert_eq!(
            catch_up("s", &mut f, &[], 100, 150, 0, false, recreated),
            CatchUp::Foreign
        );
        // A payload of the previous version, without origin: rebuilt, never caught up.
        let mut f = filter(100);
        f.origin = None;
        assert_eq!(
            catch_up("s", &mut f, &[], 100, 150, 0, false, HERE),
            CatchUp::Foreign
        );
        assert!(!f.cov.complete);
    }

    #[test]
    fn a_node_that_does_not_know_its_database_holds_the_filter_back() {
        let mut f = filter(100);
        let unknown = (NodeDb::NotYet, Some(1));
        assert_eq!(
            catch_up("s", &mut f, &[7], 100, 150, 0, false, unknown),
            CatchUp::Unverified
        );
        assert!(
            f.cov.complete,
            "not condemned: judged again at the next pass"
        );
        assert_eq!(f.cov.watermark, Some(100));
        assert!(f.bloom.contains(7));
    }
}
