//! MEMBER.ADD and MEMBER.DEL: database first (on a worker), then on the main thread the
//! derived effects (recent mark, filter bit, cache invalidation), then the reply.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::forward;
use crate::command::retry::after_catalog;
use crate::command::{
    block_on_point, block_timeout, may_block, point_for, AskFirst, ItemArgs, Options, PointDone,
};
use crate::db::pool::{self, Job, Point};
use crate::db::{members, DbErr};
use crate::model::canon::Canon;
use crate::server::block::Completion;
use crate::{
    config::token_key, model::error, model::funnel, server::replication, sets::effects, sets::keys,
    sets::state,
};

/// Longest TTL or EXPIREAT horizon accepted: 10 years.
const MAX_TTL_S: i64 = 315_360_000;

/// The membership's expiry (unix seconds) from TTL or EXPIREAT, if any.
pub(super) fn expiry(opts: &Options) -> Result<Option<f64>, RedisError> {
    let ttl = opts.int("TTL", 1..=MAX_TTL_S, error::BAD_TTL)?;
    let now = funnel::now_s();
    let at = opts.int("EXPIREAT", 1..=i64::MAX, error::BAD_EXPIREAT)?;
    match (ttl, at) {
        (Some(_), Some(_)) => Err(RedisError::Str(error::TTL_AND_EXPIREAT)),
        (Some(t), None) => Ok(Some(now + t as f64)),
        (None, Some(at)) => {
            let at = at as f64;
            if at <= now || at > now + MAX_TTL_S as f64 {
                return Err(RedisError::Str(error::BAD_EXPIREAT));
            }
            Ok(Some(at))
        }
        (None, None) => Ok(None),
    }
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Op {
    Add,
    Del,
}

impl Op {
    fn wire(self) -> crate::cluster::wire::Op {
        match self {
            Op::Add => crate::cluster::wire::Op::Add,
            Op::Del => crate::cluster::wire::Op::Del,
        }
    }
}

/// A write's outcome, applied on the main thread whether or not its client still waits.
#[derive(Clone)]
pub(super) struct WriteDone {
    op: Op,
    set: String,
    entity: String,
    scope: String,
    hash: u128,
    /// While the set's key rotates: the new form of the item and its hash, stored (or
    /// deleted) in the same statement, its effects applied and replicated with the item's
    /// (`sets::rotation::twin_of`, decided with the form).
    twin: Option<(String, u128)>,
    /// The set's incarnation when the write began (see `apply`).
    incarnation: u64,
    /// The set's RECENT-TTL, in seconds (the twin's marks, `twin_hold`).
    recent_ttl: u64,
    result: Result<bool, DbErr>,
}

impl AskFirst for WriteDone {
    /// In a cluster, a write that stores (or deletes) a twin: its slot is likely another
    /// node's.
    fn may_ask_first(&self) -> bool {
        self.twin.is_some() && crate::server::cluster_mode::enabled()
    }

    /// The twin's effects, for the owner of its slot when that is another node (this node
    /// applied them itself in `apply`); none for a write that failed, whose client hears so.
    fn ask_first(&self) -> Vec<(u16, crate::cluster::wire::Request)> {
        if self.result.is_err() {
            return Vec::new();
        }
        let op = match self.op {
            Op::Add => crate::cluster::wire::Op::TwinAdd,
            Op::Del => crate::cluster::wire::Op::TwinDel,
        };
        self.twin_request(op, None).into_iter().collect()
    }
}

impl WriteDone {
    /// In a cluster, while the set's key rotates, the mark the owner of the twin's slot must
    /// hold before the statement runs, when that is another node (this one holds its own in
    /// `begin`): an ADD's recent mark, or a DEL's, for `twin_hold` (docs/security.md, "A gap
    /// the cluster history checker found").
    pub(super) fn twin_begin(&self) -> Option<(u16, crate::cluster::wire::Request)> {
        let op = match self.op {
            Op::Add => crate::cluster::wire::Op::TwinBeginAdd,
            Op::Del => crate::cluster::wire::Op::TwinBeginDel,
        };
        let hold = twin_hold(self.recent_ttl).as_secs_f64();
        self.twin_request(op, Some(hold))
    }

    /// The request `op` about the twin, for the owner of its slot: in a cluster, when the
    /// write has a twin and another node holds its slot.
    fn twin_request(
        &self,
        op: crate::cluster::wire::Op,
        expires_at: Option<f64>,
    ) -> Option<(u16, crate::cluster::wire::Request)> {
        let (twin, _) = self.twin.as_ref()?;
        if !crate::server::cluster_mode::enabled() {
            return None;
        }
        let slot = crate::model::slot::keyslot(twin.as_bytes());
        if crate::cluster::owner::owns(slot) {
            return None;
        }
        let req = crate::cluster::wire::Request {
            id: 0,
            op,
            set: self.set.clone(),
            entity: twin.clone(),
            scope: String::new(),
            expires_at,
        };
        Some((slot, req))
    }
}

/// How long a twin's begin mark holds from when its owner sets it: the write's start may wait
/// until `member.db-timeout-ms` after its mark was asked for (`start`), its statement may run
/// for a write's `statement_timeout`, and an ADD's mark is held RECENT-TTL after the commit
/// (as the writer's own is after its end), by which the twin's effects have landed.
fn twin_hold(recent_ttl: u64) -> std::time::Duration {
    let ms = crate::config::db_timeout_ms() + crate::db::Bounds::now().other_ms;
    std::time::Duration::from_millis(ms) + std::time::Duration::from_secs(recent_ttl)
}

impl PointDone<bool> for WriteDone {
    fn target(&self) -> (&str, &str, &str) {
        (&self.set, &self.entity, &self.scope)
    }
    fn answered(&mut self, res: Result<bool, DbErr>) {
        self.result = res;
    }
    fn twin(&self) -> Option<&str> {
        self.twin.as_ref().map(|(w, _)| w.as_str())
    }
}

impl Completion for WriteDone {
    fn apply(&mut self, ctx: &Context) {
        // The set was dropped while the write ran (and maybe created again): the row may be
        // in a table that outlives the set, but no filter, mark or replica of this set
        // incarnation is left to update, and the next one is built from the table.
        if !state::with(|r| state::is_current(r, &self.set, self.incarnation)) {
            return;
        }
        let forms = std::iter::once((self.entity.as_str(), self.scope.as_str(), self.hash))
            .chain(self.twin.as_ref().map(|(w, hash)| (w.as_str(), "", *hash)));
        for (entity, scope, hash) in forms {
            let canon = Canon {
                entity: std::borrow::Cow::Borrowed(entity),
                scope,
                hash,
            };
            let args: [&[u8]; 3] = [self.set.as_bytes(), entity.as_bytes(), scope.as_bytes()];
            match self.op {
                // The filter bit goes in whatever the outcome: if the insert committed it
                // must, and if it did not, a stray bit is only a false positive.
                Op::Add => {
                    effects::added(ctx, &self.set, &canon);
                    replication::replicate(ctx, "MEMBER._ADD", &args);
                }
                Op::Del => {
                    effects::removed(ctx, &self.set, &canon);
                    replication::replicate(ctx, "MEMBER._DEL", &args);
                }
            }
        }
        let twin_hash = self.twin.as_ref().map(|(_, h)| *h);
        match self.op {
            Op::Add => {
                state::with(|r| {
                    if let Some(set) = r.sets.get_mut(&self.set) {
                        set.mark_end(self.hash);
                        if let Some(h) = twin_hash {
                            set.mark_end(h);
                        }
                        set.stats.adds += 1;
                        if matches!(self.result, Ok(true)) {
                            set.stats.adds_new += 1;
                        }
                    }
                });
            }
            Op::Del => {
                state::with(|r| {
                    if let Some(set) = r.sets.get_mut(&self.set) {
                        set.stats.dels += 1;
                    }
                });
            }
        }
    }

    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match &self.result {
            Ok(b) => Ok(RedisValue::Integer(*b as i64)),
            Err(e) => Err(RedisError::String(e.reply_text())),
        }
    }
}

fn write(ctx: &Context, args: Vec<RedisString>, op: Op) -> RedisResult {
    let extra: &[&'static str] = if op == Op::Add {
        &["TTL", "EXPIREAT"]
    } else {
        &[]
    };
    let a = ItemArgs::parse(args, extra)?;
    crate::sets::acl::check_set(ctx, &a.set, crate::sets::acl::Access::Write)?;
    let expires_at = expiry(&a.opts)?;
    keys::with_db0(ctx, |ctx| {
        let plan = prepare(&a.set, a.item.as_slice(), a.scope(), op, expires_at, false)?;
        let Some(plan) = plan else {
            // A set this node does not know: ask the catalog (only this client waits).
            let (name, item, scope) = (
                a.set.clone(),
                a.item.as_slice().to_vec(),
                a.scope().to_vec(),
            );
            return after_catalog(
                ctx,
                &a.set,
                block_timeout(),
                move |_| prepare(&name, &item, &scope, op, expires_at, true),
                move |ctx, blocked, plan| match plan {
                    Plan::Here(done) => start(ctx, done, |d| point_for(blocked, d), expires_at),
                    Plan::Elsewhere(e) => forward::start(ctx, blocked, e),
                },
            );
        };
        match plan {
            Plan::Here(done) => {
                may_block(ctx)?;
                start(ctx, done, |d| block_on_point(ctx, d), expires_at);
                Ok(RedisValue::NoReply)
            }
            Plan::Elsewhere(e) => forward::block_and_start(ctx, e),
        }
    })
}

/// Where a write goes.
enum Plan {
    /// This node makes it.
    Here(WriteDone),
    /// The node holding the item's canonical slot makes it (cluster mode).
    Elsewhere(forward::Elsewhere),
}

/// The write of `item` to a set this node knows, canonicalized; `None` for a set the catalog
/// must be asked about first (unknown, or held back after a promotion unless `confirmed`).
fn prepare(
    set: &str,
    item: &[u8],
    scope: &[u8],
    op: Op,
    expires_at: Option<f64>,
    confirmed: bool,
) -> Result<Option<Plan>, RedisError> {
    state::with(|r| {
        let s = r.serving(set, confirmed);
        let Some(s) = s else {
            return Ok(None);
        };
        if s.def.source.is_some() && expires_at.is_some() {
            return Err(RedisError::Str(error::SOURCE_NO_EXPIRY));
        }
        // While the set's key rotates, the old form (its twin is stored with it).
        let def = crate::sets::rotation::write_def(s);
        let canon = token_key::canonical(&def, item, scope).map_err(RedisError::Str)?;
        if let Some(e) = forward::elsewhere(item, &canon, set, op.wire(), expires_at) {
            return Ok(Some(Plan::Elsewhere(e)));
        }
        Ok(Some(Plan::Here(WriteDone::new(op, s, canon)?)))
    })
}

/// The write of an item already canonical (forwarded by another node) to a set this node
/// serves; `None` for a set it does not serve yet.
pub(super) fn prepare_canonical(
    set: &str,
    canon: Canon,
    op: Op,
) -> Result<Option<WriteDone>, RedisError> {
    state::with(|r| {
        r.serving(set, false)
            .map(|s| WriteDone::new(op, s, canon))
            .transpose()
    })
}

impl WriteDone {
    /// The write `op` of `canon` to `set` (with its twin while the set's key rotates), its
    /// result preset to the error a lost job gives.
    pub(super) fn new(
        op: Op,
        set: &state::SetState,
        canon: Canon,
    ) -> Result<WriteDone, RedisError> {
        let twin = crate::sets::rotation::twin_of(set, &canon.entity, canon.scope)
            .map_err(|e| RedisError::String(format!("ERR {e}")))?
            .map(|w| {
                let hash = crate::model::canon::hash_parts(&w, "");
                (w, hash)
            });
        Ok(WriteDone {
            op,
            set: set.def.name.clone(),
            entity: canon.entity.into_owned(),
            scope: canon.scope.to_string(),
            hash: canon.hash,
            twin,
            incarnation: set.incarnation,
            recent_ttl: set.def.recent_ttl,
            result: Err(DbErr::Unavailable(error::WORKER_LOST.into())),
        })
    }

    /// (entity, scope) as the database stores them.
    pub(super) fn row(&self) -> (&str, &str) {
        (&self.entity, &self.scope)
    }
}

/// The write is about to be sent: an ADD's recent-writes marks go up first, and a rotating
/// set's DEL's marks in a cluster (`twin_begin`): while the two forms of an item have two
/// owners, a DEL in flight must not be answered 1 from one form's exact-match key after the
/// other form's owner answered 0 from the database.
pub(super) fn begin(done: WriteDone) -> WriteDone {
    state::with(|r| {
        let Some(s) = r.sets.get_mut(&done.set) else {
            return;
        };
        let twin = done.twin.as_ref().map(|(_, h)| *h);
        match done.op {
            Op::Add => {
                s.mark_begin(done.hash);
                if let Some(h) = twin {
                    s.mark_begin(h);
                }
            }
            Op::Del if twin.is_some() && crate::server::cluster_mode::enabled() => {
                let time = twin_hold(done.recent_ttl);
                s.hold_delete(done.hash, time);
                if let Some(h) = twin {
                    s.hold_delete(h, time);
                }
            }
            Op::Del => {}
        }
    });
    done
}

/// Starts `done`: marks it begun (`begin`), here and, for a rotating set's twin in another
/// node's slot, on that node first (`twin_begin`); then queues its statement, whose answer
/// completes the point `point` makes. If the twin's owner does not mark it in time
/// (`forward::once_begun`), nothing is stored and the answer is `TWIN_NOT_BEGUN`.
pub(super) fn start(
    ctx: &Context,
    done: WriteDone,
    point: impl FnOnce(WriteDone) -> Point<bool>,
    expires_at: Option<f64>,
) {
    let op = done.op;
    let ask = done.twin_begin();
    let point = point(begin(done));
    let Some(ask) = ask else {
        return send(point, op, expires_at);
    };
    let statement = Box::new(move |db: Option<&mut crate::db::Db>| match (db, op) {
        (None, _) => (point.reply)(Err(DbErr::Refused(error::TWIN_NOT_BEGUN))),
        (Some(db), Op::Add) => pool::add_now(db, point, expires_at),
        (Some(db), Op::Del) => del_now(db, point),
    });
    forward::once_begun(ctx, vec![ask], statement);
}

/// Queues the write for a worker; its answer completes `point`'s client.
fn send(point: Point<bool>, op: Op, expires_at: Option<f64>) {
    pool::submit(match op {
        Op::Add => Job::Add(point, expires_at),
        Op::Del => Job::Run(Box::new(move |db| del_now(db, point))),
    });
}

/// A DEL's statement, on a worker.
fn del_now(db: &mut crate::db::Db, point: Point<bool>) {
    let twin = point.twin.as_deref();
    let res = members::del(db, &point.set, &point.entity, &point.scope, twin);
    (point.reply)(res);
}

/// MEMBER.ADD <set> <item> [SCOPE <scope>] [TTL <s> | EXPIREAT <unix-s>]
pub fn add(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    write(ctx, args, Op::Add)
}

/// MEMBER.DEL <set> <item> [SCOPE <scope>]
pub fn del(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    write(ctx, args, Op::Del)
}
