//! The derived-state effects of a membership change, applied on the main thread: one place
//! used by write completions on the primary, the replicated internal commands on replicas and
//! AOF load, and the sync loop. What goes to the replicas is `replication.rs`.

use redis_module::Context;

use crate::filter::store;
use crate::model::canon::Canon;
use crate::{sets::keys, sets::state};

/// `canon` became (or may have become) a member of `set`: set its filter bits, make a running
/// rebuild include it, drop its cache entry. A set without a filter gets none here: it falls
/// through to the database until its rebuild (which includes this item through the journal)
/// installs a complete one; allocating a whole filter on the main thread for one item would
/// stall every client for as long as the filter takes to zero. If the filter at the key is
/// not the one the set trusts, that one (moved away, or gone) missed the item and is trusted
/// no more.
/// (A rotating set's write of two forms calls this for each: `command/write.rs`.)
pub fn added(ctx: &Context, set: &str, canon: &Canon) {
    state::with(|r| {
        let (key, prefix) = match r.sets.get_mut(set) {
            Some(s) => {
                s.journal(canon.hash);
                s.generation += 1;
                (s.filter_key.clone(), s.cache_prefix.clone())
            }
            None => (keys::filter_key(set), keys::cache_prefix(set)),
        };
        let at = store::add(ctx, &key, canon.hash);
        // The trusted filter, if it is not the value that just took the item, missed it.
        if let Some(s) = r.sets.get_mut(set) {
            s.filter_added(at);
        }
        keys::cache_invalidate(ctx, &keys::cache_key(ctx, &prefix, canon));
    });
}

/// `canon` stopped being a member of `set`: drop its cache entry (the filter keeps its bits
/// until the next rebuild; a lookup of it is counted as lapsed, not as a false positive).
pub fn removed(ctx: &Context, set: &str, canon: &Canon) {
    let prefix = state::with(|r| match r.sets.get_mut(set) {
        Some(s) => {
            s.generation += 1;
            s.lapsed.note(canon.hash);
            s.cache_prefix.clone()
        }
        None => keys::cache_prefix(set),
    });
    keys::cache_invalidate(ctx, &keys::cache_key(ctx, &prefix, canon));
}
