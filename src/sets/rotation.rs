//! Which form of a rotating set's tokens this node computes (docs/security.md, "Rotating a
//! tokenized set's key online"). While a set's rows are copied, every node computes the old
//! form. Once the rotation's end has lengthened the chain in the catalog, a node goes on
//! computing the old form until its filter covers the end's transaction (every twin is in it
//! then), and switches to the new form at that moment; until the drain every row is in the
//! database under both forms, so either form a node asks is there. A node that learns the
//! drain switches whatever its filter holds, and trusts its filter again only once a sync pass
//! has caught it up past the end.

use std::borrow::Cow;

use redis_module::Context;

use crate::db::sql::rotation::{Phase, RotationRow};
use crate::filter::store;
use crate::model::token::Tokenize;
use crate::model::token_chain::chain_length;
pub use crate::sets::rotating::Rotating;
use crate::sets::state::{self, SetDef, SetState};

/// `def` as this node serves it: a set whose rotation has ended here but that has not
/// switched keeps the chain without the new key. For a definition learned from a command or a
/// primary, which carry the catalog's chain.
pub fn as_served(mut def: SetDef) -> SetDef {
    state::with(|r| {
        if let Some(rot) = r.sets.get(&def.name).and_then(|s| s.rotation.as_ref()) {
            if rot.chain == def.tokenize {
                def.tokenize = rot.served();
            }
        }
    });
    def
}

/// The catalog says `rotation` of the set `name` whose chain is `chain`: this node's form
/// follows (a node that had switched stays switched).
pub fn learned(ctx: &Context, name: &str, chain: &Tokenize, rotation: Option<RotationRow>) {
    state::with(|r| {
        let Some(s) = r.sets.get_mut(name) else {
            return;
        };
        let was = s.rotation.take();
        let Some(row) = rotation else {
            s.def.tokenize = chain.clone();
            return;
        };
        // A rotation to another key, or one first learned, begins an epoch of the work
        // planned with it.
        let since = match &was {
            Some(w) if w.row.to == row.to => w.since,
            _ => crate::db::in_flight::next_epoch(),
        };
        let had = was.is_some_and(|w| w.switched && w.row.to == row.to && w.chain == *chain);
        if row.phase == Phase::Draining && !had {
            // Old forms are being deleted: the new form now, and no "absent" from a filter
            // that may lack twins until a sync pass catches it up.
            s.trusted = None;
        }
        let rot = Rotating {
            switched: had || row.phase == Phase::Draining,
            since,
            row,
            chain: chain.clone(),
        };
        s.def.tokenize = rot.served();
        s.rotation = Some(rot);
    });
    tick_one(ctx, name);
}

/// The definition a write of `s` canonicalizes under: while its key rotates (copying,
/// switching), the old chain's, whose form every node can make the twin of; else the set's.
pub fn write_def(s: &SetState) -> Cow<'_, SetDef> {
    match s.rotation.as_ref().and_then(Rotating::forms) {
        Some((old, _)) if old != s.def.tokenize => {
            let mut def = s.def.clone();
            def.tokenize = old;
            Cow::Owned(def)
        }
        _ => Cow::Borrowed(&s.def),
    }
}

/// The twin a write of `entity` (canonicalized under [`write_def`]) stores with it while the
/// set's key rotates: its next link under the key the set moves to. Decided with the form, on
/// the main thread, and carried by the write to its statement and its effects: a write planned
/// before this node learns the drain still stores (or deletes) both forms, as the rows it
/// meets were made, and so does one of the old form that another node planned so and
/// forwarded here (`Rotating::twin_forms`). A lookup that reaches the database asks it beside
/// the item, so a row is found whichever form it holds (docs/rotation-in-place.md). `None` for
/// a set not rotating, or an item of another form (a write planned in the drain, a lookup of a
/// node that switched, are of the new form).
pub fn twin_of(s: &SetState, entity: &str, scope: &str) -> Result<Option<String>, String> {
    let Some((old, to)) = s.rotation.as_ref().and_then(Rotating::twin_forms) else {
        return Ok(None);
    };
    if !scope.is_empty() || chain_length(entity) != Some(old.chain().len() as u32) {
        return Ok(None);
    }
    crate::config::token_key::wrap(to, entity).map(Some)
}

/// From the housekeeping sweep: every set whose rotation ended switches once its filter
/// covers the end (standalone), or once the catalog says every node's does (a cluster).
pub fn tick(ctx: &Context) {
    let waiting: Vec<String> = state::with(|r| {
        r.sets
            .values()
            .filter(|s| {
                s.rotation
                    .as_ref()
                    .is_some_and(|rot| rot.row.phase == Phase::Switching && !rot.switched)
            })
            .map(|s| s.def.name.clone())
            .collect()
    });
    for name in waiting {
        tick_one(ctx, &name);
    }
}

/// The rotating sets in their switching phase whose filter here covers the end, with the new
/// chain's length: what this node's report says (`member_nodes`' `covered`).
pub fn covered(ctx: &Context) -> Vec<(String, usize)> {
    in_phase(Phase::Switching)
        .into_iter()
        .filter(|(name, _)| covers_end(ctx, name))
        .collect()
}

/// The rotating sets whose drain this node follows (its writes store the new form alone),
/// with the new chain's length: what this node's report says (`member_nodes`' `draining`).
pub fn draining() -> Vec<(String, usize)> {
    in_phase(Phase::Draining)
}

/// The sets whose rotation this node follows in `phase`, with the length of the catalog's
/// chain (the new one, from the end on).
fn in_phase(phase: Phase) -> Vec<(String, usize)> {
    state::with(|r| {
        r.sets
            .values()
            .filter_map(|s| {
                let rot = s.rotation.as_ref()?;
                (rot.row.phase == phase).then(|| (s.def.name.clone(), rot.chain.chain().len()))
            })
            .collect()
    })
}

/// The set's filter here is complete, trusted and caught up past its rotation's end: every
/// twin of this node's slots is in it (a watermark `W` covers every transaction below `W`).
fn covers_end(ctx: &Context, name: &str) -> bool {
    let Some((key, trusted, end)) = state::with(|r| {
        let s = r.sets.get(name)?;
        let rot = s.rotation.as_ref()?;
        Some((s.filter_key.clone(), s.trusted, rot.row.end_xid?))
    }) else {
        return false;
    };
    store::with(ctx, &key, |f| {
        f.cov.complete && f.trusted(trusted) && f.cov.watermark.is_some_and(|w| w > end)
    })
    .unwrap_or(false)
}

fn tick_one(ctx: &Context, name: &str) {
    let cluster = crate::server::cluster_mode::enabled();
    let waits = state::with(|r| {
        let rot = r.sets.get(name)?.rotation.as_ref()?;
        (rot.row.phase == Phase::Switching && !rot.switched).then_some(())
    });
    if waits.is_none() {
        return;
    }
    // In a cluster the node's own filter does not decide (only the catalog's `covered`).
    let own = !cluster && covers_end(ctx, name);
    let switched = state::with(|r| {
        let s = r.sets.get_mut(name)?;
        let rot = s.rotation.as_mut()?;
        if !rot.switches_now(cluster, own) {
            return None;
        }
        rot.switched = true;
        s.def.tokenize = rot.served();
        Some(())
    });
    if switched.is_none() {
        return;
    }
    let why = if cluster {
        "every node's filter covers the rotation's end"
    } else {
        "its filter covers the rotation's end"
    };
    crate::server::reply::log(
        ctx,
        crate::server::reply::Level::Notice,
        &format!("libmember: set '{name}' switched to the form of its rotated key ({why})"),
    );
}
