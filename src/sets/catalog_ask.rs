//! A command naming a set this node does not know asks the catalog about that one name; only
//! its client waits, commands for one name share one query, and "no such set" is remembered
//! briefly (`UNKNOWN_FOR`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::db::sql::{self, CatalogRow};
use crate::db::{pool, DbErr};
use crate::server::block::{Blocked, Fail};
use crate::sets::catalog_copy::AskedAt;
use crate::sets::learn::{forget, learn_row};
use crate::sets::limits::may_block;
use crate::sets::state;
use crate::{model::error, server::mainq};

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

/// A catalog read applied: names remembered as unknown may exist now.
pub fn names_may_exist() {
    ASKS.with(|a| a.borrow_mut().unknown.clear());
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
    let sent = state::with(|r| r.catalog.asked_at());
    let ask = Ask {
        name,
        sent,
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
    /// The catalog copy when the query was sent.
    sent: AskedAt,
    /// The row, if any, and the catalog version it was read at.
    res: Option<Result<(i64, Option<CatalogRow>), DbErr>>,
}

impl Drop for Ask {
    fn drop(&mut self) {
        let (name, sent) = (std::mem::take(&mut self.name), self.sent);
        let res = self
            .res
            .take()
            .unwrap_or_else(|| Err(DbErr::Unavailable(error::WORKER_LOST.into())));
        mainq::post(Box::new(move |ctx| answered(ctx, name, sent, res)));
    }
}

fn answered(
    ctx: &Context,
    name: String,
    sent: AskedAt,
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
            if state::with(|r| r.catalog.answer_is_current(version, sent)) {
                learn_row(ctx, row);
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
            if known(&name) && state::with(|r| r.catalog.untouched_since(&name, sent.changes)) {
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
