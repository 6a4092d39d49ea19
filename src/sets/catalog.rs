//! The set catalog in PostgreSQL is the one source of set definitions, however a node got its
//! data: read at start-up, re-read after any dataset load or promotion and whenever its version
//! changes (one cheap statement per sync interval; here), and asked about any name a command
//! names that this node does not know (`catalog_ask.rs`: only that client waits; "no such set"
//! is remembered briefly). What a node does with a definition it learned, or a set it found
//! dropped, is `learn.rs`.

use std::time::Instant;

use redis_module::Context;

use crate::db::sql::{self, CatalogRow};
use crate::db::{pool, DbErr};
use crate::sets::learn::{forget, learn_row};
use crate::sets::{catalog_ask, state};
use crate::{config, server::mainq};

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
                added += learn_row(ctx, row) as usize;
            }
            state::with(|r| r.catalog.read_applied(version, full, raced));
            // Names remembered as unknown may exist now.
            catalog_ask::names_may_exist();
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
