//! The parts of a MEXISTS or MADD that every node runs the same way: the funnel for many items
//! of a known set, their writes, and the one database statement that resolves them, answered
//! to an `Outlet` (the waiting client, a part of a split call, another node). Used by
//! `batch/mod.rs` (the commands), `wide.rs` (a call split over a cluster) and
//! `forwarded.rs` (another node's part).

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::command::batch::outlet::Outlet;
use crate::command::lookup::{decide_item, LookupDone, Step};
use crate::command::write::{begin, Op, WriteDone};
use crate::command::{forward, AskFirst, PointDone};
use crate::db::sql::Found;
use crate::db::{members, pool, DbErr};
use crate::model::canon::Canon;
use crate::server::block::Completion;
use crate::{filter::store, model::error, sets::state};

/// What a call does with its items.
#[derive(Clone, Copy)]
pub(in crate::command) enum Kind {
    Lookups,
    Writes(Option<f64>),
}

/// How many items ahead MEXISTS prefetches their filter lines (`benches/filter.rs`, batched).
const PREFETCH_AHEAD: usize = 8;

/// The funnel for every item of a known set (main thread, DB 0): answers from memory, and the
/// lookups only the database can resolve.
pub(in crate::command) fn decide_lookups(
    ctx: &Context,
    set: &mut state::SetState,
    epoch: u64,
    canons: Vec<Canon>,
) -> ManyLookups {
    let mut done = ManyLookups {
        answers: Vec::with_capacity(canons.len()),
        pending: Vec::new(),
        result: Err(DbErr::Unavailable(error::WORKER_LOST.into())),
    };
    // Standalone, the filter key is looked up once for the whole call. In cluster mode the
    // filter lives in module memory and each item's slot must be one it covers: every item
    // asks the store as a single lookup does.
    let probe = (!crate::server::cluster_mode::enabled())
        .then(|| store::Probe::open(ctx, (&set.filter_key, &set.filter_ref)));
    // Each item's filter lines are asked for `PREFETCH_AHEAD` items before its probe, so
    // the misses of a filter larger than the caches overlap instead of queueing.
    let hashes: Vec<u128> = canons.iter().map(|c| c.hash).collect();
    let prefetch = |h: u128| {
        if let Some(p) = &probe {
            p.prefetch(h);
        }
    };
    for &h in hashes.iter().take(PREFETCH_AHEAD) {
        prefetch(h);
    }
    for (i, canon) in canons.into_iter().enumerate() {
        if let Some(&h) = hashes.get(i + PREFETCH_AHEAD) {
            prefetch(h);
        }
        match decide_item(ctx, set, epoch, probe.as_ref(), canon, false, None) {
            Step::Done(present, _) => done.answers.push(present),
            Step::Db(lookup) => {
                done.answers.push(false);
                done.pending.push((i, *lookup));
            }
            Step::Unknown | Step::Forward(_) => {
                unreachable!("decide_item answers from memory or the database")
            }
        }
    }
    done
}

/// Every item's write to a known set, canonicalized (nothing is marked yet).
pub(in crate::command) fn writes(
    set: &state::SetState,
    canons: Vec<Canon>,
    expires_at: Option<f64>,
) -> Result<ManyWrites, RedisError> {
    Ok(ManyWrites {
        set: set.def.name.clone(),
        writes: canons
            .into_iter()
            .map(|canon| WriteDone::new(Op::Add, set, canon))
            .collect::<Result<_, _>>()?,
        expires_at,
    })
}

/// One job, one statement: every lookup of the call in one `lookup_many`. However the job
/// ends, the outlet gets exactly one answer (a dropped job answers with the preset error).
pub(in crate::command) fn send_lookups(out: Outlet, done: ManyLookups) {
    let out = out.with_fallback(Box::new(done.clone()));
    pool::run(move |db| {
        let mut done = done;
        let set = done.pending[0].1.target().0.to_string();
        let rows: Vec<(&str, &str)> = done
            .pending
            .iter()
            .map(|(_, l)| {
                let (_, e, s) = l.target();
                (e, s)
            })
            .collect();
        let twins: Vec<&str> = done
            .pending
            .iter()
            .map(|(_, l)| l.twin().unwrap_or_default())
            .collect();
        pool::count_batch(rows.len());
        let res = members::lookup_many(db, &set, &rows, &twins);
        done.result = res;
        out.finish(Box::new(done));
    });
}

/// Marks every item as a recent write (and, for a rotating set's twins in other nodes' slots,
/// asks their owners to mark them first: `write::start`), then one job inserts them all with
/// one multi-row statement (the primary key decides each 1 or 0).
pub(in crate::command) fn send_writes(ctx: &Context, out: Outlet, done: ManyWrites) {
    let asks: Vec<_> = done
        .writes
        .iter()
        .filter_map(WriteDone::twin_begin)
        .collect();
    let writes = done.writes.into_iter().map(begin).collect();
    let done = ManyWrites { writes, ..done };
    let out = out.with_fallback(Box::new(done.clone()));
    if asks.is_empty() {
        return pool::run(move |db| insert(db, out, done));
    }
    let statement = Box::new(move |db: Option<&mut crate::db::Db>| match db {
        Some(db) => insert(db, out, done),
        None => refuse(out, done),
    });
    forward::once_begun(ctx, asks, statement);
}

/// The statement that inserts every item of `done`, on a worker.
fn insert(db: &mut crate::db::Db, out: Outlet, mut done: ManyWrites) {
    let rows: Vec<(&str, &str, Option<f64>)> = done
        .writes
        .iter()
        .map(|w| {
            let (e, s) = w.row();
            (e, s, done.expires_at)
        })
        .collect();
    let twins: Vec<Option<&str>> = done.writes.iter().map(|w| w.twin()).collect();
    pool::count_batch(rows.len());
    let res = members::add_many(db, &done.set, &rows, &twins);
    for (i, w) in done.writes.iter_mut().enumerate() {
        w.answered(match &res {
            Ok(made) => Ok(made[i]),
            Err(e) => Err(e.clone()),
        });
    }
    if done.may_ask_first() {
        out.finish_asking(done);
    } else {
        out.finish(Box::new(done));
    }
}

/// A call none of whose items was stored: a twin's owner did not mark it begun in time.
fn refuse(out: Outlet, mut done: ManyWrites) {
    for w in &mut done.writes {
        w.answered(Err(DbErr::Refused(error::TWIN_NOT_BEGUN)));
    }
    out.finish(Box::new(done));
}

/// A MEXISTS call (or this node's part of one): the answers from memory, and the lookups the
/// database resolves together.
#[derive(Clone)]
pub(in crate::command) struct ManyLookups {
    /// One per item, in call order; the places of `pending` are filled by `apply`.
    pub(in crate::command) answers: Vec<bool>,
    /// (position, lookup) of every item only the database can answer.
    pub(in crate::command) pending: Vec<(usize, LookupDone)>,
    /// The database's answer for each of `pending`, in order.
    result: Result<Vec<Found>, DbErr>,
}

impl Completion for ManyLookups {
    /// Each lookup's own effects (counters, fp-cache, cache fill), as for MEMBER.EXISTS.
    fn apply(&mut self, ctx: &Context) {
        for (k, (i, lookup)) in self.pending.iter_mut().enumerate() {
            let res = match &self.result {
                Ok(found) => Ok(found[k]),
                Err(e) => Err(e.clone()),
            };
            if let Ok(found) = &res {
                self.answers[*i] = found.is_member();
            }
            lookup.answered(res);
            lookup.apply(ctx);
        }
    }

    /// The whole array, or (any lookup failed or timed out) one error: never a partial array.
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        if !self.pending.is_empty() {
            if let Err(e) = &self.result {
                return Err(RedisError::String(e.reply_text()));
            }
        }
        Ok(RedisValue::Array(
            self.answers
                .iter()
                .map(|&b| RedisValue::Integer(b as i64))
                .collect(),
        ))
    }
}

/// A MADD call (or this node's part of one): every item's write, answered by one multi-row
/// insert.
#[derive(Clone)]
pub(in crate::command) struct ManyWrites {
    set: String,
    writes: Vec<WriteDone>,
    expires_at: Option<f64>,
}

impl AskFirst for ManyWrites {
    fn may_ask_first(&self) -> bool {
        self.writes.iter().any(AskFirst::may_ask_first)
    }

    /// Every item's twin effect for another node (`WriteDone::ask_first`).
    fn ask_first(&self) -> Vec<(u16, crate::cluster::wire::Request)> {
        self.writes.iter().flat_map(AskFirst::ask_first).collect()
    }
}

impl Completion for ManyWrites {
    /// Each item's effects as for MEMBER.ADD: filter bit, cache invalidation, replication,
    /// recent-writes mark ended.
    fn apply(&mut self, ctx: &Context) {
        for w in &mut self.writes {
            w.apply(ctx);
        }
    }

    fn reply(&mut self, ctx: &Context) -> RedisResult {
        let mut out = Vec::with_capacity(self.writes.len());
        for w in &mut self.writes {
            match w.reply(ctx)? {
                v @ RedisValue::Integer(_) => out.push(v),
                _ => return Err(RedisError::Str(error::INTERNAL)),
            }
        }
        Ok(RedisValue::Array(out))
    }
}
