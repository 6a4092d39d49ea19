//! MEMBER.MEXISTS and MEMBER.MADD: many items of one set in one call, each decided exactly as
//! MEMBER.EXISTS / MEMBER.ADD would, with one blocked client and one database statement for all.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use super::lookup::{decide_item, LookupDone, Step};
use super::retry::after_catalog;
use super::write::{begin, expiry, Op, WriteDone};
use super::{block_timeout, may_block, ManyArgs, PointDone};
use crate::db::sql::Found;
use crate::db::{pool, sql, DbErr};
use crate::model::canon::Canon;
use crate::server::block::{Blocked, Completion};
use crate::{config::token_key, filter::store, model::error, sets::keys, sets::state};

/// Most items one MEXISTS or MADD may name (`error::TOO_MANY_ITEMS`): it bounds the
/// main-thread work of one call (probes, or each ADD's effects) to about a millisecond.
pub const MAX_ITEMS: usize = 1000;

/// MEMBER.MEXISTS <set> [SCOPE <scope>] ITEMS <item> [<item> …]
pub fn mexists(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let a = parse(ctx, args, &[])?;
    crate::sets::acl::check_set(ctx, &a.set, crate::sets::acl::Access::Read)?;
    let items: Vec<&[u8]> = a.items.iter().map(|i| i.as_slice()).collect();
    keys::with_db0(ctx, |ctx| {
        let Some(mut done) = plan_lookups(ctx, &a.set, &items, a.scope(), false)? else {
            return ask_catalog(ctx, &a, Kind::Lookups);
        };
        if done.pending.is_empty() {
            return done.reply(ctx);
        }
        may_block(ctx)?;
        let blocked = Blocked::block(ctx, block_timeout(), Box::new(done.clone()));
        send_lookups(blocked, done);
        Ok(RedisValue::NoReply)
    })
}

/// MEMBER.MADD <set> [SCOPE <scope>] [TTL <s> | EXPIREAT <unix-s>] ITEMS <item> [<item> …]
pub fn madd(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let a = parse(ctx, args, &["TTL", "EXPIREAT"])?;
    crate::sets::acl::check_set(ctx, &a.set, crate::sets::acl::Access::Write)?;
    let expires_at = expiry(&a.opts)?;
    let items: Vec<&[u8]> = a.items.iter().map(|i| i.as_slice()).collect();
    keys::with_db0(ctx, |ctx| {
        let Some(done) = plan_writes(&a.set, &items, a.scope(), expires_at, false)? else {
            return ask_catalog(ctx, &a, Kind::Writes(expires_at));
        };
        may_block(ctx)?;
        let blocked = Blocked::block(ctx, block_timeout(), Box::new(done.clone()));
        send_writes(blocked, done);
        Ok(RedisValue::NoReply)
    })
}

/// The checks every multi-item call passes before anything is done: not in cluster mode (see
/// README, Cluster), the syntax, and the item count.
fn parse(
    ctx: &Context,
    args: Vec<RedisString>,
    extra: &[&'static str],
) -> Result<ManyArgs, RedisError> {
    if ctx.get_flags().contains(ContextFlags::CLUSTER) {
        return Err(RedisError::Str(error::MANY_IN_CLUSTER));
    }
    let a = ManyArgs::parse(args, extra)?;
    if a.items.len() > MAX_ITEMS {
        return Err(RedisError::Str(error::TOO_MANY_ITEMS));
    }
    Ok(a)
}

#[derive(Clone, Copy)]
enum Kind {
    Lookups,
    Writes(Option<f64>),
}

/// A set this node does not know: asks the catalog (only this client waits), then runs the
/// call as if it had just arrived.
fn ask_catalog(ctx: &Context, a: &ManyArgs, kind: Kind) -> RedisResult {
    let name = a.set.clone();
    let scope = a.scope().to_vec();
    let items: Vec<Vec<u8>> = a.items.iter().map(|i| i.as_slice().to_vec()).collect();
    after_catalog(
        ctx,
        &a.set,
        block_timeout(),
        move |ctx| {
            let items: Vec<&[u8]> = items.iter().map(|i| i.as_slice()).collect();
            Ok(match kind {
                Kind::Lookups => {
                    plan_lookups(ctx, &name, &items, &scope, true)?.map(Planned::Lookups)
                }
                Kind::Writes(exp) => {
                    plan_writes(&name, &items, &scope, exp, true)?.map(Planned::Writes)
                }
            })
        },
        |_, blocked, planned| match planned {
            Planned::Lookups(done) if done.pending.is_empty() => blocked.finish(Box::new(done)),
            Planned::Lookups(done) => send_lookups(blocked, done),
            Planned::Writes(done) => send_writes(blocked, done),
        },
    )
}

/// A call planned once its set is known.
enum Planned {
    Lookups(ManyLookups),
    Writes(ManyWrites),
}

/// Canonicalizes every item under the set's policy; the first that fails fails the call,
/// naming its position (a bad scope is named as such).
fn canonical_all<'a>(
    set: &state::SetState,
    items: &[&'a [u8]],
    scope: &'a [u8],
) -> Result<Vec<Canon<'a>>, RedisError> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            token_key::canonical(&set.def, item, scope).map_err(|e| {
                if !error::names_item(e) {
                    RedisError::Str(e)
                } else {
                    RedisError::String(error::at_item(i + 1, e))
                }
            })
        })
        .collect()
}

/// How many items ahead MEXISTS prefetches their filter lines (`benches/filter.rs`, batched).
const PREFETCH_AHEAD: usize = 8;

/// The funnel for every item (main thread, DB 0): answers from memory, and the lookups only
/// the database can resolve. `None` when the catalog must be asked about the set first.
fn plan_lookups(
    ctx: &Context,
    set_name: &str,
    items: &[&[u8]],
    scope: &[u8],
    confirmed: bool,
) -> Result<Option<ManyLookups>, RedisError> {
    state::with(|r| {
        let epoch = r.epoch;
        let set = r.serving(set_name, confirmed);
        let Some(set) = set else {
            return Ok(None);
        };
        let canons = canonical_all(set, items, scope)?;
        let mut done = ManyLookups {
            answers: Vec::with_capacity(canons.len()),
            pending: Vec::new(),
            result: Err(DbErr::Unavailable(error::WORKER_LOST.into())),
        };
        // The filter key is looked up once for the whole call.
        let probe = store::Probe::open(ctx, &set.filter_key);
        // Each item's filter lines are asked for `PREFETCH_AHEAD` items before its probe, so
        // the misses of a filter larger than the caches overlap instead of queueing.
        let hashes: Vec<u128> = canons.iter().map(|c| c.hash).collect();
        for &h in hashes.iter().take(PREFETCH_AHEAD) {
            probe.prefetch(h);
        }
        for (i, canon) in canons.into_iter().enumerate() {
            if let Some(&h) = hashes.get(i + PREFETCH_AHEAD) {
                probe.prefetch(h);
            }
            match decide_item(ctx, set, epoch, Some(&probe), canon, false, None) {
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
        Ok(Some(done))
    })
}

/// Every item's write, canonicalized (nothing is marked yet). `None` when the catalog must be
/// asked about the set first.
fn plan_writes(
    set_name: &str,
    items: &[&[u8]],
    scope: &[u8],
    expires_at: Option<f64>,
    confirmed: bool,
) -> Result<Option<ManyWrites>, RedisError> {
    state::with(|r| {
        let set = r.serving(set_name, confirmed);
        let Some(set) = set else {
            return Ok(None);
        };
        if set.def.source.is_some() && expires_at.is_some() {
            return Err(RedisError::Str(error::SOURCE_NO_EXPIRY));
        }
        let writes = canonical_all(set, items, scope)?
            .into_iter()
            .map(|canon| WriteDone::new(Op::Add, set, canon))
            .collect();
        Ok(Some(ManyWrites {
            set: set_name.to_string(),
            writes,
            expires_at,
        }))
    })
}

/// One job, one statement: every lookup of the call in one `lookup_many`. However the job
/// ends, the client gets exactly one reply (a dropped job answers with the preset error).
fn send_lookups(blocked: Blocked, done: ManyLookups) {
    let blocked = blocked.with_fallback(Box::new(done.clone()));
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
        pool::count_batch(rows.len());
        let res = sql::lookup_many(db, &set, &rows);
        done.result = res;
        blocked.finish(Box::new(done));
    });
}

/// Marks every item as a recent write, then one job inserts them all with one multi-row
/// statement (the primary key decides each 1 or 0).
fn send_writes(blocked: Blocked, done: ManyWrites) {
    let writes = done.writes.into_iter().map(begin).collect();
    let done = ManyWrites { writes, ..done };
    let blocked = blocked.with_fallback(Box::new(done.clone()));
    pool::run(move |db| {
        let mut done = done;
        let rows: Vec<(&str, &str, Option<f64>)> = done
            .writes
            .iter()
            .map(|w| {
                let (e, s) = w.row();
                (e, s, done.expires_at)
            })
            .collect();
        pool::count_batch(rows.len());
        let res = sql::add_many(db, &done.set, &rows);
        for (i, w) in done.writes.iter_mut().enumerate() {
            w.answered(match &res {
                Ok(made) => Ok(made[i]),
                Err(e) => Err(e.clone()),
            });
        }
        blocked.finish(Box::new(done));
    });
}

/// A MEXISTS call: the answers from memory, and the lookups the database resolves together.
#[derive(Clone)]
struct ManyLookups {
    /// One per item, in call order; the places of `pending` are filled by `apply`.
    answers: Vec<bool>,
    /// (position, lookup) of every item only the database can answer.
    pending: Vec<(usize, LookupDone)>,
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

/// A MADD call: every item's write, answered by one multi-row insert.
#[derive(Clone)]
struct ManyWrites {
    set: String,
    writes: Vec<WriteDone>,
    expires_at: Option<f64>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_and_its_error_text_agree() {
        assert!(error::TOO_MANY_ITEMS.contains(&format!("at most {MAX_ITEMS} per call")));
    }

    #[test]
    fn an_item_error_names_its_position() {
        assert_eq!(
            error::at_item(3, error::EMPTY_ITEM),
            "ERR item 3: item is empty"
        );
    }
}
