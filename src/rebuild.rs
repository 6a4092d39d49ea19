//! Filter (re)builds off the main thread: a dedicated thread streams the table with COPY and
//! builds a new filter; the main thread folds in the adds journaled meanwhile and swaps it in.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use redis_module::Context;

use crate::db::{self, sql, DbErr};
use crate::filter::Bloom;
use crate::filter_type::{self, FilterValue};
use crate::state::{self, Rebuild};
use crate::{mainq, metrics};

/// Starts a rebuild of `name` unless one is running. Returns false if one already was.
pub fn start(name: &str) -> bool {
    let started = state::with(|r| {
        let s = r.sets.get_mut(name)?;
        if matches!(s.rebuild, Rebuild::Running { .. }) {
            return None;
        }
        let rows = Arc::new(AtomicU64::new(0));
        s.rebuild = Rebuild::Running {
            started: Instant::now(),
            rows: rows.clone(),
            estimate: 0,
            journal: Vec::new(),
        };
        Some((s.def.clone(), rows))
    });
    let Some((def, rows)) = started else {
        return false;
    };
    let name = name.to_string();
    let thread_name = name.clone();
    let spawned = std::thread::Builder::new()
        .name("member-rebuild".into())
        .spawn(move || {
            // A rebuild has no statement timeout: it streams the whole table.
            let res = db::connect(0).and_then(|(mut c, _)| sql::build_filter(&mut c, &def, &rows));
            mainq::post(Box::new(move |ctx| finish(ctx, &thread_name, res)));
        });
    if let Err(e) = spawned {
        let name = name.clone();
        mainq::post(Box::new(move |ctx| {
            finish(
                ctx,
                &name,
                Err(DbErr::Failed(format!("cannot start thread: {e}"))),
            )
        }));
    }
    true
}

/// Main thread: swaps a finished build in, or records why it failed (the old filter keeps
/// serving; an incomplete one keeps falling through to the database).
fn finish(ctx: &Context, name: &str, res: Result<(Bloom, u64), DbErr>) {
    let done = state::with(|r| {
        let s = r.sets.get_mut(name)?;
        let Rebuild::Running {
            started, journal, ..
        } = std::mem::replace(&mut s.rebuild, Rebuild::Idle)
        else {
            return None;
        };
        Some((s.filter_key.clone(), started, journal))
    });
    let Some((key, started, journal)) = done else {
        return;
    };
    let outcome = match res {
        Ok((mut bloom, rows)) => {
            for h in journal {
                bloom.add(h);
            }
            filter_type::install(
                ctx,
                &key,
                FilterValue {
                    bloom,
                    complete: true,
                },
            );
            metrics::global(|m| m.rebuilds_done += 1);
            Ok((rows, started.elapsed()))
        }
        Err(e) => {
            metrics::global(|m| m.rebuilds_failed += 1);
            ctx.log_warning(&format!(
                "libmember: rebuild of set '{name}' failed: {}",
                e.reply_text()
            ));
            Err(e.reply_text())
        }
    };
    state::with(|r| {
        if let Some(s) = r.sets.get_mut(name) {
            s.next_rebuild_try = outcome.is_err().then(state::retry_at);
            s.last_rebuild = Some(outcome);
        }
    });
}
