//! The sync loop: rows that reach `member_<set>` without the module (another service, a
//! migration, psql) reach the filter within about `member.sync-interval-ms`, and a filter
//! loaded from a snapshot or held by a promoted replica catches up before it says "absent".

use std::time::{Duration, Instant};

use redis_module::{Context, RedisString};

use crate::db::{pool, sql, DbErr};
use crate::state::{self, SetDef};
use crate::{config, filter_type, mainq};

/// Per-set sync progress, shown by MEMBER.INFO.
#[derive(Debug, Default)]
pub struct SyncState {
    in_flight: bool,
    next: Option<Instant>,
    pub last_ok: Option<Instant>,
    pub last_error: Option<String>,
    pub rows_applied: u64,
}

/// Starts a sync pass for every set that is due (or all of them, if `now_all`).
pub fn run(ctx: &Context, now_all: bool) {
    let interval = config::sync_interval();
    let now = Instant::now();
    let due: Vec<(SetDef, u64, RedisString)> = state::with(|r| {
        r.sets
            .values_mut()
            .filter(|s| !s.sync.in_flight && (now_all || s.sync.next.is_none_or(|t| now >= t)))
            .map(|s| {
                s.sync.next = Some(now + interval);
                (s.def.clone(), s.incarnation, s.filter_key.clone())
            })
            .collect()
    });
    for (def, incarnation, key) in due {
        // Only a filter with a watermark can be caught up; others wait for their rebuild or
        // for a filter to arrive (by replication, say, after the set was learned from the
        // catalog): looked at again at the next sweep, not an interval later.
        let Some(Some(from)) = filter_type::with(ctx, &key, |f| f.cov.watermark) else {
            state::with(|r| {
                if let Some(s) = r.sets.get_mut(&def.name) {
                    s.sync.next = None;
                }
            });
            continue;
        };
        let name = def.name.clone();
        state::with(|r| {
            if let Some(s) = r.sets.get_mut(&name) {
                s.sync.in_flight = true;
                s.sync.next = Some(now + interval);
            }
        });
        let epoch = state::with(|r| r.epoch);
        let pass = Pass {
            name,
            incarnation,
            epoch,
            from,
            result: Some(Err(DbErr::Unavailable("sync job dropped".into()))),
        };
        pool::run(move |db| {
            let mut pass = pass;
            pass.result = Some(sql::changes_since(db, &def, from));
        });
    }
}

/// One pass in flight. However it ends (done, or dropped unrun), its result goes back to the
/// main thread exactly once.
struct Pass {
    name: String,
    /// The set's incarnation when the pass started: a pass over a set dropped since is
    /// discarded.
    incarnation: u64,
    /// Promotion epoch when the pass started.
    epoch: u64,
    from: i64,
    result: Option<Result<(Vec<u128>, i64), DbErr>>,
}

impl Drop for Pass {
    fn drop(&mut self) {
        let (name, from, epoch) = (std::mem::take(&mut self.name), self.from, self.epoch);
        let incarnation = self.incarnation;
        let res = self
            .result
            .take()
            .unwrap_or(Err(DbErr::Unavailable("sync lost".into())));
        mainq::post(Box::new(move |ctx| {
            apply(ctx, &name, incarnation, epoch, from, res)
        }));
    }
}

fn apply(
    ctx: &Context,
    name: &str,
    incarnation: u64,
    epoch: u64,
    from: i64,
    res: Result<(Vec<u128>, i64), DbErr>,
) {
    let key = state::with(|r| {
        let s = r.sets.get_mut(name)?;
        if s.incarnation != incarnation {
            return None;
        }
        s.sync.in_flight = false;
        match &res {
            Ok((hashes, _)) => {
                for h in hashes {
                    s.journal(*h);
                }
                s.sync.rows_applied += hashes.len() as u64;
                s.sync.last_ok = Some(Instant::now());
                s.sync.last_error = None;
            }
            Err(e) => s.sync.last_error = Some(e.reply_text()),
        }
        Some(s.filter_key.clone())
    });
    let (Some(key), Ok((hashes, horizon))) = (key, res) else {
        return;
    };
    let caught = filter_type::with_mut(ctx, &key, |f| f.apply_sync(&hashes, from, horizon));
    state::with(|r| {
        if let Some(s) = r.sets.get_mut(name) {
            s.filter_synced(caught.flatten(), !hashes.is_empty());
        }
        state::synced(r, name, epoch)
    });
}

/// Time since the last successful pass, for MEMBER.INFO.
pub fn age(s: &SyncState) -> Option<Duration> {
    s.last_ok.map(|t| t.elapsed())
}
