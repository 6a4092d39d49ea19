//! MEMBER.EXISTS and MEMBER.EXPLAIN: the funnel, filter → recent → cache → database.

use std::time::Instant;

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::cluster::owner;
use crate::cluster::wire::Op;
use crate::command::forward::{self, Elsewhere};
use crate::command::retry::after_catalog;
use crate::command::{block_on_point, block_timeout, may_block, point_for, ItemArgs, PointDone};
use crate::db::pool::{self, Job};
use crate::db::sql::Found;
use crate::db::DbErr;
use crate::model::funnel::{self, Gate, Path};
use crate::model::slot::keyslot;
use crate::server::block::Completion;
use crate::server::block::Fail;
use crate::{filter::store, model::error, server::metrics, sets::keys, sets::state};

pub(in crate::command) fn reply(explain: bool, present: bool, path: Path) -> RedisValue {
    if explain {
        RedisValue::Array(vec![
            RedisValue::Integer(present as i64),
            RedisValue::SimpleStringStatic(path.name()),
        ])
    } else {
        RedisValue::Integer(present as i64)
    }
}

/// Records a decided EXISTS (EXPLAIN is diagnostic and not counted). Latency is measured
/// on a sample of calls (`started` is set for those).
fn record(set: &mut state::SetState, explain: bool, path: Path, started: Option<Instant>) {
    if explain {
        return;
    }
    set.stats.record(path);
    metrics::global(|m| {
        m.paths.record(path);
        if let Some(t) = started {
            m.exists_latency.record_sample(t.elapsed());
        }
    });
}

/// MEMBER.EXPLAIN <set> <item> [SCOPE <scope>]: the answer and the path that decided it.
pub fn explain(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    lookup(ctx, args, true)
}

/// MEMBER.EXISTS and MEMBER.EXPLAIN through the generic parser.
pub fn lookup(ctx: &Context, args: Vec<RedisString>, explain: bool) -> RedisResult {
    let started = metrics::sample_start();
    let a = ItemArgs::parse(args, &[])?;
    funnel(
        ctx,
        Lookup {
            set: &a.set,
            item: a.item.as_slice(),
            scope: a.scope(),
            explain,
            started,
        },
    )
}

/// MEMBER.EXISTS straight from the argument bytes, with nothing copied or retained: the hot
/// path. `None` for any shape the generic parser must judge (it then gives the same errors).
pub fn exists_fast(ctx: &Context, argv: &[&[u8]]) -> Option<RedisResult> {
    let started = metrics::sample_start();
    let (set, item, scope) = fast_shape(argv)?;
    Some(funnel(
        ctx,
        Lookup {
            set,
            item,
            scope,
            explain: false,
            started,
        },
    ))
}

/// One lookup as the client sent it: the set, the item and its scope before
/// canonicalization, whether it is an EXPLAIN, and when it started (a sampled call).
#[derive(Clone, Copy)]
struct Lookup<'a> {
    set: &'a str,
    item: &'a [u8],
    scope: &'a [u8],
    explain: bool,
    started: Option<Instant>,
}

/// A [`Lookup`] kept while the catalog is asked about its set.
struct Kept {
    set: String,
    item: Vec<u8>,
    scope: Vec<u8>,
    explain: bool,
    started: Option<Instant>,
}

impl Lookup<'_> {
    fn keep(self) -> Kept {
        Kept {
            set: self.set.to_string(),
            item: self.item.to_vec(),
            scope: self.scope.to_vec(),
            explain: self.explain,
            started: self.started,
        }
    }
}

impl Kept {
    fn lookup(&self) -> Lookup<'_> {
        Lookup {
            set: &self.set,
            item: &self.item,
            scope: &self.scope,
            explain: self.explain,
            started: self.started,
        }
    }
}

/// The one shape the hot path reads in place, `<cmd> <set> <item> [SCOPE <scope>]` with a
/// valid set name, as (set, item, scope): what `ItemArgs::parse` makes of the same arguments.
/// `None` for any other shape (the generic parser judges it and gives the errors). Pure.
pub fn fast_shape<'a>(argv: &[&'a [u8]]) -> Option<(&'a str, &'a [u8], &'a [u8])> {
    let (set, item, scope): (&[u8], &[u8], &[u8]) = match *argv {
        [_, set, item] => (set, item, b""),
        [_, set, item, opt, scope] if opt.eq_ignore_ascii_case(b"SCOPE") => (set, item, scope),
        _ => return None,
    };
    if !crate::command::valid_set_name(set) {
        return None;
    }
    // SAFETY: valid_set_name admits only ASCII lowercase letters, digits and '_'.
    let set = unsafe { std::str::from_utf8_unchecked(set) };
    Some((set, item, scope))
}

/// Where the funnel got without waiting for anything.
pub(in crate::command) enum Step {
    /// Answered from memory: present or not, and the tier that decided.
    Done(bool, Path),
    /// Only the database can answer (boxed, as `Forward`: the answers from memory, by far the
    /// most frequent, then move a few bytes instead of the whole lookup twice per call).
    Db(Box<LookupDone>),
    /// This node does not know the set (yet): the catalog must be asked.
    Unknown,
    /// The item's canonical slot is another node's: it must answer (cluster mode).
    Forward(Box<Elsewhere>),
}

/// The funnel on parsed arguments: filter → recent → cache → database. A set this node does
/// not know is looked up in the catalog first (only this client waits).
fn funnel(ctx: &Context, q: Lookup) -> RedisResult {
    crate::sets::acl::check_set(ctx, q.set, crate::sets::acl::Access::Read)?;
    keys::with_db0(ctx, |ctx| match decide(ctx, q, false)? {
        Step::Done(present, path) => Ok(reply(q.explain, present, path)),
        Step::Db(done) => {
            may_block(ctx)?;
            pool::submit(Job::Lookup(block_on_point(ctx, *done)));
            Ok(RedisValue::NoReply)
        }
        Step::Forward(e) => forward::block_and_start(ctx, *e),
        Step::Unknown => {
            let (kept, explain) = (q.keep(), q.explain);
            after_catalog(
                ctx,
                q.set,
                block_timeout(),
                move |ctx| match decide(ctx, kept.lookup(), true)? {
                    Step::Unknown => Ok(None),
                    step => Ok(Some(step)),
                },
                move |ctx, blocked, step| match step {
                    Step::Done(present, path) => blocked.finish(Box::new(Answered {
                        explain,
                        present,
                        path,
                    })),
                    Step::Db(done) => pool::submit(Job::Lookup(point_for(blocked, *done))),
                    Step::Forward(e) => forward::start(ctx, blocked, *e),
                    Step::Unknown => blocked.finish(Box::new(Fail(error::UNKNOWN_SET.into()))),
                },
            )
        }
    })
}

/// The funnel's decision for a set this node knows, with DB 0 selected: an answer from
/// memory, the lookup the database must resolve, or (cluster mode) the request for the node
/// holding the item's canonical slot. `confirmed`: the catalog was just asked about this set
/// (it serves even while a promotion holds sets back).
fn decide(ctx: &Context, q: Lookup, confirmed: bool) -> Result<Step, RedisError> {
    state::with(|r| {
        let epoch = r.epoch;
        let set = r.serving(q.set, confirmed);
        let Some(set) = set else {
            return Ok(Step::Unknown);
        };
        let canon = crate::config::token_key::canonical(&set.def, q.item, q.scope)
            .map_err(RedisError::Str)?;
        let op = if q.explain { Op::Explain } else { Op::Exists };
        if let Some(e) = forward::elsewhere(q.item, &canon, q.set, op, None) {
            return Ok(Step::Forward(Box::new(e)));
        }
        Ok(decide_item(
            ctx, set, epoch, None, canon, q.explain, q.started,
        ))
    })
}

/// The funnel's decision for an item already canonical, forwarded by another node (this one
/// holds its slot): `Step::Unknown` for a set this node does not serve yet.
pub(in crate::command) fn decide_canonical(
    ctx: &Context,
    set_name: &str,
    canon: crate::model::canon::Canon,
    explain: bool,
) -> Step {
    state::with(|r| {
        let epoch = r.epoch;
        match r.serving(set_name, false) {
            Some(set) => decide_item(ctx, set, epoch, None, canon, explain, None),
            None => Step::Unknown,
        }
    })
}

/// The funnel for one canonical item of a known set (`epoch`: the registry's promotion
/// epoch): filter → recent → cache, counted in the per-path counters (unless `explain`).
/// Never `Step::Unknown` nor `Step::Forward`. The one decision single- and multi-item lookups share; `probe` is
/// the set's filter already opened (many items), or `None` to open it for this one.
pub(in crate::command) fn decide_item(
    ctx: &Context,
    set: &mut state::SetState,
    epoch: u64,
    probe: Option<&store::Probe>,
    canon: crate::model::canon::Canon,
    explain: bool,
    started: Option<Instant>,
) -> Step {
    let cluster = crate::server::cluster_mode::enabled();
    let slot = cluster.then(|| keyslot(canon.entity.as_bytes()));
    let current = set.synced_epoch == epoch;
    let (mut view, mut filter_id) = if current {
        match probe {
            Some(p) => p.view(canon.hash, set.trusted),
            None => store::view(
                ctx,
                (&set.filter_key, &set.filter_ref),
                canon.hash,
                set.trusted,
                slot,
            ),
        }
    } else {
        // Promoted and not caught up since: the filter may miss acknowledged ADDs.
        (funnel::FilterView::Incomplete, None)
    };
    // In a cluster, a negative is believed only for a slot the filter covers (above) and this
    // node has held long enough (cluster/owner.rs); a hit goes on to cache and database.
    if let Some(slot) = slot {
        if view.is_negative() && !owner::ready(slot, set.covered_since) {
            (view, filter_id) = (funnel::FilterView::Incomplete, None);
        }
    }
    let gate = funnel::gate(
        view,
        || set.is_recent(canon.hash),
        || set.is_deleting(canon.hash),
    );
    let decided = match gate {
        Gate::Absent => Some((false, Path::BloomNegative)),
        Gate::KnownAbsent => Some((false, Path::FpCache)),
        Gate::Possible if cluster && !owner::may_cache(&canon.entity) => None,
        Gate::Possible => {
            let key = keys::cache_key(ctx, &set.cache_prefix, &canon);
            keys::cache_hit(ctx, &key, set.incarnation).then_some((true, Path::CacheHit))
        }
        Gate::Recent => None,
    };
    if !explain {
        // An fp-cache answer for a member that lapsed is not the filter's false positive.
        let lapsed = matches!(gate, Gate::KnownAbsent) && set.lapsed.contains(canon.hash);
        // The filter's verdict and, when memory decided, the path and a latency sample: one
        // pass over the set's counters and one borrow of the module's.
        let counts = |c: &mut metrics::PathCounters| {
            c.exists += 1;
            if !current {
                c.withheld += 1;
            }
            if lapsed {
                c.lapsed += 1;
                c.lapsed_cached += 1;
            }
            match view {
                funnel::FilterView::Incomplete => c.filter_incomplete += 1,
                funnel::FilterView::Complete { contains: true }
                | funnel::FilterView::KnownAbsent => c.bloom_positive += 1,
                _ => {}
            }
            if let Some((_, path)) = decided {
                c.record(path);
            }
        };
        counts(&mut set.stats);
        metrics::global(|m| {
            counts(&mut m.paths);
            if let (Some(t), Some(_)) = (started, decided) {
                m.exists_latency.record_sample(t.elapsed());
            }
        });
    }
    if let Some((present, path)) = decided {
        return Step::Done(present, path);
    }
    // A filter hit that the database then finds absent is remembered against this
    // very filter (see known_absent.rs); an incomplete filter remembers nothing.
    let remember = match view {
        funnel::FilterView::Complete { contains: true } => filter_id,
        _ => None,
    };
    // While the set's key rotates and this node computes the old form, the database is asked
    // the new form too, whichever form the item's row holds now. A node that cannot compute it
    // (its ring lacks the key, which the rotation's start and a reload refuse) asks the old
    // form alone.
    let twin = crate::sets::rotation::twin_of(set, &canon.entity, canon.scope)
        .ok()
        .flatten();
    Step::Db(Box::new(LookupDone {
        set: set.def.name.clone(),
        twin,
        entity: canon.entity.into_owned(),
        scope: canon.scope.to_string(),
        gate,
        hash: canon.hash,
        remember,
        asked: Instant::now(),
        generation: set.generation,
        history: crate::db::identity::generation(),
        incarnation: set.incarnation,
        started,
        explain,
        result: Err(DbErr::Unavailable(error::WORKER_LOST.into())),
    }))
}

/// An answer from memory for a client that waited for the catalog.
struct Answered {
    explain: bool,
    present: bool,
    path: Path,
}

impl Completion for Answered {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        Ok(reply(self.explain, self.present, self.path))
    }
}

/// A database lookup's answer, applied and replied on the main thread.
#[derive(Clone)]
pub(in crate::command) struct LookupDone {
    set: String,
    entity: String,
    scope: String,
    /// While the set's key rotates, the item's new form, asked beside it
    /// (`sets::rotation::twin_of`).
    twin: Option<String>,
    gate: Gate,
    hash: u128,
    /// The trusted filter that let the item through, if any.
    remember: Option<u64>,
    /// When the lookup was sent to the database (before it read anything).
    asked: Instant,
    generation: u64,
    /// The database identity's generation when the lookup began: an answer read from a
    /// history the node no longer follows (docs/failover.md) remembers and fills nothing.
    history: u64,
    /// The set's incarnation when the lookup began: an answer about a set dropped since
    /// (and maybe created again) fills nothing.
    incarnation: u64,
    started: Option<Instant>,
    explain: bool,
    result: Result<Found, DbErr>,
}

impl LookupDone {
    fn path(&self) -> Option<Path> {
        match &self.result {
            Ok(found) => Some(funnel::db_path(self.gate, found.is_member())),
            Err(_) => None,
        }
    }
}

impl crate::command::AskFirst for LookupDone {}

impl PointDone<Found> for LookupDone {
    fn target(&self) -> (&str, &str, &str) {
        (&self.set, &self.entity, &self.scope)
    }
    fn answered(&mut self, res: Result<Found, DbErr>) {
        self.result = res;
    }
    fn twin(&self) -> Option<&str> {
        self.twin.as_deref()
    }
}

impl Completion for LookupDone {
    fn apply(&mut self, ctx: &Context) {
        let is_replica = ctx.get_flags().contains(ContextFlags::SLAVE);
        let path = self.path();
        state::with(|r| {
            let Some(set) = r.sets.get_mut(&self.set) else {
                return;
            };
            if set.incarnation != self.incarnation {
                return;
            }
            // A filter hit the database answers absent: the filter's false positive, or a
            // member that lapsed since the filter was built (deleted, expired, inactive: a
            // lapsed row is noted first, so the lapsed filter answers for both).
            if let Ok(Found::Lapsed) = self.result {
                set.lapsed.note(self.hash);
            }
            let absent = matches!(self.result, Ok(f) if !f.is_member());
            let lapsed = absent && set.lapsed.contains(self.hash);
            let passed = self.remember.is_some() && absent && !self.explain;
            // EXPLAIN's call and path are not counted; a database error it met is (that
            // counter describes the database, like db_timeouts).
            match path {
                Some(p) => record(set, self.explain, p, self.started),
                None => {
                    set.stats.db_errors += 1;
                    metrics::global(|m| m.paths.db_errors += 1);
                }
            }
            if self.history != crate::db::identity::generation() {
                return;
            }
            if passed && lapsed {
                set.stats.lapsed += 1;
                metrics::global(|m| m.paths.lapsed += 1);
            } else if passed {
                set.stats.false_positives += 1;
                metrics::global(|m| m.paths.false_positives += 1);
            }
            // A false positive confirmed by the database: remember it, unless the item was
            // added since the lookup was asked (it may have read the table before an ADD or
            // an outside write of it committed; remember_absent checks).
            if let (Ok(Found::Lapsed | Found::Absent), Some(id)) = (&self.result, self.remember) {
                let (key, ttl, trusted) = (&set.filter_key, set.def.cache_ttl, set.trusted);
                let (hash, asked) = (self.hash, self.asked);
                crate::filter::store::remember_absent(ctx, key, id, trusted, hash, asked, ttl);
                return;
            }
            if let Ok(Found::Member(_)) = self.result {
                // Present now: an older lookup's "absent" must not outlive this answer.
                crate::filter::store::forget_absent(ctx, &set.filter_key, self.hash);
                if self.remember.is_none() {
                    // No trusted filter could answer for it (missing, incomplete, another
                    // history, a rebuild's): the filter that answers next takes it, so an
                    // item that answered 1 never answers 0 from a build whose catch-up read
                    // the log before the row committed (docs/sync.md, "A rebuild's window").
                    set.journal(self.hash);
                    if !is_replica {
                        crate::filter::store::add(ctx, &set.filter_key, self.hash);
                    }
                }
            }
            // Cache-aside fill, unless an ADD/DEL of this set landed since the lookup began
            // (it may have read a row a concurrent DEL removed), a DEL of it is in flight (a
            // rotating set's, in a cluster: `funnel::gate`), or this node is a replica.
            if let Ok(Found::Member(expires_at)) = self.result {
                if set.generation != self.generation || is_replica || set.is_deleting(self.hash) {
                    return;
                }
                if crate::server::cluster_mode::enabled() && !owner::may_cache(&self.entity) {
                    return;
                }
                let now = funnel::now_s();
                if let Some(ttl) = funnel::cache_ttl_ms(set.def.cache_ttl, expires_at, now) {
                    let canon = crate::model::canon::Canon {
                        hash: 0,
                        entity: std::borrow::Cow::Borrowed(&self.entity),
                        scope: &self.scope,
                    };
                    let key = keys::cache_key(ctx, &set.cache_prefix, &canon);
                    let ttl = std::time::Duration::from_millis(ttl);
                    keys::cache_fill(ctx, &key, self.incarnation, ttl);
                }
            }
        });
    }

    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match &self.result {
            Ok(found) => {
                let present = found.is_member();
                Ok(reply(
                    self.explain,
                    present,
                    funnel::db_path(self.gate, present),
                ))
            }
            Err(e) => Err(RedisError::String(e.reply_text())),
        }
    }
}
