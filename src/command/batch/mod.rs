//! MEMBER.MEXISTS and MEMBER.MADD: many items of one set in one call, each decided exactly as
//! MEMBER.EXISTS / MEMBER.ADD would, with one blocked client and one database statement for all
//! (in a cluster, for the items of this node's slots; `wide.rs` asks the other owners).

pub mod outlet;
pub mod parts;
pub mod wide;

use std::time::Duration;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::batch::outlet::Outlet;
use crate::command::batch::parts::{
    decide_lookups, send_lookups, send_writes, writes, Kind, ManyLookups, ManyWrites,
};
use crate::command::retry::after_catalog;
use crate::command::write::expiry;
use crate::command::{block_timeout, may_block, Arg, ManyArgs};
use crate::model::canon::Canon;
use crate::server::block::{Blocked, Completion, Fail};
use crate::{config::token_key, model::error, sets::keys, sets::state};

/// Most items one MEXISTS or MADD may name (`error::TOO_MANY_ITEMS`): it bounds the
/// main-thread work of one call (probes, or each ADD's effects) to about a millisecond.
pub const MAX_ITEMS: usize = 1000;

/// MEMBER.MEXISTS <set> [SCOPE <scope>] ITEMS <item> [<item> …], its arguments read in place
/// by its entry point (`table::entry::mexists_entry`).
pub fn mexists(ctx: &Context, args: &[&[u8]]) -> RedisResult {
    let a = parse(args.to_vec(), &[])?;
    crate::sets::acl::check_set(ctx, &a.set, crate::sets::acl::Access::Read)?;
    run(ctx, a, Kind::Lookups)
}

/// MEMBER.MADD <set> [SCOPE <scope>] [TTL <s> | EXPIREAT <unix-s>] ITEMS <item> [<item> …]
pub fn madd(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let a = parse(args, &["TTL", "EXPIREAT"])?;
    crate::sets::acl::check_set(ctx, &a.set, crate::sets::acl::Access::Write)?;
    let expires_at = expiry(&a.opts)?;
    run(ctx, a, Kind::Writes(expires_at))
}

/// The syntax and the item count, checked before anything is done.
fn parse<A: Arg>(args: Vec<A>, extra: &[&'static str]) -> Result<ManyArgs<A>, RedisError> {
    let a = ManyArgs::parse(args, extra)?;
    if a.items.len() > MAX_ITEMS {
        return Err(RedisError::Str(error::TOO_MANY_ITEMS));
    }
    Ok(a)
}

/// Plans the call and starts it; a set this node does not know is asked of the catalog first
/// (only this client waits), then the call runs as if it had just arrived.
fn run<A: Arg>(ctx: &Context, a: ManyArgs<A>, kind: Kind) -> RedisResult {
    if crate::server::cluster_mode::enabled() {
        return keys::with_db0(ctx, |ctx| defer(ctx, a, kind));
    }
    let items: Vec<&[u8]> = a.items.iter().map(|i| &**i).collect();
    keys::with_db0(ctx, |ctx| {
        let planned = match plan(ctx, &a.set, &items, a.scope(), kind, false)? {
            None => return ask_catalog(ctx, &a, kind),
            Some(Planned::Lookups(mut done)) if done.pending.is_empty() => return done.reply(ctx),
            Some(planned) => planned,
        };
        may_block(ctx)?;
        let blocked = match &planned {
            Planned::Wide(_) => wide::block(ctx),
            Planned::Lookups(done) => Blocked::block(ctx, block_timeout(), Box::new(done.clone())),
            Planned::Writes(done) => Blocked::block(ctx, block_timeout(), Box::new(done.clone())),
        };
        start(ctx, blocked, planned);
        Ok(RedisValue::NoReply)
    })
}

/// Cluster mode: checks the call now and runs it from a timer a moment later, its client
/// blocked. While a command runs, Valkey 8 looks every key the module opens up in the slot of
/// the command's routing argument (`getKeySlot` takes the client's slot), here the set name's:
/// the items' exact-match keys, which lie in the items' own slots, would
/// not be found (and a write would land in the wrong slot). A timer runs outside any command.
/// An item's error (a bad item, a bad scope) then comes from the timer, with the same text.
fn defer<A: Arg>(ctx: &Context, a: ManyArgs<A>, kind: Kind) -> RedisResult {
    let known = state::with(|r| -> Result<bool, RedisError> {
        let Some(set) = r.serving(&a.set, false) else {
            return Ok(false);
        };
        check_expiry(set, kind)?;
        Ok(true)
    })?;
    if !known {
        return ask_catalog(ctx, &a, kind);
    }
    may_block(ctx)?;
    // Copied: the argument strings are the command's, freed with its context.
    let call = Deferred {
        set: a.set.clone(),
        items: a.items.iter().map(|i| i.to_vec()).collect(),
        scope: a.scope().to_vec(),
        kind,
    };
    ctx.create_timer(Duration::ZERO, run_deferred, (call, wide::block(ctx)));
    Ok(RedisValue::NoReply)
}

/// A call waiting for its timer.
struct Deferred {
    set: String,
    items: Vec<Vec<u8>>,
    scope: Vec<u8>,
    kind: Kind,
}

fn run_deferred(ctx: &Context, (call, blocked): (Deferred, Blocked)) {
    keys::with_db0(ctx, |ctx| {
        let items: Vec<&[u8]> = call.items.iter().map(|i| i.as_slice()).collect();
        match plan(ctx, &call.set, &items, &call.scope, call.kind, true) {
            Ok(Some(planned)) => start(ctx, blocked, planned),
            Ok(None) => blocked.finish(Box::new(Fail(error::UNKNOWN_SET.into()))),
            Err(e) => blocked.finish(Box::new(Fail(e.to_string()))),
        }
    })
}

/// TTL and EXPIREAT are refused on an attached set (its members are its table's rows).
fn check_expiry(set: &state::SetState, kind: Kind) -> Result<(), RedisError> {
    match kind {
        Kind::Writes(Some(_)) if set.def.source.is_some() => {
            Err(RedisError::Str(error::SOURCE_NO_EXPIRY))
        }
        _ => Ok(()),
    }
}

fn ask_catalog<A: Arg>(ctx: &Context, a: &ManyArgs<A>, kind: Kind) -> RedisResult {
    let name = a.set.clone();
    let scope = a.scope().to_vec();
    let items: Vec<Vec<u8>> = a.items.iter().map(|i| i.to_vec()).collect();
    after_catalog(
        ctx,
        &a.set,
        block_timeout(),
        move |ctx| {
            let items: Vec<&[u8]> = items.iter().map(|i| i.as_slice()).collect();
            plan(ctx, &name, &items, &scope, kind, true)
        },
        start,
    )
}

/// A call planned once its set is known: all of it here, or (cluster mode) split among the
/// owners of its items' slots.
pub(in crate::command) enum Planned {
    Lookups(ManyLookups),
    Writes(ManyWrites),
    Wide(wide::Wide),
}

/// Starts a planned call for its blocked client.
fn start(ctx: &Context, blocked: Blocked, planned: Planned) {
    match planned {
        Planned::Lookups(done) if done.pending.is_empty() => blocked.finish(Box::new(done)),
        Planned::Lookups(done) => send_lookups(Outlet::Client(blocked), done),
        Planned::Writes(done) => send_writes(ctx, Outlet::Client(blocked), done),
        Planned::Wide(wide) => wide.start(ctx, blocked),
    }
}

/// Canonicalizes every item of the call, then decides them here or (cluster mode) splits them
/// among the owners of their slots. `None` when the catalog must be asked about the set. In
/// cluster mode, only outside a command (see `defer`).
fn plan(
    ctx: &Context,
    set_name: &str,
    items: &[&[u8]],
    scope: &[u8],
    kind: Kind,
    confirmed: bool,
) -> Result<Option<Planned>, RedisError> {
    state::with(|r| {
        let epoch = r.epoch;
        let Some(set) = r.serving(set_name, confirmed) else {
            return Ok(None);
        };
        check_expiry(set, kind)?;
        let (mut tokens, mut forms) = (Vec::new(), String::new());
        // Writes of a set whose key rotates: the old form (its twin is stored with it).
        let def = match kind {
            Kind::Writes(_) => crate::sets::rotation::write_def(set),
            Kind::Lookups => std::borrow::Cow::Borrowed(&set.def),
        };
        let canons = canonical_all(&def, items, scope, &mut tokens, &mut forms)?;
        if crate::server::cluster_mode::enabled() {
            let wide = wide::split(ctx, set, epoch, canons, kind)?;
            return Ok(Some(Planned::Wide(wide)));
        }
        Ok(Some(match kind {
            Kind::Lookups => Planned::Lookups(decide_lookups(ctx, set, epoch, canons)),
            Kind::Writes(expires_at) => Planned::Writes(writes(set, canons, expires_at)?),
        }))
    })
}

/// Canonicalizes every item under the set's policy; the first that fails fails the call,
/// naming its position (a bad scope is named as such).
fn canonical_all<'a>(
    def: &state::SetDef,
    items: &[&'a [u8]],
    scope: &'a [u8],
    tokens: &'a mut Vec<u8>,
    forms: &'a mut String,
) -> Result<Vec<Canon<'a>>, RedisError> {
    token_key::canonical_all(def, items, scope, tokens, forms).map_err(|(i, e)| {
        if !error::names_item(e) {
            RedisError::Str(e)
        } else {
            RedisError::String(error::at_item(i + 1, e))
        }
    })
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
