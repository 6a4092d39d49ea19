//! Which primary serves each slot, as the last poll of `CLUSTER NODES` saw it (`owner::poll`
//! sets it): where a request about an item is forwarded, how many items are split by owner,
//! where a cluster-wide REBUILD goes. Main thread only.

use std::cell::RefCell;

use crate::model::slot::SLOTS;

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

pub(super) fn set_owners(ranges: &[(u16, u16, String)]) {
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
