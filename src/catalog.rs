//! Learning the sets from PostgreSQL: at start-up (retried until the database answers) the
//! catalog is read on a worker and registered on the main thread.

use redis_module::Context;

use crate::db::{pool, sql, DbErr};
use crate::mainq;
use crate::state::{self, SetDef};

/// Loads the catalog in the background. However the job ends (done, dropped from a full
/// queue, panicked), its outcome reaches the main thread, so the load is retried.
pub fn load() {
    let load = Load(None);
    pool::run(move |db| {
        let mut load = load;
        load.0 = Some(sql::load_catalog(db));
    });
}

struct Load(Option<Result<Vec<SetDef>, DbErr>>);

impl Drop for Load {
    fn drop(&mut self) {
        let res = self
            .0
            .take()
            .unwrap_or_else(|| Err(DbErr::Unavailable("catalog load did not run".into())));
        mainq::post(Box::new(move |ctx| apply(ctx, res)));
    }
}

fn apply(ctx: &Context, res: Result<Vec<SetDef>, DbErr>) {
    match res {
        Ok(defs) => {
            let n = defs.len();
            for def in defs {
                state::register(def);
            }
            state::with(|r| {
                r.catalog.loaded = true;
                r.catalog.loading = false;
                r.catalog.last_error = None;
            });
            crate::reply::log(
                ctx,
                crate::reply::Level::Notice,
                &format!("libmember: catalog loaded, {n} set(s)"),
            );
        }
        Err(e) => {
            let msg = e.reply_text();
            state::with(|r| {
                let c = &mut r.catalog;
                c.loading = false;
                c.next_try = Some(state::retry_at());
                if c.last_error.as_deref() != Some(msg.as_str()) {
                    crate::reply::log(
                        ctx,
                        crate::reply::Level::Warning,
                        &format!("libmember: cannot load the set catalog: {msg}"),
                    );
                }
                c.last_error = Some(msg);
            });
        }
    }
}
