//! Which slots this node answers for, and since when a filter negative for one of them may be
//! believed (docs/cluster-placement.md, "When a filter's 'absent' counts"). A negative for an
//! item whose canonical slot is `s` is trusted only when
//! 1. this node owns `s` (a primary: itself; a replica: its primary), as the last poll of
//!    `CLUSTER NODES` saw it;
//! 2. `s`'s sentinel key holds the very value this node accepted for `s` (a slot that left and
//!    came back between two polls brings back a value of a new identity, see `sentinel.rs`);
//! 3. the set's filter was last brought current (sync pass or rebuild) by work that started
//!    at least `member.db-timeout-ms` + 1 s after the slot was accepted: an ADD the previous
//!    owner took is acknowledged within its timeout or never, so such work reads it.
//!
//! Main thread only.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use std::os::raw::c_int;

use redis_module::{raw, Context, RedisString, RedisValue};

use super::nodes;
use super::sentinel::{Sentinel, SENTINEL_TYPE};
use crate::model::slot::{keyslot, tag_for_slot, SLOTS};
use crate::model::slotset::SlotSet;
use crate::{config, server::replication, server::reply};

#[derive(Clone, Copy, Debug)]
struct Accepted {
    /// Identity of the sentinel value accepted.
    id: u64,
    /// Work that brings a filter current must start at or after this.
    ready_at: Instant,
}

struct Own {
    primary: bool,
    owned: Vec<bool>,
    /// Owned slots being migrated away: no key of ours is written there any more.
    migrating: Vec<bool>,
    /// `CLUSTER SETSLOT <slot> MIGRATING` seen by the command filter and not yet shown by a
    /// poll (a primary waiting for its replicas' acknowledgement runs it later, unfiltered):
    /// until when it counts as migrating anyway.
    marked: Vec<Option<Instant>>,
    accepted: Vec<Option<Accepted>>,
    /// The accepted sentinel was seen at its key, and no keyspace event has touched that key
    /// since (`sentinel_touched`): the hot path then skips the key lookup. Every way a key can
    /// go or be replaced (DEL, MIGRATE, RESTORE, COPY, RENAME, expiry, eviction, flush, load)
    /// clears it.
    verified: Vec<bool>,
    names: Vec<Option<RedisString>>,
    /// The last poll's error, for INFO.
    last_error: Option<String>,
    owned_count: usize,
    /// `owned` as a set, kept for the fills that compare it with each filter's slots.
    owned_set: SlotSet,
    /// The slot map the last full poll acted on.
    last_map: Option<nodes::Mine>,
    /// Something since the last full poll may need a slot looked at again: an event on a
    /// sentinel, a `SETSLOT … MIGRATING` mark, a role change, or an owned slot not yet
    /// accepted and seen. While it is false and `CLUSTER NODES` shows the same map, a poll
    /// has nothing to do (an idle node's poll touches no slot).
    unsettled: bool,
}

impl Default for Own {
    fn default() -> Self {
        Own {
            primary: false,
            owned: vec![false; SLOTS],
            migrating: vec![false; SLOTS],
            marked: vec![None; SLOTS],
            accepted: vec![None; SLOTS],
            verified: vec![false; SLOTS],
            names: (0..SLOTS).map(|_| None).collect(),
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

/// Name of slot `slot`'s sentinel key: `member:{T(slot)}:owner`.
pub fn sentinel_name(slot: u16) -> String {
    format!("member:{{{}}}:owner", tag_for_slot(slot))
}

/// True when `key` names a slot sentinel (of any slot).
pub fn is_sentinel_name(key: &[u8]) -> bool {
    key.strip_prefix(b"member:{")
        .and_then(|r| r.strip_suffix(b"}:owner"))
        .is_some_and(|tag| !tag.is_empty() && tag.iter().all(u8::is_ascii_alphanumeric))
}

fn with_name<R>(o: &mut Own, slot: u16, f: impl FnOnce(&RedisString) -> R) -> R {
    let n = o.names[slot as usize]
        .get_or_insert_with(|| RedisString::create(None, sentinel_name(slot)));
    f(n)
}

/// Identity of the sentinel value at `name`, if one is there without a TTL. A sentinel given a
/// TTL does not count (it could expire unseen, and a key missing at a migration moves no
/// event): the primary writes a fresh one at its next poll.
fn sentinel_at(ctx: &Context, name: &RedisString) -> Option<u64> {
    let mt = *SENTINEL_TYPE.raw_type.borrow();
    // SAFETY: ctx and name are live; the key is opened for reading and closed before return;
    // the type check guarantees the value is a Sentinel we stored.
    unsafe {
        let k =
            raw::RedisModule_OpenKey.unwrap()(ctx.ctx, name.inner, raw::REDISMODULE_READ as c_int)
                .cast::<raw::RedisModuleKey>();
        if k.is_null() {
            return None;
        }
        let ours = raw::RedisModule_KeyType.unwrap()(k) == raw::REDISMODULE_KEYTYPE_MODULE as c_int
            && raw::RedisModule_ModuleTypeGetType.unwrap()(k) == mt
            && raw::RedisModule_GetExpire.unwrap()(k) == raw::REDISMODULE_NO_EXPIRE as i64;
        let id = if ours {
            let v = raw::RedisModule_ModuleTypeGetValue.unwrap()(k).cast::<Sentinel>();
            v.as_ref().map(|s| s.id)
        } else {
            None
        };
        raw::RedisModule_CloseKey.unwrap()(k);
        id
    }
}

/// Writes a new sentinel at `name` (replacing whatever is there, a value of another type that
/// another command wrote included: the name is the module's) and returns its identity. The
/// caller clears the slot's `verified` (a module write fires no keyspace event).
pub fn write_sentinel(ctx: &Context, name: &RedisString) -> Option<u64> {
    let k = ctx.open_key_writable(name);
    if !k.is_empty() && k.get_value::<Sentinel>(&SENTINEL_TYPE).is_err() {
        let _ = k.delete();
    }
    let s = Sentinel::new();
    let id = s.id;
    k.set_value(&SENTINEL_TYPE, s).ok().map(|_| id)
}

/// True when a filter negative for an item of `slot` may be believed, for a set whose filter
/// was last brought current by work started at `covered_since`. Never while `slot` migrates
/// away (as last polled): the server then sends the slot's own commands (an ADD of the
/// canonical spelling included) to the importing node with ASK, so the ADDs that node takes
/// are not in this node's filter, while other spellings of the same items, whose raw slots
/// stay here, are still decided here.
#[inline]
pub fn ready(ctx: &Context, slot: u16, covered_since: Option<Instant>) -> bool {
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        if o.migrating[slot as usize] {
            return false;
        }
        let Some(a) = o.accepted[slot as usize] else {
            return false;
        };
        if covered_since.is_none_or(|c| c < a.ready_at) {
            return false;
        }
        sentinel_is(ctx, &mut o, slot, a.id)
    })
}

/// True when `slot`'s sentinel is the value `id`: known from no event having touched its
/// key since it was last seen, or seen now.
#[inline]
fn sentinel_is(ctx: &Context, o: &mut Own, slot: u16, id: u64) -> bool {
    let s = slot as usize;
    if o.verified[s] {
        return true;
    }
    let here = with_name(o, slot, |n| sentinel_at(ctx, n)) == Some(id);
    o.verified[s] = here;
    o.unsettled |= !here;
    here
}

/// How long a `SETSLOT … MIGRATING` seen by the filter counts without a poll showing it: past
/// the server's wait for its replicas' acknowledgement (`SETSLOT … TIMEOUT`, 2 s by default).
const MARK_HOLDS: Duration = Duration::from_secs(5);

/// `CLUSTER SETSLOT <slot> MIGRATING <node>` is about to run here (seen by the command
/// filter): from now until a poll shows the slot migrating (or `MARK_HOLDS` passes), this node
/// believes no filter negative for it and serves no forwarded call for it. A migration's
/// first ASK can only follow that SETSLOT on this node, so no ADD reaches the importing node
/// before this node stops believing its own negatives for the slot (the 100 ms poll alone
/// left that window open).
pub fn setslot_migrating(slot: u16) {
    if (slot as usize) < SLOTS {
        OWN.with(|o| {
            let mut o = o.borrow_mut();
            o.migrating[slot as usize] = true;
            o.marked[slot as usize] = Some(Instant::now() + MARK_HOLDS);
            o.unsettled = true;
        });
    }
}

/// A keyspace event touched the sentinel key of `slot` (it may be gone or another value).
pub fn sentinel_touched(slot: u16) {
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        o.verified[slot as usize] = false;
        o.unsettled = true;
    });
}

/// Every key may have gone or been replaced (FLUSHALL, a dataset load).
pub fn sentinels_touched() {
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        o.verified.fill(false);
        o.unsettled = true;
    });
}

/// True when this node holds `slot` now: owned by the last poll, not being migrated away, and its
/// sentinel is still the value accepted. A migration moves the sentinel with the slot's other keys
/// before the handover, so a key written while this holds is moved too (never left behind to make
/// the handover fail), and what a primary accepts while this holds is covered by the next owner's
/// handover grace (docs/cluster-placement.md, "Canonical forwarding over the cluster bus").
pub fn holds(ctx: &Context, slot: u16) -> bool {
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        let s = slot as usize;
        let Some(a) = o.accepted[s].filter(|_| o.owned[s] && !o.migrating[s]) else {
            return false;
        };
        sentinel_is(ctx, &mut o, slot, a.id)
    })
}

/// True when this node may read and fill the exact-match key of a canonical entity, which
/// lives in the entity's slot: it [`holds`] that slot (an importing node, or one whose slot is
/// leaving, leaves it to the database).
#[inline]
pub fn may_cache(ctx: &Context, entity: &str) -> bool {
    holds(ctx, keyslot(entity.as_bytes()))
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
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        o.accepted.iter_mut().for_each(|a| *a = None);
        o.unsettled = true;
    });
}

/// Slots owned and slots ready to answer "absent" ([`ready`]: sentinels checked too) for a
/// set last brought current at `covered_since` (INFO), and the last poll error.
pub fn summary(ctx: &Context, covered_since: Option<Instant>) -> (usize, usize, Option<String>) {
    let ready = (0..SLOTS as u16)
        .filter(|s| ready(ctx, *s, covered_since))
        .count();
    OWN.with(|o| {
        let o = o.borrow();
        (o.owned_count, ready, o.last_error.clone())
    })
}

/// Reads slot ownership and sentinels (main-thread timer, every sweep). Returns when the
/// grace of slots accepted now ends (a sync pass should start then), if any were.
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
    let mut created = Vec::new();
    let mut accepted_any = false;
    OWN.with(|o| {
        let mut o = o.borrow_mut();
        o.last_error = None;
        if o.primary != mine.primary {
            o.primary = mine.primary;
            o.accepted.iter_mut().for_each(|a| *a = None);
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
            if !owned {
                continue;
            }
            let slot = s as u16;
            // A sentinel seen since the last event on its key is still the accepted value
            // (the hot path trusts the same bit): only slots an event touched, and slots not
            // yet accepted, are looked up, so an idle node's poll opens no key.
            let known = o.accepted[s].filter(|_| o.verified[s]).map(|a| a.id);
            let found = known.or_else(|| with_name(&mut o, slot, |n| sentinel_at(ctx, n)));
            let id = match found {
                Some(id) => id,
                // A slot on its way out keeps no sentinel: writing one after the migration's
                // last MIGRATE would make the handover (SETSLOT NODE) fail.
                None if now_migrating[s] => {
                    o.accepted[s] = None;
                    continue;
                }
                None if mine.primary => match with_name(&mut o, slot, |n| write_sentinel(ctx, n)) {
                    Some(id) => {
                        created.push(slot);
                        id
                    }
                    None => continue,
                },
                // A replica waits for its primary's sentinel.
                None => {
                    o.accepted[s] = None;
                    continue;
                }
            };
            if o.accepted[s].map(|a| a.id) != Some(id) {
                o.accepted[s] = Some(Accepted { id, ready_at });
                accepted_any = true;
            }
            // Seen at its key just now (a value written here is checked at its first use).
            o.verified[s] = found == Some(id);
        }
        o.owned_count = now_owned.iter().filter(|x| **x).count();
        o.owned_set = (0..SLOTS as u16)
            .filter(|s| now_owned[*s as usize])
            .collect();
        o.owned = now_owned;
        o.migrating = migrating;
        o.unsettled = o.marked.iter().any(Option::is_some)
            || (0..SLOTS).any(|s| o.owned[s] && !(o.accepted[s].is_some() && o.verified[s]));
        o.last_map = Some(mine);
    });
    for slot in created {
        replication::replicate(ctx, "MEMBER._OWN", &[sentinel_name(slot).as_bytes()]);
    }
    accepted_any.then_some(ready_at)
}

/// Which primary serves each slot, as last polled: node ids, and per slot an index into them.
struct Owners {
    ids: Vec<String>,
    /// `NONE` for a slot no primary serves.
    of: Vec<u16>,
}

const NONE: u16 = u16::MAX;

thread_local! {
    static OWNERS: RefCell<Owners> = RefCell::new(Owners { ids: Vec::new(), of: vec![NONE; SLOTS] });
}

fn set_owners(ranges: &[(u16, u16, String)]) {
    OWNERS.with(|o| {
        let mut o = o.borrow_mut();
        o.ids.clear();
        o.of.fill(NONE);
        for (a, b, id) in ranges {
            let at = match o.ids.iter().position(|x| x == id) {
                Some(i) => i,
                None => {
                    o.ids.push(id.clone());
                    o.ids.len() - 1
                }
            };
            o.of[*a as usize..=*b as usize].fill(at as u16);
        }
    });
}

/// The node ids of the primaries serving at least one slot, as last polled (where a
/// cluster-wide REBUILD goes).
pub fn primaries() -> Vec<String> {
    OWNERS.with(|o| o.borrow().ids.clone())
}

/// Where in [`primaries`] the node serving `slot` is, as last polled (many items split by
/// owner without a node id copied per item).
#[inline]
pub fn primary_index(slot: u16) -> Option<usize> {
    OWNERS.with(|o| {
        let o = o.borrow();
        let at = o.of[slot as usize] as usize;
        (at < o.ids.len()).then_some(at)
    })
}

/// The node id of the primary serving `slot`, as last polled (where a request about an item
/// of that slot is forwarded).
pub fn node_of(slot: u16) -> Option<String> {
    OWNERS.with(|o| {
        let o = o.borrow();
        o.ids.get(o.of[slot as usize] as usize).cloned()
    })
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
mod tests {
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
}
