//! Internal commands that carry derived-state effects to replicas and the AOF:
//! `MEMBER._ADD`, `MEMBER._DEL`, `MEMBER._LOAD`, `MEMBER._SET`, `MEMBER._DROP`. They never touch PostgreSQL and
//! are refused unless they come from the replication link or the AOF.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::set_name;
use crate::filter::value::FilterValue;
use crate::model::canon::{self, Canon, Normalize};
use crate::model::token::Tokenize;
use crate::sets::state::{self, SetDef, Source, SourceSync};
use crate::upkeep::replica_load;
use crate::{config, server::replication, sets::effects};

const NOT_INTERNAL: &str = "ERR internal command: only accepted from a primary or the AOF";

fn guard(ctx: &Context) -> Result<(), RedisError> {
    if replication::from_replication_or_load(ctx) {
        Ok(())
    } else {
        Err(RedisError::Str(NOT_INTERNAL))
    }
}

/// True when the command arrives through an atomic slot migration's stream (the commands of
/// the slots it moves, internal ones included now that they name a key in their slot): the
/// node answers OK and changes nothing. Its filter learns the slots from the database (a slot
/// fill), its sets from the catalog; the source's filter or set state would be wrong here, and
/// an error reply would fail the migration.
fn streamed_by_migration(ctx: &Context) -> bool {
    crate::server::cluster_mode::from_slot_import(ctx)
}

const SKIPPED: RedisValue = RedisValue::SimpleStringStatic("OK");

fn canon_of<'a>(entity: &'a RedisString, scope: &'a RedisString) -> Result<Canon<'a>, RedisError> {
    let e =
        std::str::from_utf8(entity.as_slice()).map_err(|_| RedisError::Str("ERR bad entity"))?;
    let s = std::str::from_utf8(scope.as_slice()).map_err(|_| RedisError::Str("ERR bad scope"))?;
    Ok(Canon {
        entity: std::borrow::Cow::Borrowed(e),
        scope: s,
        hash: canon::hash_parts(e, s),
    })
}

/// MEMBER._ADD <set> <entity> <scope> — a committed ADD's filter and cache effects.
pub fn add(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard(ctx)?;
    if streamed_by_migration(ctx) {
        return Ok(SKIPPED);
    }
    let [_, set, entity, scope] =
        <[RedisString; 4]>::try_from(args).map_err(|_| RedisError::WrongArity)?;
    let set = set_name(&set)?;
    effects::added(ctx, &set, &canon_of(&entity, &scope)?);
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// MEMBER._DEL <set> <entity> <scope> — a committed DEL's cache invalidation.
pub fn del(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard(ctx)?;
    if streamed_by_migration(ctx) {
        return Ok(SKIPPED);
    }
    let [_, set, entity, scope] =
        <[RedisString; 4]>::try_from(args).map_err(|_| RedisError::WrongArity)?;
    let set = set_name(&set)?;
    effects::removed(ctx, &set, &canon_of(&entity, &scope)?);
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// MEMBER._LOAD <key> <payload> [<adds>] — a whole filter (a rebuild's swap, or an AOF
/// rewrite), then the hashes in `adds` (16 bytes each, little endian): the ADDs that landed
/// while the rebuild streamed, folded in on the primary after the payload was made.
/// Loaded from the AOF it is not trusted until the sync loop catches it up; replicated live
/// it is as current as the primary's, and trusted at once.
pub fn load(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard(ctx)?;
    if streamed_by_migration(ctx) {
        return Ok(SKIPPED);
    }
    let (key, payload, adds) = match <[RedisString; 4]>::try_from(args) {
        Ok([_, key, payload, adds]) => (key, payload, Some(adds)),
        Err(args) => {
            let [_, key, payload] =
                <[RedisString; 3]>::try_from(args).map_err(|_| RedisError::WrongArity)?;
            (key, payload, None)
        }
    };
    let live = !ctx.get_flags().contains(ContextFlags::LOADING);
    let adds: Vec<u128> = match adds {
        Some(adds) => {
            let adds = adds.as_slice();
            if adds.len() % 16 != 0 {
                return Err(RedisError::Str("ERR libmember: bad filter adds"));
            }
            adds.chunks_exact(16)
                .map(|h| u128::from_le_bytes(h.try_into().expect("16 bytes")))
                .collect()
        }
        None => Vec::new(),
    };
    // An AOF rewrite names every key holding a filter, set aside copies included: only a
    // set's own filter key concerns that set.
    let set = set_of_filter_key(key.as_slice());
    // Live from the primary, a large filter is verified and decoded off the main thread and
    // swapped in when ready (the current filter keeps serving, and receives every add meanwhile).
    let adds = match set {
        Some(set) if live => match replica_load::start(set, &payload, adds) {
            Ok(()) => return Ok(RedisValue::SimpleStringStatic("OK")),
            Err(adds) => adds,
        },
        _ => adds,
    };
    let mut v = FilterValue::from_bytes(payload.as_slice())
        .map_err(|e| RedisError::String(format!("ERR libmember: {e}")))?;
    if let Some(set) = set {
        // Whatever was still being decoded for the set is older than this one.
        state::with(|r| {
            if let Some(s) = r.sets.get_mut(set) {
                s.pending_load = None;
            }
        });
    }
    for h in adds {
        v.bloom.add(h);
    }
    replica_load::install_loaded(ctx, &key, set, v, live);
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// The set whose filter key is `key` (`member:<set>:bloom`), if it is one.
fn set_of_filter_key(key: &[u8]) -> Option<&str> {
    let set = key.strip_prefix(b"member:")?.strip_suffix(b":bloom")?;
    if !crate::command::valid_set_name(set) {
        return None;
    }
    std::str::from_utf8(set).ok()
}

/// MEMBER._SET <set> <error_rate> <capacity> <cache_ttl> <recent_ttl> <normalize> [<id>
/// [<tokenize> <fingerprint>]] — a set definition created on the primary, with the identity of
/// its catalog row (absent in files written before it was sent, empty when unknown) and, for a
/// tokenized set, its mode and key fingerprint.
pub fn set(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard(ctx)?;
    if streamed_by_migration(ctx) {
        return Ok(SKIPPED);
    }
    if !matches!(args.len(), 7 | 8 | 10 | 16) {
        return Err(RedisError::WrongArity);
    }
    let mut args = args.into_iter();
    let [_, name, rate, cap, cache, recent, norm] = std::array::from_fn(|_| args.next().unwrap());
    let (id, tok, fp) = (args.next(), args.next(), args.next());
    let source: Vec<RedisString> = args.collect();
    let bad = || RedisError::Str("ERR bad set definition");
    // The same bounds as MEMBER.CREATE: a definition from a primary or an AOF is checked
    // like one from a client, so no value can size a runaway filter.
    let int = |s: &RedisString, range: std::ops::RangeInclusive<i64>| -> Result<u64, RedisError> {
        std::str::from_utf8(s.as_slice())
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|v| range.contains(v))
            .map(|v| v as u64)
            .ok_or_else(bad)
    };
    let error_rate = std::str::from_utf8(rate.as_slice())
        .ok()
        .and_then(config::parse_error_rate)
        .ok_or_else(bad)?;
    let id = match id.filter(|id| !id.as_slice().is_empty()) {
        Some(id) => Some(
            std::str::from_utf8(id.as_slice())
                .ok()
                .and_then(|v| v.parse::<i64>().ok())
                .ok_or_else(bad)?,
        ),
        None => None,
    };
    let tokenize = match (tok, fp) {
        (Some(t), Some(fp)) => {
            let t = std::str::from_utf8(t.as_slice()).map_err(|_| bad())?;
            let fp = std::str::from_utf8(fp.as_slice()).map_err(|_| bad())?;
            Tokenize::from_stored(t, Some(fp)).ok_or_else(bad)?
        }
        _ => Tokenize::None,
    };
    let def = SetDef {
        name: set_name(&name)?,
        error_rate,
        capacity: int(&cap, 1..=config::DEFAULT_CAPACITY_MAX)?,
        cache_ttl: int(&cache, config::CACHE_TTL_MIN..=config::CACHE_TTL_MAX)?,
        recent_ttl: int(&recent, config::RECENT_TTL_MIN..=config::RECENT_TTL_MAX)?,
        normalize: Normalize::parse(norm.as_slice()).ok_or_else(bad)?,
        tokenize,
        source: source_of(&source).ok_or_else(bad)?,
    };
    crate::sets::learn::learn(ctx, def, id);
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// An attached set's source from `_SET`'s last six fields (schema, table, column, scope
/// column or empty, updated column or empty, sync mode): `Some(None)` when there are none,
/// `None` when they are malformed.
fn source_of(f: &[RedisString]) -> Option<Option<Source>> {
    let [schema, table, column, scope, updated, sync] = f else {
        return f.is_empty().then_some(None);
    };
    let text = |s: &RedisString| {
        std::str::from_utf8(s.as_slice())
            .ok()
            .filter(|s| !s.contains('\0'))
            .map(str::to_string)
    };
    let some = |s: String| (!s.is_empty()).then_some(s);
    let sync = match sync.as_slice() {
        b"log" => SourceSync::Log,
        b"updated-column" => SourceSync::Updated(some(text(updated)?)?),
        _ => return None,
    };
    Some(Some(Source {
        schema: some(text(schema)?)?,
        table: some(text(table)?)?,
        column: some(text(column)?)?,
        scope_column: some(text(scope)?),
        sync,
    }))
}

/// MEMBER._DROP <set> — a set dropped on the primary: forget everything held for it.
pub fn drop(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard(ctx)?;
    if streamed_by_migration(ctx) {
        return Ok(SKIPPED);
    }
    let [_, name] = <[RedisString; 2]>::try_from(args).map_err(|_| RedisError::WrongArity)?;
    crate::sets::learn::forget(ctx, &set_name(&name)?);
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Replicates a whole filter as `MEMBER._LOAD`.
pub fn replicate_filter(ctx: &Context, key: &RedisString, v: &FilterValue) {
    let payload = v.to_bytes();
    replication::replicate(ctx, "MEMBER._LOAD", &[key.as_slice(), &payload]);
}

/// MEMBER._OWN <key> — in the replication stream or AOF of an earlier version, whose primaries
/// wrote one sentinel key per slot (cluster mode). Such keys are no longer kept: the key it
/// names is deleted instead of written (docs/cluster-placement.md).
pub fn own(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard(ctx)?;
    let [_, key] = <[RedisString; 2]>::try_from(args).map_err(|_| RedisError::WrongArity)?;
    if !crate::server::cluster_mode::enabled()
        || !crate::cluster::owner::is_sentinel_name(key.as_slice())
    {
        return Err(RedisError::Str("ERR libmember: not a slot sentinel"));
    }
    crate::cluster::owner::drop_legacy_sentinel(ctx, &key);
    Ok(RedisValue::SimpleStringStatic("OK"))
}
