//! Where a set's filter lives, and the one way to reach it. Standalone: the key
//! `member:<set>:bloom` (a `member-bf` value, persisted and replicated as any key). In cluster
//! mode: module memory on each node, under the same name (docs/cluster-placement.md, "What lives
//! where, in cluster mode"): a key there would sit in one hash slot, `--cluster reshard` would move
//! it whole (or fail with BUSYKEY, every node holding one of that name), and Valkey deletes keys of
//! slots it does not own at start-up. Cluster-mode filters persist as RDB aux data
//! (`cluster/sentinel.rs`). Main thread only.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::Instant;

use redis_module::{raw, Context, RedisString};

use crate::filter::data_type::{self, free_later, FILTER_TYPE};
use crate::filter::known_absent::KnownAbsent;
use crate::filter::value::FilterValue;
use crate::model::funnel::FilterView;

pub use crate::filter::data_type::keys_changed;

thread_local! {
    /// Cluster mode: every filter this node holds, by the name its key would have.
    static MEMORY: RefCell<HashMap<Vec<u8>, Box<FilterValue>>> = RefCell::new(HashMap::new());
}

#[inline]
fn in_memory() -> bool {
    crate::server::cluster_mode::enabled()
}

/// Runs `f` on the module-memory filter named `key`, if any.
#[inline]
fn mem<R>(key: &[u8], f: impl FnOnce(Option<&mut FilterValue>) -> R) -> R {
    MEMORY.with(|m| f(m.borrow_mut().get_mut(key).map(|b| &mut **b)))
}

/// A set's filter value as last found at its key (standalone mode), so that a lookup does not
/// open the key again: opening it was 0.06 µs of a 0.85 µs pipelined EXISTS
/// (bench/PROFILE.md). Valid only while `data_type::generation` has not moved.
#[derive(Default)]
pub struct Remembered(Cell<Option<(NonNull<FilterValue>, u64)>>);

impl Remembered {
    #[inline]
    fn get(&self) -> Option<&FilterValue> {
        let (p, generation) = self.0.get()?;
        // SAFETY: the value was at the set's key when remembered, under this generation; it
        // can only leave the keyspace (and then be freed) through a path that moves the
        // generation first (see `data_type::keys_changed`), and only the main thread follows
        // the pointer.
        if generation != data_type::generation() {
            return None;
        }
        Some(unsafe { p.as_ref() })
    }
}

/// What the filter at `key` says about `hash`, and the identity of that filter when it is
/// trusted (what a database "absent" for an item it let through may be remembered against).
/// Only the value whose identity is `trusted` may answer "absent"; any other value found
/// there, a missing filter, or a key of another type, is incomplete.
#[inline]
/// In a cluster, `slot` is the item's canonical slot: a filter that does not cover it is
/// incomplete for the item.
pub fn view(
    ctx: &Context,
    (key, remembered): (&RedisString, &Remembered),
    hash: u128,
    trusted: Option<u64>,
    slot: Option<u16>,
) -> (FilterView, Option<u64>) {
    if in_memory() {
        return mem(key.as_slice(), |f| {
            let f = f.filter(|f| slot.is_none_or(|s| f.covers(s)));
            judge(f.map(|f| &*f), hash, trusted)
        });
    }
    if let Some(f) = remembered.get() {
        return judge(Some(f), hash, trusted);
    }
    let generation = data_type::generation();
    let k = ctx.open_key(key);
    let f = k.get_value::<FilterValue>(&FILTER_TYPE).ok().flatten();
    remembered.0.set(f.map(|f| (NonNull::from(f), generation)));
    judge(f, hash, trusted)
}

/// The filter at one key, found once for many probes (MEMBER.MEXISTS): each `view` answers
/// exactly as [`view`] would, without looking the key or the value up again (the value was
/// asked of the server twice an item, for the prefetch and for the probe). Hold it only while
/// nothing writes that key (a command's own synchronous part).
pub struct Probe {
    /// The key, held open while the value is used, when it was not remembered.
    _key: Option<redis_module::key::RedisKey>,
    value: Option<NonNull<FilterValue>>,
}

impl Probe {
    /// Finds the value as [`view`] does: the remembered one while it is valid, else the one
    /// at the key, then remembered.
    pub fn open(ctx: &Context, (key, remembered): (&RedisString, &Remembered)) -> Probe {
        if let Some(f) = remembered.get() {
            return Probe {
                _key: None,
                value: Some(NonNull::from(f)),
            };
        }
        let generation = data_type::generation();
        let k = ctx.open_key(key);
        let value = k
            .get_value::<FilterValue>(&FILTER_TYPE)
            .ok()
            .flatten()
            .map(NonNull::from);
        remembered.0.set(value.map(|p| (p, generation)));
        Probe {
            _key: Some(k),
            value,
        }
    }

    #[inline]
    fn value(&self) -> Option<&FilterValue> {
        // SAFETY: the value was at the key when found (and the key is held open, or the
        // remembered generation was current); nothing writes the key while a Probe is held,
        // and only the main thread uses it.
        self.value.map(|p| unsafe { p.as_ref() })
    }

    #[inline]
    pub fn view(&self, hash: u128, trusted: Option<u64>) -> (FilterView, Option<u64>) {
        judge(self.value(), hash, trusted)
    }

    /// Starts bringing in the filter lines `view(hash, …)` will read, without waiting: a
    /// caller with many items prefetches a few ahead so that their misses overlap (a filter
    /// larger than the caches costs a memory miss a probe; bench/PROFILE.md).
    #[inline]
    pub fn prefetch(&self, hash: u128) {
        if let Some(f) = self.value() {
            f.bloom.prefetch(hash);
        }
    }
}

#[inline]
fn judge(
    value: Option<&FilterValue>,
    hash: u128,
    trusted: Option<u64>,
) -> (FilterView, Option<u64>) {
    match value {
        Some(f) if f.trusted(trusted) => {
            let view = if !f.bloom.contains(hash) {
                FilterView::Complete { contains: false }
            } else if fp_cache_on() && f.known_absent.contains(hash) {
                FilterView::KnownAbsent
            } else {
                FilterView::Complete { contains: true }
            };
            (view, Some(f.id))
        }
        _ => (FilterView::Incomplete, None),
    }
}

fn fp_cache_size() -> usize {
    crate::config::FP_CACHE_SIZE.load(Ordering::Relaxed).max(0) as usize
}

/// `member.fp-cache-size` is not 0.
#[inline]
fn fp_cache_on() -> bool {
    crate::config::FP_CACHE_SIZE.load(Ordering::Relaxed) > 0
}

/// Remembers that the database found `hash` absent when asked at `asked`, if the filter at
/// `key` is still the filter `id` that let it through, the set still trusts it (`trusted`)
/// and nothing added the item since. With the tier turned off, frees what it held.
pub fn remember_absent(
    ctx: &Context,
    key: &RedisString,
    id: u64,
    trusted: Option<u64>,
    hash: u128,
    asked: Instant,
    ttl_s: u64,
) {
    let cap = fp_cache_size();
    if cap == 0 {
        if with(ctx, key, |f| f.known_absent.bytes() > 0) == Some(true) {
            with_mut(ctx, key, |f| f.known_absent = KnownAbsent::default());
        }
        return;
    }
    let ttl = std::time::Duration::from_secs(ttl_s.min(crate::config::CACHE_TTL_MAX as u64));
    let now = Instant::now();
    let Some(until) = now.checked_add(ttl) else {
        return;
    };
    with_mut(ctx, key, |f| {
        if f.id == id && f.trusted(trusted) {
            f.known_absent.insert(hash, asked, until, now, cap);
        }
    });
}

/// A lookup found `hash` present: whatever the filter at `key` remembered as absent (read
/// before an outside write committed) is forgotten at once, not at the next sync pass.
pub fn forget_absent(ctx: &Context, key: &RedisString, hash: u128) {
    if with(ctx, key, |f| f.known_absent.contains(hash)) == Some(true) {
        with_mut(ctx, key, |f| f.known_absent.remove(hash));
    }
}

/// Runs `f` on the filter at `key`, if there is one of our type.
pub fn with<R>(ctx: &Context, key: &RedisString, f: impl FnOnce(&FilterValue) -> R) -> Option<R> {
    if in_memory() {
        return mem(key.as_slice(), |v| v.map(|v| f(v)));
    }
    let k = ctx.open_key(key);
    match k.get_value::<FilterValue>(&FILTER_TYPE) {
        Ok(Some(v)) => Some(f(v)),
        _ => None,
    }
}

/// Runs `f` on the filter at `key` for writing, if there is one of our type.
pub fn with_mut<R>(
    ctx: &Context,
    key: &RedisString,
    f: impl FnOnce(&mut FilterValue) -> R,
) -> Option<R> {
    if in_memory() {
        return mem(key.as_slice(), |v| v.map(f));
    }
    let k = ctx.open_key_writable(key);
    match k.get_value::<FilterValue>(&FILTER_TYPE) {
        Ok(Some(v)) => Some(f(v)),
        _ => None,
    }
}

/// Adds `hash` to the filter at `key`. Returns the identity of the value it went into, or
/// `None` when there is no filter of ours there.
pub fn add(ctx: &Context, key: &RedisString, hash: u128) -> Option<u64> {
    with_mut(ctx, key, |v| {
        v.add(hash);
        v.id
    })
}

/// Removes the filter at `key` (its set was dropped).
pub fn remove(ctx: &Context, key: &RedisString) {
    if in_memory() {
        if let Some(old) = MEMORY.with(|m| m.borrow_mut().remove(key.as_slice())) {
            free_later(old);
        }
        return;
    }
    keys_changed();
    let k = ctx.open_key_writable(key);
    if !k.is_empty() {
        let _ = k.delete();
    }
}

/// Stores `value` at `key`, replacing whatever is there (the `member:` prefix is ours), and
/// returns its identity (for the set to trust it, or not). A filter it replaces is freed off
/// the main thread when large (a rebuild's swap must not wait for hundreds of megabytes to be
/// returned).
pub fn install(ctx: &Context, key: &RedisString, value: FilterValue) -> u64 {
    let id = value.id;
    if in_memory() {
        let old = MEMORY.with(|m| m.borrow_mut().insert(key.to_vec(), Box::new(value)));
        if let Some(old) = old {
            free_later(old);
        }
        return id;
    }
    keys_changed();
    let value = match replace_ours(ctx, key, Box::new(value)) {
        Ok(old) => {
            free_later(old);
            return id;
        }
        Err(value) => *value,
    };
    {
        // One handle at a time: a second one would free the old value under the first.
        let k = ctx.open_key_writable(key);
        if !k.is_empty() && k.get_value::<FilterValue>(&FILTER_TYPE).is_err() {
            let _ = k.delete();
        }
    }
    let k = ctx.open_key_writable(key);
    if let Err(e) = k.set_value(&FILTER_TYPE, value) {
        crate::server::reply::log(
            ctx,
            crate::server::reply::Level::Warning,
            &format!("libmember: cannot store filter: {e}"),
        );
    }
    id
}

/// Cluster mode: how many filters are held, then each one's key name and persisted form in
/// turn (one payload in memory at a time), for the RDB aux field.
pub fn save_each(count: impl FnOnce(usize), mut each: impl FnMut(&[u8], &[u8])) {
    MEMORY.with(|m| {
        let m = m.borrow();
        count(m.len());
        for (k, v) in m.iter() {
            each(k, &v.to_bytes());
        }
    })
}

/// Cluster mode: forgets every filter (a dataset is about to be loaded in place of this one).
pub fn clear() {
    let old: Vec<Box<FilterValue>> =
        MEMORY.with(|m| m.borrow_mut().drain().map(|(_, v)| v).collect());
    for v in old {
        free_later(v);
    }
}

/// Cluster mode: a filter read back from the RDB aux field (a new value no set trusts yet).
pub fn restore(key: Vec<u8>, value: FilterValue) {
    if let Some(old) = MEMORY.with(|m| m.borrow_mut().insert(key, Box::new(value))) {
        free_later(old);
    }
}

/// Cluster mode: bytes held by all filters, and how many (for INFO).
pub fn memory_totals() -> (usize, usize) {
    MEMORY.with(|m| {
        let m = m.borrow();
        let bytes = m
            .values()
            .map(|v| v.bloom.bytes() + v.known_absent.bytes())
            .sum();
        (bytes, m.len())
    })
}

/// Swaps `value` in for a filter of ours already at `key` (its TTL, if any, kept), returning
/// the old one unfreed; gives `value` back when the key holds no filter of ours.
fn replace_ours(
    ctx: &Context,
    key: &RedisString,
    value: Box<FilterValue>,
) -> Result<Box<FilterValue>, Box<FilterValue>> {
    let mt = *FILTER_TYPE.raw_type.borrow();
    // SAFETY: ctx and key are live; the key handle is closed before returning; the type
    // check guarantees the old value is a FilterValue we stored, whose ownership
    // ReplaceValue hands back to us.
    unsafe {
        let k = raw::RedisModule_OpenKey.unwrap()(
            ctx.ctx,
            key.inner,
            (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int,
        )
        .cast::<raw::RedisModuleKey>();
        if k.is_null() {
            return Err(value);
        }
        let ours = raw::RedisModule_KeyType.unwrap()(k) == raw::REDISMODULE_KEYTYPE_MODULE as c_int
            && raw::RedisModule_ModuleTypeGetType.unwrap()(k) == mt;
        if !ours {
            raw::RedisModule_CloseKey.unwrap()(k);
            return Err(value);
        }
        let new = Box::into_raw(value);
        let mut old: *mut c_void = std::ptr::null_mut();
        let rc = raw::RedisModule_ModuleTypeReplaceValue.unwrap()(k, mt, new.cast(), &mut old);
        raw::RedisModule_CloseKey.unwrap()(k);
        if rc != raw::REDISMODULE_OK as c_int || old.is_null() {
            // Not swapped: take the new value back (nothing else references it).
            return Err(Box::from_raw(new));
        }
        Ok(Box::from_raw(old.cast::<FilterValue>()))
    }
}
