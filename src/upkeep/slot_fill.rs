//! Cluster mode: slot fills (docs/cluster-placement.md, "Each node's filter holds its own slots").
//! A node's filter covers the slots it owned when it was built; a slot that arrives later (a
//! reshard, a failover) is filled in place: its rows are read in one snapshot on a thread of its
//! own and their bits added to the filter, which then covers the slot. From the moment a fill
//! starts, sync passes apply the slot's rows too (`SetState::cover_extra`), so nothing committed
//! after the fill's snapshot is missed. A fill whose filter was replaced meanwhile (a rebuild's
//! swap, a replicated or reloaded filter) is discarded and the slots are filled again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use redis_module::{Context, RedisString};

use crate::cluster::owner;
use crate::db::{self, DbErr};
use crate::model::slotset::SlotSet;
use crate::sets::state::{self, Rebuild, SetDef};
use crate::{config, filter::store, server::mainq, server::reply};

/// Fills running at once, over all sets (each holds a database connection and a thread).
const MAX_RUNNING: usize = 2;

const RETRY_AFTER: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Fills {
    running: usize,
    /// Sets whose last fill failed, and when to try again.
    retry: HashMap<String, Instant>,
    done: u64,
    failed: u64,
}

thread_local! {
    static FILLS: RefCell<Fills> = RefCell::new(Fills::default());
}

/// Fills completed and failed since start (INFO).
pub fn counters() -> (u64, u64) {
    FILLS.with(|f| {
        let f = f.borrow();
        (f.done, f.failed)
    })
}

/// Starts a fill for every set whose filter lacks slots this node owns (main-thread timer).
pub fn schedule(ctx: &Context) {
    let now = Instant::now();
    if FILLS.with(|f| f.borrow().running >= MAX_RUNNING) {
        return;
    }
    let owned = owner::owned_set();
    let candidates: Vec<(String, RedisString)> = state::with(|r| {
        r.sets
            .values()
            .filter(|s| matches!(s.rebuild, Rebuild::Idle) && s.filling.is_none())
            .map(|s| (s.def.name.clone(), s.filter_key.clone()))
            .collect()
    });
    for (name, key) in candidates {
        let waiting = FILLS.with(|f| f.borrow().retry.get(&name).is_some_and(|t| now < *t));
        if waiting {
            continue;
        }
        let lacking = store::with(ctx, &key, |f| {
            f.slots.as_ref().map(|s| (owned.minus(s), f.id))
        })
        .flatten();
        let Some((missing, id)) = lacking.filter(|(m, _)| !m.is_empty()) else {
            continue;
        };
        start(ctx, &name, id, missing);
        if FILLS.with(|f| f.borrow().running >= MAX_RUNNING) {
            return;
        }
    }
}

fn start(ctx: &Context, name: &str, id: u64, missing: SlotSet) {
    let Some((def, incarnation)) = state::with(|r| {
        let s = r.sets.get_mut(name)?;
        s.filling = Some(missing.clone());
        s.cover_extra
            .get_or_insert_with(Default::default)
            .union_with(&missing);
        Some((s.def.clone(), s.incarnation))
    }) else {
        return;
    };
    reply::log(
        ctx,
        reply::Level::Notice,
        &format!(
            "libmember: set '{name}': filling {} slot(s) that arrived on this node",
            missing.len()
        ),
    );
    FILLS.with(|f| f.borrow_mut().running += 1);
    let name = name.to_string();
    let job = Job {
        name,
        incarnation,
        id,
        missing,
    };
    let spawned = std::thread::Builder::new()
        .name("member-fill".into())
        .spawn({
            let def = def.clone();
            let slots = job.missing.clone();
            move || {
                mainq::yield_to_the_server();
                let res = catch_unwind(AssertUnwindSafe(|| read(&def, &slots)))
                    .unwrap_or_else(|_| Err(DbErr::Failed("slot fill panicked".into())));
                mainq::post(Box::new(move |ctx| finish(ctx, job, res)));
            }
        });
    if let Err(e) = spawned {
        reply::log(
            ctx,
            reply::Level::Warning,
            &format!("libmember: cannot start a slot fill: {e}"),
        );
        FILLS.with(|f| f.borrow_mut().running -= 1);
    }
}

/// On the fill's thread: the rows of `slots`, hashed.
fn read(def: &SetDef, slots: &SlotSet) -> Result<Vec<u128>, DbErr> {
    let mut c = db::connect_build()?;
    db::keyslot::ensure_slot_column(&mut c, &def.name, config::db_timeout_ms())
        .map_err(|e| db::classify(&e))?;
    let progress = AtomicU64::new(0);
    let (rows, _, _) = db::build::read_hashes(&mut c, def, Some(slots), &progress, None)?;
    // A fill's rows are those of a few slots: added to the filter in one step on the main
    // thread.
    rows.to_vec()
        .map_err(|e| DbErr::Failed(format!("cannot read a slot fill's rows back: {e}")))
}

struct Job {
    name: String,
    incarnation: u64,
    /// The filter value the fill is for.
    id: u64,
    missing: SlotSet,
}

fn finish(ctx: &Context, job: Job, res: Result<Vec<u128>, DbErr>) {
    FILLS.with(|f| f.borrow_mut().running -= 1);
    let key = state::with(|r| {
        let s = r.sets.get_mut(&job.name)?;
        if s.incarnation != job.incarnation {
            return None;
        }
        if s.filling.as_ref() == Some(&job.missing) {
            s.filling = None;
        }
        Some(s.filter_key.clone())
    });
    let Some(key) = key else {
        return;
    };
    match res {
        Ok(hashes) => {
            let applied = store::with_mut(ctx, &key, |f| {
                if f.id != job.id {
                    return false;
                }
                for h in &hashes {
                    f.add(*h);
                }
                if let Some(slots) = &mut f.slots {
                    slots.union_with(&job.missing);
                }
                true
            });
            if applied == Some(true) {
                FILLS.with(|f| {
                    let mut f = f.borrow_mut();
                    f.done += 1;
                    f.retry.remove(&job.name);
                });
                reply::log(
                    ctx,
                    reply::Level::Notice,
                    &format!(
                        "libmember: set '{}': filled {} slot(s), {} members",
                        job.name,
                        job.missing.len(),
                        hashes.len()
                    ),
                );
            }
        }
        Err(e) => {
            FILLS.with(|f| {
                let mut f = f.borrow_mut();
                f.failed += 1;
                f.retry
                    .insert(job.name.clone(), Instant::now() + RETRY_AFTER);
            });
            reply::log(
                ctx,
                reply::Level::Warning,
                &format!(
                    "libmember: slot fill of set '{}' failed: {}",
                    job.name,
                    e.reply_text()
                ),
            );
        }
    }
}
