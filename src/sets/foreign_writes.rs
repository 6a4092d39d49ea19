//! Exact-match keys written by a command other than the module's own (SET, APPEND, COPY,
//! RESTORE, EXPIRE … onto `member:…:hit:…`): not believed from that write's notification on, and
//! deleted by the main thread within a tick. The module's own fills and deletes (RM_StringSet,
//! RM_SetExpire, RM_DeleteKey) fire no notification but `new`, which nothing here listens to.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use redis_module::{raw, Context, ContextFlags, RedisString};

use crate::sets::cache_epoch;

/// Most keys held between two drains: past it (a client writing the module's keys in bulk),
/// the whole cache is distrusted instead, which costs no memory.
const MAX_HELD: usize = 10_000;

/// The keys written by another command and not yet deleted (DB 0, on a primary).
#[derive(Default)]
struct Held {
    keys: HashSet<Vec<u8>>,
    /// A drain is queued on the main thread.
    posted: bool,
}

/// What the caller of [`Held::hold`] does next.
#[derive(Debug, PartialEq)]
enum Then {
    /// Queue a drain.
    Post,
    /// A drain is queued already.
    Nothing,
    /// Too many keys held: distrust every entry instead (the held ones were dropped).
    DistrustAll,
}

impl Held {
    fn hold(&mut self, key: &[u8]) -> Then {
        if self.keys.len() >= MAX_HELD && !self.keys.contains(key) {
            self.keys.clear();
            return Then::DistrustAll;
        }
        self.keys.insert(key.to_vec());
        if std::mem::replace(&mut self.posted, true) {
            Then::Nothing
        } else {
            Then::Post
        }
    }

    fn take(&mut self) -> HashSet<Vec<u8>> {
        self.posted = false;
        std::mem::take(&mut self.keys)
    }
}

static HELD: LazyLock<Mutex<Held>> = LazyLock::new(Mutex::default);

/// True while `HELD` holds any key: the hot path reads only this.
static ANY: AtomicBool = AtomicBool::new(false);

/// Notifications may come from any thread holding the server's lock (another module's
/// thread-safe context), hence a mutex rather than main-thread state.
fn held() -> MutexGuard<'static, Held> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A command other than the module's own wrote the exact-match key `key` (from a keyspace
/// notification, `events.rs`). From now on the entry there is not believed until the module
/// writes or deletes it again; the main thread deletes it (and sends the DEL to replicas and
/// the AOF) within a tick. On a replica or while loading, where the module cannot write,
/// every entry of this process is distrusted instead (a replica fills none of its own).
pub fn written(ctx: &Context, key: &[u8]) {
    // Only DB 0 holds the module's keys; a value reaches DB 0 from elsewhere through an event
    // of its own there (MOVE, COPY … DB) or through SWAPDB (`events.rs`).
    // SAFETY: the notification's live context, whose selected DB is the event's.
    if unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx.ctx) } != 0 {
        return;
    }
    if distrusted_all_instead(ctx) {
        return;
    }
    let then = {
        let mut h = held();
        let then = h.hold(key);
        ANY.store(!h.keys.is_empty(), Ordering::Release);
        then
    };
    match then {
        Then::Post => crate::server::mainq::post(Box::new(drain)),
        Then::Nothing => {}
        Then::DistrustAll => cache_epoch::distrust_cache(),
    }
}

/// On a replica or while loading the module cannot delete a key: every entry of this process
/// is distrusted instead (true then).
fn distrusted_all_instead(ctx: &Context) -> bool {
    let cannot_write = ctx
        .get_flags()
        .intersects(ContextFlags::SLAVE | ContextFlags::LOADING);
    if cannot_write {
        cache_epoch::distrust_cache();
    }
    cannot_write
}

/// True when another command wrote `key` and the module has not written or deleted it since:
/// the entry there is not believed, whatever it holds.
#[inline]
pub fn untrusted(key: &[u8]) -> bool {
    ANY.load(Ordering::Acquire) && held().keys.contains(key)
}

/// The module itself just wrote or deleted `key` (main thread): what is there now is its own.
#[inline]
pub fn rewritten(key: &[u8]) {
    if ANY.load(Ordering::Acquire) {
        let mut h = held();
        h.keys.remove(key);
        ANY.store(!h.keys.is_empty(), Ordering::Release);
    }
}

/// Deletes the keys written by other commands (main-thread queue, DB 0 selected).
fn drain(ctx: &Context) {
    let keys = {
        let mut h = held();
        let keys = h.take();
        ANY.store(false, Ordering::Release);
        keys
    };
    if keys.is_empty() {
        return;
    }
    // Demoted since: a replica writes nothing of its own.
    if distrusted_all_instead(ctx) {
        return;
    }
    for k in keys {
        let name = RedisString::create_from_slice(ctx.ctx, &k);
        let gone = {
            let key = ctx.open_key_writable(&name);
            !key.is_empty() && key.delete().is_ok()
        };
        if gone {
            crate::server::replication::replicate(ctx, "DEL", &[&k]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_drain_is_queued_for_many_keys() {
        let mut h = Held::default();
        assert_eq!(h.hold(b"a"), Then::Post);
        assert_eq!(h.hold(b"b"), Then::Nothing);
        assert_eq!(h.hold(b"a"), Then::Nothing);
        let taken = h.take();
        assert_eq!(taken.len(), 2);
        assert!(h.keys.is_empty());
        assert_eq!(h.hold(b"c"), Then::Post);
    }

    #[test]
    fn too_many_keys_distrust_everything_and_hold_nothing() {
        let mut h = Held::default();
        for i in 0..MAX_HELD {
            assert_ne!(h.hold(i.to_string().as_bytes()), Then::DistrustAll);
        }
        // A key already held costs nothing more.
        assert_eq!(h.hold(b"0"), Then::Nothing);
        assert_eq!(h.hold(b"one more"), Then::DistrustAll);
        assert!(h.keys.is_empty());
        // The queued drain still runs, finds nothing, and the next key queues another.
        assert!(h.take().is_empty());
        assert_eq!(h.hold(b"next"), Then::Post);
    }
}
