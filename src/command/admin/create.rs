//! MEMBER.CREATE: the catalog row and table in PostgreSQL, then (for a set without a complete
//! filter here) the filter built from the rows already there, off the main thread, before the
//! reply.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::admin::settings::Given;
use crate::command::Answer;
use crate::command::{block_timeout, may_block, set_name};
use crate::config;
use crate::config::token_key;
use crate::db::sql::CatalogRow;
use crate::db::{pool, sql, DbErr};
use crate::model::canon::Normalize;
use crate::model::token::Tokenize;
use crate::server::block::Blocked;
use crate::sets::state::{self, SetDef};
use crate::{
    filter::store, model::error, server::mainq, server::metrics, sets::keys, upkeep::rebuild,
    upkeep::rebuild_wait,
};

fn parse(args: Vec<RedisString>) -> Result<(SetDef, [bool; 6]), RedisError> {
    if args.len() < 2 || !args.len().is_multiple_of(2) {
        return Err(RedisError::WrongArity);
    }
    let mut it = args.into_iter().skip(1);
    let name = set_name(&it.next().unwrap())?;
    let (rest, source) = crate::command::admin::attach::split(it.collect())?;
    let given = Given::parse(rest.into_iter())?;
    let explicit = given.explicit();
    let c = given.change;
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let def = SetDef {
        name,
        error_rate: c
            .error_rate
            .unwrap_or_else(|| config::DEFAULT_ERROR_RATE.get()),
        capacity: c
            .capacity
            .unwrap_or_else(|| config::DEFAULT_CAPACITY.load(relaxed) as u64),
        cache_ttl: c
            .cache_ttl
            .unwrap_or_else(|| config::CACHE_TTL.load(relaxed) as u64),
        recent_ttl: c
            .recent_ttl
            .unwrap_or_else(|| config::RECENT_TTL.load(relaxed) as u64),
        normalize: given.normalize.unwrap_or(Normalize::None),
        tokenize: given.tokenize.unwrap_or(Tokenize::None),
        source,
    };
    if let Some(src) = &def.source {
        crate::command::admin::attach::check(def.normalize, &def.tokenize)?;
        crate::command::admin::attach::allowed(src)?;
    }
    Ok((def, explicit))
}

thread_local! {
    /// CREATE callers waiting for their catalog step, by request id: the handle moves on to
    /// the filter build when the step ends, or answers `UNAVAILABLE` if it does not end within
    /// `member.db-timeout-ms` (the step then still completes, into a usable set).
    static PENDING: RefCell<HashMap<u64, Blocked>> = RefCell::new(HashMap::new());
    static NEXT_ID: Cell<u64> = const { Cell::new(0) };
}

/// MEMBER.CREATE <set> [ERROR <rate>] [CAPACITY <n>] [CACHE-TTL <s>] [RECENT-TTL <s>]
/// [NORMALIZE none|lower|username] [TOKENIZE none|hmac-sha256]
/// [SOURCE <schema>.<table> COLUMN <col> [SCOPE-COLUMN <col>] (UPDATED-COLUMN <col> | SYNC log)]
///
/// Two steps, neither on the main thread: the catalog row and table (a worker, bounded by
/// `member.db-timeout-ms`), then, for a set without a complete filter here, the filter build
/// (the rebuild path: its own thread, a swap of microseconds). The client waits for both; the
/// server does not.
pub fn create(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (def, explicit) = parse(args)?;
    crate::sets::acl::check_set(ctx, &def.name, crate::sets::acl::Access::Write)?;
    may_block(ctx)?;
    // A set new to this node counts against member.max-sets, and the filter its settings need
    // must fit under the ceiling (a smaller one would break the promised rate) and under
    // maxmemory: all refused before anything is written. A set this node knows already has
    // its filter: repeating its CREATE (an application's start-up) allocates nothing, and
    // differing settings are refused by the catalog step.
    // The catalog step checks the same for any row it inserts (this node may still know a
    // set that was dropped elsewhere).
    let (is_new, known) = state::with(|r| (!r.sets.contains_key(&def.name), r.sets.len()));
    let budget = crate::sets::limits::refresh_memory_budget(ctx);
    if is_new {
        crate::sets::limits::admit_set(known)?;
        fits(&def, budget).map_err(|e| RedisError::String(format!("ERR {e}")))?;
    }
    let id = NEXT_ID.with(|n| {
        n.set(n.get() + 1);
        n.get()
    });
    // No block timeout: the catalog step has its own (below), the build takes as long as the
    // table takes to stream, like MEMBER.REBUILD SYNC.
    let blocked = Blocked::block(
        ctx,
        Duration::ZERO,
        Box::new(Answer(Err(error::WORKER_LOST.into()))),
    );
    PENDING.with(|p| p.borrow_mut().insert(id, blocked));
    ctx.create_timer(block_timeout(), catalog_timeout, id);
    let step = CatalogStep {
        id,
        result: Some(Err(DbErr::Unavailable(error::WORKER_LOST.into()))),
    };
    pool::run(move |db| {
        let mut step = step;
        step.result = Some(sql::create_set(db, &def, &explicit, &|d| fits(d, budget)));
    });
    Ok(RedisValue::NoReply)
}

/// Whether the filter `def` needs fits under `member.max-filter-bytes` (a smaller one would
/// break the promised rate) and in `budget`, the bytes left under maxmemory.
fn fits(def: &SetDef, budget: u64) -> Result<(), String> {
    crate::sets::limits::check_filter_size(def.capacity, def.error_rate)?;
    crate::server::transient::check_memory(
        crate::filter::bytes_for(def.capacity, def.error_rate),
        budget,
    )
}

fn catalog_timeout(_ctx: &Context, id: u64) {
    if let Some(b) = PENDING.with(|p| p.borrow_mut().remove(&id)) {
        metrics::global(|m| m.db_timeouts += 1);
        b.finish(Box::new(Answer(Err(error::DB_TIMEOUT.into()))));
    }
}

/// The catalog step in flight. However it ends (done, dropped unrun, panicked), its result
/// reaches the main thread exactly once.
struct CatalogStep {
    id: u64,
    result: Option<Result<CatalogRow, DbErr>>,
}

impl Drop for CatalogStep {
    fn drop(&mut self) {
        let id = self.id;
        let res = self
            .result
            .take()
            .unwrap_or_else(|| Err(DbErr::Unavailable(error::WORKER_LOST.into())));
        mainq::post(Box::new(move |ctx| catalog_done(ctx, id, res)));
    }
}

/// Main thread: the set is in the catalog (or the step failed). A set new to this node, or
/// one without a complete filter, gets its filter built before the caller hears OK.
fn catalog_done(ctx: &Context, id: u64, res: Result<CatalogRow, DbErr>) {
    let waiter = PENDING.with(|p| p.borrow_mut().remove(&id));
    let row = match res {
        Ok(row) => row,
        Err(e) => {
            // A set table the module may not attach the change log to is refused loudly: it
            // could not keep its sync bound (docs/sync.md).
            if e.reply_text().contains("change-log triggers") {
                crate::server::reply::log(
                    ctx,
                    crate::server::reply::Level::Warning,
                    &format!("libmember: MEMBER.CREATE refused: {}", e.reply_text()),
                );
            }
            if let Some(w) = waiter {
                w.finish(Box::new(Answer(Err(e.reply_text()))));
            }
            return;
        }
    };
    let def = row.def;
    // The set exists (and is learned below), but a caller told OK must be able to use it: a
    // tokenized set made under another key than the one loaded here says so now.
    let unusable = token_key::check(&def.tokenize).err();
    // New here, or replacing what this node held for a set of the same name that was dropped
    // and created again elsewhere.
    crate::sets::learn::learn(ctx, def.clone(), Some(row.id));
    tell_the_cluster(ctx);
    let key = keys::filter_key(&def.name);
    let complete = store::with(ctx, &key, |f| f.cov.complete).unwrap_or(false);
    if complete {
        crate::server::replication::replicate_set(ctx, &def, Some(row.id));
    } else if unusable.is_some() {
        rebuild::start(&def.name, rebuild::Reason::Create);
    }
    if complete || unusable.is_some() {
        if let Some(w) = waiter {
            w.finish(Box::new(Answer(unusable.map_or(Ok(()), |e| Err(e.into())))));
        }
        return;
    }
    // Started now, or already running (a housekeeping rebuild): either way the caller waits
    // for the build that makes the filter complete. Replicas learn the definition with the
    // built filter (one `MEMBER._SET`, then `MEMBER._LOAD`), so they never start a build of
    // their own for it.
    let kind = if rebuild::start(&def.name, rebuild::Reason::Create) {
        rebuild::Reply::Ok
    } else {
        rebuild::Reply::OkOrRetry
    };
    if let Some(w) = waiter {
        rebuild_wait::wait(&def.name, w, kind);
    }
}

/// In a cluster, every other node reads the catalog again at once: a CREATE, ALTER or DROP
/// takes effect there within milliseconds instead of at its next periodic check.
pub(in crate::command) fn tell_the_cluster(ctx: &Context) {
    if crate::server::cluster_mode::enabled() {
        crate::cluster::bus::catalog_changed(ctx);
    }
}
