//! What a node does with a set definition it learned (from the catalog, a command of its own,
//! or its primary) and with a set it found dropped.

use std::sync::OnceLock;

use redis_module::{Context, ContextFlags};

use crate::server::block::Fail;
use crate::sets::state::{self, SetDef};
use crate::{model::error, sets::keys};

/// Registers a set definition read from the catalog (or replicated with its catalog row's
/// identity `id`). A set this node holds under the same name but from another catalog row
/// was dropped and created again meanwhile: it is forgotten first, so nothing of it survives.
/// True when the set is new here.
pub fn learn(ctx: &Context, def: SetDef, id: Option<i64>) -> bool {
    // A set mid-rotation keeps the form this node computes (`rotation.rs`).
    let def = crate::sets::rotation::as_served(def);
    let replaced = id.is_some_and(|id| {
        state::with(|r| {
            r.sets
                .get(&def.name)
                .and_then(|s| s.catalog_id)
                .is_some_and(|held| held != id)
        })
    });
    if replaced {
        forget(ctx, &def.name);
    }
    let name = def.name.clone();
    let before = state::with(|r| r.sets.get(&name).map(|s| s.def.clone()));
    let resize = before.as_ref().filter(|b| b.filter_differs(&def)).cloned();
    crate::db::source::remember(&def);
    let new = state::register(def.clone());
    if let Some(id) = id {
        state::with(|r| {
            if let Some(s) = r.sets.get_mut(&name) {
                s.catalog_id = Some(id);
            }
        });
    }
    if let Some(b) = resize {
        resized(ctx, &b, &def);
    }
    new
}

/// [`learn`] for a row read from the catalog, with the key rotation it names (or none).
pub fn learn_row(ctx: &Context, row: crate::db::sql::CatalogRow) -> bool {
    let (name, chain) = (row.def.name.clone(), row.def.tokenize.clone());
    let new = learn(ctx, row.def, Some(row.id));
    crate::sets::rotation::learned(ctx, &name, &chain, row.rotation);
    new
}

/// ERROR or CAPACITY of a set this node holds changed (MEMBER.ALTER, here or elsewhere): a
/// primary rebuilds its filter with them (a running build is followed by one, see
/// `rebuild::finish`); a replica gets its primary's.
fn resized(ctx: &Context, before: &SetDef, def: &SetDef) {
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        return;
    }
    crate::server::reply::log(
        ctx,
        crate::server::reply::Level::Notice,
        &format!(
            "libmember: set '{}' altered (ERROR {} -> {}, CAPACITY {} -> {}): rebuilding its \
             filter; the current one serves until the swap",
            def.name, before.error_rate, def.error_rate, before.capacity, def.capacity
        ),
    );
    if let Some(rebuild) = ON_RESIZED.get() {
        rebuild(&def.name);
    }
}

/// Starts the rebuild of a resized set's filter (the upkeep's), set once at module load.
static ON_RESIZED: OnceLock<fn(&str)> = OnceLock::new();

/// Makes `f` rebuild the filter of every set resized from now on. Call once, from module load,
/// before the catalog is first read.
pub fn on_resized(f: fn(&str)) {
    let _ = ON_RESIZED.set(f);
}

/// Forgets a dropped set on this node: its definition, recent-writes marks and counters, a
/// running rebuild (its SYNC callers get "no such set"), its filter key with the fp-cache
/// inside it, and trust in its exact-match keys (a later set of the same name has a new
/// incarnation and tag; the old entries expire by their TTL, nothing scans for them).
pub fn forget(ctx: &Context, name: &str) {
    crate::db::source::forget(name);
    if let Some(s) = state::remove(name) {
        if let state::Rebuild::Running { waiters, .. } = s.rebuild {
            for (w, _) in waiters {
                match w {
                    state::RebuildWaiter::Client(w) => {
                        w.finish(Box::new(Fail(error::UNKNOWN_SET.into())))
                    }
                    state::RebuildWaiter::Then(f) => f(ctx, Err(error::UNKNOWN_SET.into())),
                }
            }
        }
    }
    keys::with_db0(ctx, |ctx| {
        crate::filter::store::remove(ctx, &keys::filter_key(name));
    });
}
