//! A filter the primary replicates after each rebuild (`MEMBER._LOAD`) is verified and
//! decoded on a thread of its own: at 100 M members that is a quarter of a second the
//! replica's main thread (and every client reading from the replica) no longer waits. The
//! main thread only swaps the finished value in, folding in the adds that arrived meanwhile.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crossbeam_channel::{unbounded, Sender};

use redis_module::{raw, Context, RedisString};

use crate::filter::data_type;
use crate::filter::origin::Verdict;
use crate::filter::store;
use crate::filter::value::FilterValue;
use crate::sets::state::{self, PendingLoad};
use crate::{server::mainq, server::metrics, server::reply};

/// Payloads smaller than this are decoded inline: the hand-off would cost more than it saves.
pub const OFF_THREAD_BYTES: usize = 1 << 20;

static NEXT_SEQ: AtomicU64 = AtomicU64::new(1);

/// A payload string kept alive (retained, not copied) while another thread reads it.
struct Retained(*mut raw::RedisModuleString);

// SAFETY: the string is retained for as long as this value lives and nothing writes to it (a
// command argument is immutable once parsed); the other thread only reads its bytes, and the
// release happens on the main thread (`release`).
unsafe impl Send for Retained {}

impl Retained {
    fn new(s: &RedisString) -> Retained {
        // SAFETY: a null context retains for manual release, which `release` does.
        unsafe { raw::RedisModule_RetainString.unwrap()(std::ptr::null_mut(), s.inner) };
        Retained(s.inner)
    }

    fn bytes(&self) -> &[u8] {
        let mut len = 0;
        // SAFETY: the string is alive (retained) and unchanged while self lives.
        unsafe {
            let p = raw::RedisModule_StringPtrLen.unwrap()(self.0, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }

    /// Main thread only.
    fn release(self) {
        // SAFETY: retained in `new` with a null context; released once, on the main thread.
        unsafe { raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), self.0) };
    }
}

/// One decoding job for the loader thread.
type Job = Box<dyn FnOnce() + Send>;

/// The loader thread, started at the first large payload; `None` if it could not be started.
fn loader() -> Option<&'static Sender<Job>> {
    static LOADER: OnceLock<Option<Sender<Job>>> = OnceLock::new();
    LOADER
        .get_or_init(|| {
            let (tx, rx) = unbounded::<Job>();
            std::thread::Builder::new()
                .name("member-load".into())
                .spawn(move || {
                    for job in rx {
                        // A bug in decoding must not take the loader down (the job's result
                        // is then simply never installed; the old filter keeps serving).
                        let _ = catch_unwind(AssertUnwindSafe(job));
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// Starts decoding `payload` for `set` off the main thread, if it is large enough, the set is
/// known and the loader thread runs; otherwise hands `adds` (the journaled hashes that travel
/// with the payload) back for the caller to do it inline.
pub fn start(set: &str, payload: &RedisString, adds: Vec<u128>) -> Result<(), Vec<u128>> {
    if payload.as_slice().len() < OFF_THREAD_BYTES {
        return Err(adds);
    }
    let Some(loader) = loader() else {
        return Err(adds);
    };
    let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
    let Some(incarnation) = state::with(|r| {
        let s = r.sets.get_mut(set)?;
        // A later _LOAD supersedes one still in flight (its result is dropped on arrival).
        s.pending_load = Some(PendingLoad {
            seq,
            journal: Vec::new(),
        });
        Some(s.incarnation)
    }) else {
        return Err(adds);
    };
    let retained = Retained::new(payload);
    let set = set.to_string();
    let job: Job = Box::new(move || {
        let decoded = FilterValue::from_bytes(retained.bytes()).map(|mut v| {
            for h in &adds {
                v.bloom.add(*h);
            }
            v
        });
        mainq::post(Box::new(move |ctx| {
            retained.release();
            finish(ctx, &set, incarnation, seq, decoded)
        }));
    });
    // The receiver lives as long as the loader thread, which never ends.
    let _ = loader.send(job);
    Ok(())
}

/// Main thread: swaps the decoded filter in, with the adds applied since, unless the set was
/// dropped (a new incarnation) or a later `_LOAD` superseded this one.
fn finish(
    ctx: &Context,
    set: &str,
    incarnation: u64,
    seq: u64,
    decoded: Result<FilterValue, String>,
) {
    let journal = state::with(|r| {
        let s = r.sets.get_mut(set)?;
        if s.incarnation != incarnation || s.pending_load.as_ref().map(|p| p.seq) != Some(seq) {
            return None;
        }
        s.pending_load.take().map(|p| p.journal)
    });
    let Some(journal) = journal else {
        if let Ok(v) = decoded {
            data_type::free_later(Box::new(v));
        }
        return;
    };
    let mut v = match decoded {
        Ok(v) => v,
        Err(e) => {
            reply::log(
                ctx,
                reply::Level::Warning,
                &format!("libmember: replicated filter of set '{set}' rejected: {e}"),
            );
            return;
        }
    };
    for h in journal {
        v.add(h);
    }
    install_loaded(ctx, &crate::sets::keys::filter_key(set), Some(set), v, true);
    metrics::global(|m| m.loads_off_thread += 1);
}

/// Stores a filter that arrived whole (`MEMBER._LOAD` from a primary or the AOF, decoded here
/// or inline) at `key`, the filter key of `set` if it is one. A filter of another set, of
/// another database or of unknown origin never serves there (made incomplete, so the set
/// rebuilds its own); the set trusts the value at once only if `live` (as current as the
/// primary's), complete, and made from this node's database for this set (a node that does
/// not know its database yet leaves it to the sync loop to judge).
pub fn install_loaded(
    ctx: &Context,
    key: &RedisString,
    set: Option<&str>,
    mut v: FilterValue,
    live: bool,
) {
    let verdict = set.map(|s| {
        let set_id = state::with(|r| r.sets.get(s).and_then(|s| s.catalog_id));
        v.verdict(s, crate::db::identity::node(), set_id)
    });
    if verdict == Some(Verdict::Foreign) {
        v.cov.complete = false;
    }
    let trust = live && v.cov.complete && verdict == Some(Verdict::Here);
    let id = store::install(ctx, key, v);
    if let Some(set) = set {
        state::with(|r| state::installed(r, set, id, trust));
    }
}
