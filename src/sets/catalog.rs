//! The set catalog in PostgreSQL is the one source of set definitions, however a node got its
//! data: read at start-up, re-read after any dataset load or promotion and whenever its version
//! changes (one cheap statement per sync interval), and asked about any name a command names
//! that this node does not know (only that client waits; "no such set" is remembered briefly).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisValue};

use crate::db::sql::{self, CatalogRow};
use crate::db::{pool, DbErr};
use crate::server::block::{Blocked, Fail};
use crate::sets::limits::may_block;
use crate::sets::state::{self, SetDef};
use crate::{config, model::error, server::mainq, sets::keys};

/// How long a name the catalog does not hold is answered "no such set" without asking again.
pub const UNKNOWN_FOR: Duration = Duration::from_secs(1);
/// Most names remembered as unknown at once (random names must not grow memory).
pub const UNKNOWN_CAP: usize = 4096;

/// Catalog queries sent for names this node did not know (INFO `catalog_asks`).
pub static ASKS_SENT: AtomicU64 = AtomicU64::new(0);

/// What a command does once the catalog has answered for its set and the set is registered.
/// Runs on the main thread (DB 0 selected) and owns the client's handle: it must finish it or
/// hand it on (dropping it answers the client with UNAVAILABLE).
pub type Then = Box<dyn FnOnce(&Context, Blocked)>;

#[derive(Default)]
struct Asks {
    /// Commands waiting for the catalog's answer, by set name (one query per name at a time).
    waiting: HashMap<String, Vec<(Then, Blocked)>>,
    /// Names the catalog did not hold, until when that answer is reused.
    unknown: HashMap<String, Instant>,
}

impl Asks {
    fn is_unknown(&mut self, name: &str, now: Instant) -> bool {
        match self.unknown.get(name) {
            Some(&until) if now < until => true,
            Some(_) => {
                self.unknown.remove(name);
                false
            }
            None => false,
        }
    }

    fn remember_unknown(&mut self, name: &str, now: Instant) {
        if self.unknown.len() >= UNKNOWN_CAP {
            self.unknown.retain(|_, until| now < *until);
        }
        if self.unknown.len() >= UNKNOWN_CAP {
            // Still full of live entries (a flood of random names): forget one of them.
            if let Some(k) = self.unknown.keys().next().cloned() {
                self.unknown.remove(&k);
            }
        }
        self.unknown.insert(name.to_string(), now + UNKNOWN_FOR);
    }
}

thread_local! {
    static ASKS: RefCell<Asks> = RefCell::new(Asks::default());
}

/// Names currently remembered as unknown (INFO).
pub fn unknown_cached() -> usize {
    ASKS.with(|a| a.borrow().unknown.len())
}

/// Asks for a full re-read of the catalog at the next sweep (a dataset was loaded). Safe from
/// server event handlers: it only sets a flag.
pub fn reread() {
    state::with(|r| r.catalog.reread = true);
}

/// This node was just promoted: it re-reads the catalog, and until that read is applied each
/// set it names is confirmed with the catalog before it serves (it may have missed a DROP).
pub fn promoted() {
    state::with(|r| {
        r.catalog.reread = true;
        r.catalog.hold = true;
    });
}

/// Starts a catalog read if one is due: the first load (retried until PostgreSQL answers), a
/// requested re-read, or the periodic version check. Main thread (housekeeping).
pub fn tick(now: Instant) {
    let job = state::with(|r| {
        let c = &mut r.catalog;
        if c.loading || c.next_try.is_some_and(|t| now < t) {
            return None;
        }
        let full = !c.loaded || c.reread;
        if !full && c.next_check.is_some_and(|t| now < t) {
            return None;
        }
        c.loading = true;
        c.reread = false;
        c.next_try = None;
        c.next_check = Some(now + config::sync_interval());
        Some(Read {
            known: if full { None } else { c.version },
            changes: c.changes,
            res: None,
        })
    });
    if let Some(read) = job {
        pool::run(move |db| {
            let mut read = read;
            read.res = Some(match read.known {
                None => sql::load_catalog(db).map(Some),
                Some(v) => sql::poll_catalog(db, v),
            });
        });
    }
}

/// A catalog read's outcome: `None` when the version was unchanged, else the new version and
/// every definition.
type ReadResult = Result<Option<(i64, Vec<CatalogRow>)>, DbErr>;

/// A catalog read in flight. However the job ends (done, dropped from a full queue,
/// panicked), its outcome reaches the main thread, so the read is retried.
struct Read {
    /// The version already applied, for a periodic check; `None` for a full read.
    known: Option<i64>,
    /// `Catalog::changes` when the read was sent.
    changes: u64,
    res: Option<ReadResult>,
}

impl Drop for Read {
    fn drop(&mut self) {
        let (full, changes) = (self.known.is_none(), self.changes);
        let res = self
            .res
            .take()
            .unwrap_or_else(|| Err(DbErr::Unavailable("catalog read did not run".into())));
        mainq::post(Box::new(move |ctx| applied(ctx, full, changes, res)));
    }
}

fn applied(ctx: &Context, full: bool, changes: u64, res: ReadResult) {
    let first = state::with(|r| {
        r.catalog.loading = false;
        !r.catalog.loaded
    });
    match res {
        Ok(None) => state::with(|r| r.catalog.last_error = None),
        Ok(Some((version, rows))) => {
            // Sets added, changed or removed here while the read ran: the read may predate
            // them, so it is not applied to them, and it is read again at once (the version
            // applied does not move on: `Catalog::read_applied`). Every other name takes the
            // read (a node whose sets change all the time still forgets a set dropped
            // elsewhere). When more changed than is remembered, nothing is applied.
            let Some(touched) = state::with(|r| r.catalog.touched_since(changes)) else {
                state::with(|r| {
                    if full {
                        r.catalog.reread = true;
                    } else {
                        r.catalog.next_check = None;
                    }
                });
                return;
            };
            let raced = !touched.is_empty();
            let n = rows.len();
            // Sets this node knows that the catalog no longer holds were dropped elsewhere.
            let gone: Vec<String> = state::with(|r| {
                r.sets
                    .keys()
                    .filter(|name| !touched.contains(*name))
                    .filter(|name| !rows.iter().any(|row| &row.def.name == *name))
                    .cloned()
                    .collect()
            });
            for name in &gone {
                forget(ctx, name);
            }
            let mut added = 0;
            for row in rows.into_iter().filter(|r| !touched.contains(&r.def.name)) {
                added += learn(ctx, row.def, Some(row.id)) as usize;
            }
            state::with(|r| r.catalog.read_applied(version, full, raced));
            // Names remembered as unknown may exist now.
            ASKS.with(|a| a.borrow_mut().unknown.clear());
            if first {
                crate::server::reply::log(
                    ctx,
                    crate::server::reply::Level::Notice,
                    &format!("libmember: catalog loaded, {n} set(s)"),
                );
            } else if full || added > 0 || !gone.is_empty() {
                crate::server::reply::log(
                    ctx,
                    crate::server::reply::Level::Notice,
                    &format!(
                        "libmember: catalog version {version}: learned {added} set(s), forgot {} \
                     dropped set(s)",
                        gone.len()
                    ),
                );
            }
        }
        Err(e) => {
            let msg = e.reply_text();
            state::with(|r| {
                let c = &mut r.catalog;
                if full && c.loaded {
                    c.reread = true;
                }
                c.next_try = Some(state::retry_at());
                if c.last_error.as_deref() != Some(msg.as_str()) {
                    let what = if first { "load" } else { "re-read" };
                    crate::server::reply::log(
                        ctx,
                        crate::server::reply::Level::Warning,
                        &format!("libmember: cannot {what} the set catalog: {msg}"),
                    );
                }
                c.last_error = Some(msg);
            });
        }
    }
}

/// Registers a set definition read from the catalog (or replicated with its catalog row's
/// identity `id`). A set this node holds under the same name but from another catalog row
/// was dropped and created again meanwhile: it is forgotten first, so nothing of it survives.
/// True when the set is new here.
pub fn learn(ctx: &Context, def: SetDef, id: Option<i64>) -> bool {
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

/// A command named `name`, which this node does not know: asks the catalog, blocking only the
/// calling client for at most `timeout` (zero: no limit), and runs `then` once the set is
/// registered. A name the catalog does not hold gets `ERR no such set` and is answered so
/// without asking again for `UNKNOWN_FOR`; concurrent commands for one name share one query.
pub fn ask(ctx: &Context, name: &str, timeout: Duration, then: Then) -> RedisResult {
    // The set may be tokenized: until the catalog says, the call's items are not shown.
    crate::server::redaction::needed();
    if !state::with(|r| r.catalog.loaded) {
        return Err(RedisError::Str(error::CATALOG_NOT_LOADED));
    }
    if ASKS.with(|a| a.borrow_mut().is_unknown(name, Instant::now())) {
        return Err(RedisError::Str(error::UNKNOWN_SET));
    }
    may_block(ctx)?;
    let fallback = Box::new(Fail(error::WORKER_LOST.into()));
    let blocked = Blocked::block(ctx, timeout, fallback);
    let first = ASKS.with(|a| {
        let mut a = a.borrow_mut();
        let w = a.waiting.entry(name.to_string()).or_default();
        w.push((then, blocked));
        w.len() == 1
    });
    if first {
        query(name.to_string());
    }
    Ok(RedisValue::NoReply)
}

/// A set named by a request no client of this node waits for (one forwarded from another
/// node): asks the catalog about it unless a query for it is in flight, so a later request
/// finds it. `Err` with the client's error when the name is known not to exist or the catalog
/// is not loaded yet.
pub fn learn_in_background(name: &str) -> Result<(), RedisError> {
    if !state::with(|r| r.catalog.loaded) {
        return Err(RedisError::Str(error::CATALOG_NOT_LOADED));
    }
    if ASKS.with(|a| a.borrow_mut().is_unknown(name, Instant::now())) {
        return Err(RedisError::Str(error::UNKNOWN_SET));
    }
    let first = ASKS.with(|a| {
        let mut a = a.borrow_mut();
        let in_flight = a.waiting.contains_key(name);
        a.waiting.entry(name.to_string()).or_default();
        !in_flight
    });
    if first {
        query(name.to_string());
    }
    Ok(())
}

fn query(name: String) {
    ASKS_SENT.fetch_add(1, Ordering::Relaxed);
    let (changes, removals) = state::with(|r| (r.catalog.changes, r.catalog.removals));
    let ask = Ask {
        name,
        changes,
        removals,
        res: None,
    };
    pool::run(move |db| {
        let mut ask = ask;
        ask.res = Some(sql::find_set(db, &ask.name));
    });
}

/// One name's catalog query in flight; its outcome reaches the main thread however it ends.
struct Ask {
    name: String,
    /// `Catalog::changes` and `Catalog::removals` when the query was sent.
    changes: u64,
    removals: u64,
    /// The row, if any, and the catalog version it was read at.
    res: Option<Result<(i64, Option<CatalogRow>), DbErr>>,
}

impl Drop for Ask {
    fn drop(&mut self) {
        let (name, changes, removals) =
            (std::mem::take(&mut self.name), self.changes, self.removals);
        let res = self
            .res
            .take()
            .unwrap_or_else(|| Err(DbErr::Unavailable(error::WORKER_LOST.into())));
        mainq::post(Box::new(move |ctx| {
            answered(ctx, name, changes, removals, res)
        }));
    }
}

fn answered(
    ctx: &Context,
    name: String,
    changes: u64,
    removals: u64,
    res: Result<(i64, Option<CatalogRow>), DbErr>,
) {
    let known = |name: &str| state::with(|r| r.sets.contains_key(name));
    let refusal = match res {
        Ok((version, Some(row))) => {
            // The answer may be older than a DROP this node has seen meanwhile: one of its
            // own sets dropped (`removals`), or a catalog read newer than the answer applied
            // (which found nothing to forget when this node did not hold the set yet). Then
            // it is not learned: a set that is not held is asked about again (the commands
            // keep waiting), so a dropped set is never brought back.
            if state::with(|r| r.catalog.answer_is_current(version, removals)) {
                learn(ctx, row.def, Some(row.id));
            } else if !known(&name) {
                query(name);
                return;
            }
            None
        }
        Ok((_, None)) => {
            // Known here but not in the catalog, and not registered since the query was
            // sent: it was dropped elsewhere (a promoted node asks about sets it knows).
            // Other sets changed meanwhile do not keep it (a busy node would never forget).
            if known(&name) && state::with(|r| r.catalog.untouched_since(&name, changes)) {
                forget(ctx, &name);
            }
            if !known(&name) {
                ASKS.with(|a| a.borrow_mut().remember_unknown(&name, Instant::now()));
            }
            Some(error::UNKNOWN_SET.to_string())
        }
        Err(e) => Some(e.reply_text()),
    };
    let waiting = ASKS.with(|a| a.borrow_mut().waiting.remove(&name).unwrap_or_default());
    // A definition that arrived meanwhile (replication) counts, whatever the query said.
    let known = known(&name);
    for (then, blocked) in waiting {
        if known {
            then(ctx, blocked);
        } else {
            let text = refusal.clone().unwrap_or_else(|| error::UNKNOWN_SET.into());
            blocked.finish(Box::new(Fail(text)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_are_remembered_briefly_and_bounded() {
        let mut a = Asks::default();
        let t0 = Instant::now();
        assert!(!a.is_unknown("x", t0));
        a.remember_unknown("x", t0);
        assert!(a.is_unknown("x", t0 + Duration::from_millis(500)));
        assert!(!a.is_unknown("x", t0 + UNKNOWN_FOR));
        assert!(
            a.unknown.is_empty(),
            "an expired entry is dropped when read"
        );
        for i in 0..UNKNOWN_CAP * 3 {
            a.remember_unknown(&format!("n{i}"), t0);
        }
        assert!(a.unknown.len() <= UNKNOWN_CAP);
        assert!(a.is_unknown(&format!("n{}", UNKNOWN_CAP * 3 - 1), t0));
        // Expired entries make room first.
        a.remember_unknown("late", t0 + UNKNOWN_FOR * 2);
        assert_eq!(a.unknown.len(), 1);
    }
}
