//! Which slots this node answers for, and since when a filter negative for one of them may be
//! believed (docs/cluster-placement.md, "When a filter's 'absent' counts"). A negative for an
//! item whose canonical slot is `s` is trusted only when
//! 1. this node owns `s` (a primary: itself; a replica: its primary), as the last poll of
//!    `CLUSTER NODES` saw it, and `s` is not migrating away;
//! 2. no command or event that can give this node `s` has run since the poll that accepted
//!    `s` ([`unaccept`]: a slot that left and came back between two polls is accepted afresh,
//!    "Knowing which slots a node owns");
//! 3. the set's filter was last brought current (sync pass or rebuild) by work that started
//!    at least `member.db-timeout-ms` + 1 s after the slot was accepted: an ADD the previous
//!    owner took is acknowledged within its timeout or never, so such work reads it.
//!
//! Main thread only.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use redis_module::{Context, RedisString, RedisValue};

use super::nodes;
use super::owners::set_owners;
pub use super::owners::{node_of, primaries, primary_index};
use crate::model::slot::{tag_for_slot, SLOTS};
use crate::model::slot_migration::{self, Step};
use crate::model::slotset::SlotSet;
use crate::{config, server::replication, server::reply};

struct Own {
    primary: bool,
    owned: Vec<bool>,
    /// Owned slots being migrated away: no key of ours is written there any more.
    migrating: Vec<bool>,
    /// Owned slots an atomic slot migration (`CLUSTER MIGRATESLOTS`) is exporting, from its
    /// EXPORT_STARTED event to its end: served, but no filter negative or cache entry of
    /// theirs is believed, and no cache entry written (`CLUSTER NODES` does not show them).
    exporting: Vec<bool>,
    /// `CLUSTER SETSLOT <slot> MIGRATING` seen by the command filter and not yet shown by a
    /// poll (a primary waiting for its replicas' acknowledgement runs it later, unfiltered):
    /// until when it counts as migrating anyway.
    marked: Vec<Option<Instant>>,
    /// When each owned slot was accepted plus the grace: work that brings a filter current
    /// must start at or after this for the filter's negatives of the slot to count.
    accepted: Vec<Option<Instant>>,
    /// The last poll's error, for INFO.
    last_error: Option<String>,
    owned_count: usize,
    /// `owned` as a set, kept for the fills that compare it with each filter's slots.
    owned_set: SlotSet,
    /// The slot map the last full poll acted on.
    last_map: Option<nodes::Mine>,
    /// Something since the last full poll may need a slot looked at again: a slot unaccepted,
    /// a `SETSLOT … MIGRATING` mark, or an owned slot not yet accepted. While it is false and
    /// `CLUSTER NODES` shows the same map, a poll has nothing to do.
    unsettled: bool,
}

impl Default for Own {
    fn default() -> Self {
        Own {
            primary: false,
            owned: vec![false; SLOTS],
            migrating: vec![false; SLOTS],
            exporting: vec![false; SLOTS],
            marked: vec![None; SLOTS],
            accepted: vec![None; SLOTS],
            last_error: None,
            owned_count: 0,
            owned_set: SlotSet::default(),
            last_map: None,
            unsettled: true,
        }
    }
}

thread_local! {
    static OWN: RefCell<Own> = RefCell::new(Own::default());
}

/// Name of the key earlier versions kept in slot `slot` (a "sentinel"): `member:{T(slot)}:owner`.
/// Such keys are only deleted now (`drop_legacy_sentinel`).
pub fn sentinel_name(slot: u16) -> String {
    format!("member:{{{}}}:owner", tag_for_slot(slot))
}

/// True when `key` names a slot sentinel of an earlier version (of any slot).
pub fn is_sentinel_name(key: &[u8]) -> bool {
    key.strip_prefix(b"member:{")
        .and_then(|r| r.strip_suffix(b"}:owner"))
        .is_some_and(|tag| !tag.is_empty() && tag.iter().all(u8::is_ascii_alphanumeric))
}

/// Deletes the sentinel key an earlier version kept at `name`, if there is one. True when a
/// key was deleted (the caller replicates the DEL when it runs outside a command).
pub fn drop_legacy_sentinel(ctx: &Context, name: &RedisString) -> bool {
    let k = ctx.open_key_writable(name);
    !k.is_empty() && k.delete().is_ok()
}

/// True when a filter negative for an item of `slot` may be believed, for a set whose filter
/// was last brought current by work started at `covered_since`. Never while `slot` migrates
/// away (as last polled): the server then sends the slot's own commands (an ADD of the
/// canonical spelling included) to the importing node with ASK, so the ADDs that node takes
/// are not in this node's filter, while other spellings of the same items, whose raw slots
/// stay here, are still decided here.
#[inline]
pub fn ready(slot: u16, covered_since: Option<Instant>) -> bool {
    OWN.with(|o| {
        let o = o.borrow();
        let s = slot as usize;
        match o.accepted[s] {
            Some(at) if !o.migrating[s] && !o.exporting[s] => {
                covered_since.is_some_and(|c| c >= at)
            }
            _ => false,
        }
    })
}

/// How long a `SETSLOT … MIGRATING` seen by the filter counts without a poll showing it: past
/// the server's wait for its replicas' acknowledgement (`SETSLOT … TIMEOUT`, 2 s by default;
/// a longer `TIMEOUT` holds the mark 1 s longer than it).
const MARK_HOLDS: Duration = Duration::from_secs(5);

/// The mark of a `SETSLOT … MIGRATING … TIMEOUT 0`, whose wait has no limit: the slot waits
/// this long at most for a poll to show the migration (it is only asked about at the database
/// meanwhile, which is always right).
const MARK_HOLDS_UNBOUNDED: Duration = Duration::from_secs(600);

/// `CLUSTER SETSLOT <slot> MIGRATING <node>` is about to run here (seen by the command
/// filter): from now until a poll shows the slot migrating (or `MARK_HOLDS` passes), this node
/// believes no filter negative for it and serves no forwarded call for it. A migration's
/// first ASK can only follow that SETSLOT on this node, so no ADD reaches the importing node
/// before this node stops believing its own negatives for the slot (the 100 ms poll alone
/// left that window open).
pub fn setslot_migrating(slot: u16, timeout_ms: Option<u64>) {
    let holds = match timeout_ms {
        None => MARK_HOLDS,
        Some(0) => MARK_HOLDS_UNBOUNDED,
        Some(ms) => MARK_HOLDS.max(Duration::from_millis(ms) + Duration::from_secs(1)),
    };
    if (slot as usize) < SLOTS {
        OWN.with(|o| {
            let mut o = o.borrow_mut();
            o.migrating[slot as usize] = true;
            o.marked[slot as usize] = Some(Instant::now() + holds.min(MARK_HOLDS_UNBOUNDED));
            o.unsettled = true;
        });
    }
}

/// A command or event that may give this node (or its primary) `slots` is about to run or
/// ran: `CLUSTER SETSLOT` of any kind (on a replica, as it arrives from its primary, which
/// replicates it before running it), `ADDSLOTS`, `ADDSLOTSRANGE`, a role change, a dataset
/// load, a replica's link to its primary coming up or going down (a SETSLOT its primary ran
/// while it was away was not replicated to it). The slots are accepted afresh at the next
/// poll that shows them owned, so their grace counts from after the change: a slot that left
/// and came back between two polls is never believed on the acceptance from before it left.
/// `None` means every slot.
pub fn unaccept(slots: Option<&[(u16, u16)]>) {
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        match slots {
            None => o.accepted.fill(None),
            Some(ranges) => {
                for &(a, b) in ranges {
                    let (a, b) = (a as usize, (b as usize).min(SLOTS - 1));
                    if a <= b {
                        o.accepted[a..=b].fill(None);
                    }
                }
            }
        }
        o.unsettled = true;
    });
}

/// True when this node holds `slot` now: owned by the last poll, not being migrated away, and
/// accepted since the last change that could have moved it. What a primary accepts while
/// this holds is covered by the next owner's handover grace (docs/cluster-placement.md,
/// "Canonical forwarding over the cluster bus").
#[inline]
pub fn holds(slot: u16) -> bool {
    OWN.with(|o| {
        let o = o.borrow();
        let s = slot as usize;
        o.owned[s] && !o.migrating[s] && o.accepted[s].is_some()
    })
}

/// True when this node may read and fill the exact-match key of a canonical entity, which
/// lives in the entity's slot: it [`holds`] that slot and no atomic slot migration exports
/// it (an importing node, or one whose slot is leaving, leaves it to the database). Asked
/// again when a fill is written, so a lookup begun before the slot started leaving writes
/// nothing into it.
#[inline]
pub fn may_cache(entity: &str) -> bool {
    let slot = crate::model::slot::keyslot(entity.as_bytes());
    holds(slot) && !OWN.with(|o| o.borrow().exporting[slot as usize])
}

/// An event of an atomic slot migration job named `slots` (inclusive ranges), applied as
/// `model::slot_migration::effect` says. Main thread, from the server's event.
pub fn slot_migration(step: Step, slots: &[(u16, u16)]) {
    let effect = slot_migration::effect(step);
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        for &(a, b) in slots {
            let (a, b) = (a as usize, (b as usize).min(SLOTS - 1));
            if a > b {
                continue;
            }
            if let Some(on) = effect.exporting {
                o.exporting[a..=b].fill(on);
            }
            if effect.gone {
                // The server gave these slots away in this very step; the next poll shows
                // it, but until then nothing may count them as this node's.
                o.owned[a..=b].fill(false);
                o.migrating[a..=b].fill(false);
                for s in a..=b {
                    o.owned_set.remove(s as u16);
                }
                o.owned_count = o.owned.iter().filter(|x| **x).count();
            }
            if effect.unaccept {
                o.accepted[a..=b].fill(None);
            }
        }
        o.unsettled = true;
    });
}

/// Slots an atomic slot migration exports from here now (INFO).
pub fn exporting_count() -> usize {
    OWN.with(|o| o.borrow().exporting.iter().filter(|x| **x).count())
}

/// The slots this node owns (as last polled).
pub fn owned_set() -> SlotSet {
    OWN.with(|o| o.borrow().owned_set.clone())
}

/// True when this node is a primary (as last polled).
pub fn is_primary() -> bool {
    OWN.with(|o| o.borrow().primary)
}

/// True when this node owns `slot` (as last polled).
#[inline]
pub fn owns(slot: u16) -> bool {
    OWN.with(|o| o.borrow().owned[slot as usize])
}

/// This node's role changed: every slot is accepted afresh at the next poll, so a promoted
/// replica waits out the grace before it believes a negative.
pub fn role_changed() {
    unaccept(None);
}

/// Slots owned and slots ready to answer "absent" ([`ready`]) for a set last brought current
/// at `covered_since` (INFO), and the last poll error.
pub fn summary(covered_since: Option<Instant>) -> (usize, usize, Option<String>) {
    let ready = (0..SLOTS as u16)
        .filter(|s| ready(*s, covered_since))
        .count();
    OWN.with(|o| {
        let o = o.borrow();
        (o.owned_count, ready, o.last_error.clone())
    })
}

/// Reads slot ownership (main-thread timer, every sweep). Returns when the grace of slots
/// accepted now ends (a sync pass should start then), if any were.
pub fn poll(ctx: &Context) -> Option<Instant> {
    let text = match ctx.call("CLUSTER", &["NODES"]) {
        Ok(RedisValue::BulkString(s)) | Ok(RedisValue::SimpleString(s)) => s,
        Ok(RedisValue::StringBuffer(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(RedisValue::BulkRedisString(s)) => s.to_string_lossy(),
        Ok(other) => return failed(ctx, format!("CLUSTER NODES answered {other:?}")),
        Err(e) => return failed(ctx, format!("CLUSTER NODES failed: {e}")),
    };
    super::bus_nodelay::after_poll(nodes::bus_links(&text));
    let Some(mine) = nodes::parse(&text) else {
        return failed(ctx, "CLUSTER NODES names no node as myself".into());
    };
    let settled = OWN.with(|o| {
        let mut o = o.borrow_mut();
        o.last_error = None;
        !o.unsettled && o.last_map.as_ref() == Some(&mine)
    });
    if settled {
        return None;
    }
    set_owners(&mine.owners);
    let mut now_owned = vec![false; SLOTS];
    for (a, b) in &mine.ranges {
        now_owned[*a as usize..=*b as usize].fill(true);
    }
    let mut now_migrating = vec![false; SLOTS];
    for s in &mine.migrating {
        now_migrating[*s as usize] = true;
    }
    let now = Instant::now();
    let ready_at = now + config::handover_grace();
    let primary = mine.primary;
    let mut newly = Vec::new();
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        o.last_error = None;
        if o.primary != mine.primary {
            o.primary = mine.primary;
            o.accepted.fill(None);
        }
        // A mark counts until a poll shows the migration (which then speaks for itself).
        let mut migrating = now_migrating.clone();
        for (s, m) in migrating.iter_mut().enumerate() {
            match o.marked[s] {
                _ if now_migrating[s] => o.marked[s] = None,
                Some(until) if now < until => *m = true,
                Some(_) => o.marked[s] = None,
                None => {}
            }
        }
        for (s, &owned) in now_owned.iter().enumerate() {
            // Out of the slot, or back from a migration called off (SETSLOT STABLE): ADDs the
            // importing node took meanwhile may be missing here, so the slot is accepted
            // afresh and waits out a new grace before its negatives count.
            if !owned || !o.owned[s] || (o.migrating[s] && !migrating[s]) {
                o.accepted[s] = None;
            }
            if owned && !now_migrating[s] && o.accepted[s].is_none() {
                o.accepted[s] = Some(ready_at);
                newly.push(s as u16);
            }
        }
        o.owned_count = now_owned.iter().filter(|x| **x).count();
        o.owned_set = (0..SLOTS as u16)
            .filter(|s| now_owned[*s as usize])
            .collect();
        o.owned = now_owned;
        o.migrating = migrating;
        o.unsettled = o.marked.iter().any(Option::is_some);
        o.last_map = Some(mine);
    });
    if primary {
        for &slot in &newly {
            let name = RedisString::create(None, sentinel_name(slot));
            if drop_legacy_sentinel(ctx, &name) {
                replication::replicate(ctx, "DEL", &[name.as_slice()]);
            }
        }
    }
    (!newly.is_empty()).then_some(ready_at)
}

fn failed(ctx: &Context, why: String) -> Option<Instant> {
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        if o.last_error.as_deref() != Some(why.as_str()) {
            reply::log(ctx, reply::Level::Warning, &format!("libmember: {why}"));
        }
        o.last_error = Some(why);
    });
    None
}

#[cfg(test)]
#[path = "owner_tests.rs"]
mod tests;
