//! MEMBER.NODEINFO: this node's MEMBER.INFO of a set (MEMBER.INFO itself is `wide.rs`; the
//! server's `INFO member` section is `info/section.rs`).

pub mod section;
pub mod wide;

use std::sync::atomic::Ordering;

use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::set_name;
use crate::sets::state::{self, Rebuild};
use crate::{config, filter::store, sets::keys};

/// A rate or fraction as INFO prints it: six decimals.
/// The node's standing, in MEMBER.INFO and `INFO member` (docs/replicas.md): whether its
/// filters answer "absent" now (`serves_absent`) and why not (`serves_absent_withheld`:
/// `link-down`, `grace`, `catching-up` or `none`), the replica's link (`replica_link`: `up`,
/// `down`, or `none` on a primary), how long ago the role or the link last changed, how often a
/// link was lost, and the staleness bound measured now (`filter_lag_ms`: since the start of the
/// oldest set's last catch-up; empty before any).
pub(in crate::command) fn standing_fields() -> Vec<(&'static str, String)> {
    let s = crate::sets::standing::shown();
    let lag = state::with(|r| {
        let now = std::time::Instant::now();
        r.sets
            .values()
            .map(|s| s.covered_since.map(|t| now.duration_since(t).as_millis()))
            .max()
            .flatten()
    });
    let link = match (s.replica, s.link_up) {
        (false, _) => "none",
        (true, true) => "up",
        (true, false) => "down",
    };
    vec![
        ("serves_absent", (s.withheld.is_none() as u8).to_string()),
        (
            "serves_absent_withheld",
            s.withheld.unwrap_or("none").into(),
        ),
        ("replica_link", link.into()),
        (
            "standing_changed_ms_ago",
            s.since_ms.map(|m| m.to_string()).unwrap_or_default(),
        ),
        ("replica_link_losses", s.link_losses.to_string()),
        ("replica_lag_holds", s.lag_holds.to_string()),
        (
            "replica_lag_bound_ms",
            crate::sets::standing::lag_bound().as_millis().to_string(),
        ),
        (
            "filter_lag_ms",
            lag.map(|m| m.to_string()).unwrap_or_default(),
        ),
    ]
}

pub(in crate::command) fn f(x: f64) -> String {
    format!("{x:.6}")
}

/// MEMBER.NODEINFO <set>: MEMBER.INFO's fields as this node holds them (MEMBER.INFO itself,
/// standalone: `wide::info`): settings, filter geometry and fill, rebuild state, counters
/// per path. Without a set: the
/// names of the sets this node holds that the caller may read, sorted.
pub fn nodeinfo(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() == 1 {
        let mut names: Vec<String> = state::with(|r| r.sets.keys().cloned().collect());
        names.retain(|n| {
            crate::sets::acl::check_set(ctx, n, crate::sets::acl::Access::Read).is_ok()
        });
        names.sort();
        return Ok(RedisValue::Array(
            names.into_iter().map(RedisValue::BulkString).collect(),
        ));
    }
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let name = set_name(&args[1])?;
    crate::sets::acl::check_set(ctx, &name, crate::sets::acl::Access::Read)?;
    if state::with(|r| r.serving(&name, false).is_none()) {
        let later = InfoLater(name.clone());
        return crate::command::retry::after_catalog(
            ctx,
            &name,
            crate::command::block_timeout(),
            |_| Ok(Some(later)),
            |_, blocked, later| blocked.finish(Box::new(later)),
        );
    }
    set_info(ctx, &name)
}

/// MEMBER.INFO of a set this node learned from the catalog while the client waited.
struct InfoLater(String);

impl crate::server::block::Completion for InfoLater {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, ctx: &Context) -> RedisResult {
        set_info(ctx, &self.0)
    }
}

fn set_info(ctx: &Context, name: &str) -> RedisResult {
    reply_map(ctx, fields(ctx, name)?);
    Ok(RedisValue::NoReply)
}

/// This node's MEMBER.INFO fields of `name`, in their order.
pub(in crate::command) fn fields(
    ctx: &Context,
    name: &str,
) -> Result<Vec<(&'static str, String)>, RedisError> {
    keys::with_db0(ctx, |ctx| {
        let mut out: Vec<(&'static str, String)> = Vec::new();
        let key = state::with(|r| -> Result<_, RedisError> {
            let epoch = r.epoch;
            let s = r.find(name)?;
            let current = s.synced_epoch == epoch;
            let d = &s.def;
            out.push(("name", d.name.clone()));
            match &d.source {
                None => {
                    out.push(("table", crate::db::sql::table(&d.name)));
                    out.push(("sync_mode", "log".into()));
                }
                // An attached set (docs/attach.md): the table it answers from, and how
                // outside writes reach it.
                Some(src) => {
                    out.push(("table", src.qualified()));
                    out.push(("source", src.qualified()));
                    out.push(("source_column", src.column.clone()));
                    let scope = src.scope_column.clone().unwrap_or_default();
                    out.push(("source_scope_column", scope));
                    out.push(("sync_mode", src.sync.name().into()));
                    if let crate::sets::state::SourceSync::Updated(u) = &src.sync {
                        out.push(("source_updated_column", u.clone()));
                        let ms = crate::config::source_lookback_ms();
                        out.push(("source_lookback_ms", ms.to_string()));
                    }
                }
            }
            out.push(("normalize", d.normalize.name().into()));
            out.push(("tokenize", d.tokenize.name().into()));
            if let Some(fp) = d.tokenize.fingerprint() {
                // The set's key fingerprint, and whether the key loaded here is that one.
                out.push(("token_key_fp", fp.to_string()));
                out.push((
                    "token_key",
                    crate::config::token_key::status(&d.tokenize).into(),
                ));
                // Its id in this node's key ring (empty when the ring lacks it).
                out.push(("token_key_id", crate::config::token_key::id_of(&d.tokenize)));
                out.extend(rotation_fields(&d.name, s.rotation.as_ref()));
            }
            out.push(("error_rate", d.error_rate.to_string()));
            out.push(("capacity", d.capacity.to_string()));
            out.push(("cache_ttl", d.cache_ttl.to_string()));
            out.push(("recent_ttl", d.recent_ttl.to_string()));
            // The history of the database the set's state comes from (docs/failover.md).
            out.extend(crate::db::identity::info_fields());
            Ok((s.filter_key.clone(), s.trusted, current, s.catalog_id))
        })?;
        let (key, trusted, current, set_id) = key;
        out.extend(standing_fields());
        let node = crate::db::identity::node();
        let filter = store::with(ctx, &key, |v| {
            let b = &v.bloom;
            vec![
                ("filter_present", "1".to_string()),
                ("filter_complete", (v.cov.complete as u8).to_string()),
                (
                    "filter_caught_up",
                    ((trusted == Some(v.id)) as u8).to_string(),
                ),
                // Caught up, and by work late enough after a promotion (state::synced): the
                // filter answers "absent" (in a cluster, for the slots in cluster_slots_ready).
                (
                    "filter_serves_absent",
                    ((v.trusted(trusted) && current) as u8).to_string(),
                ),
                // Where the value was made (`filter_origin`): `here`, or `foreign` (another
                // database or set, or an older payload: rebuilt, never trusted), or
                // `unverified` (this node has not learned its database yet).
                (
                    "filter_origin",
                    v.verdict(name, node, set_id).name().to_string(),
                ),
                (
                    "sync_watermark_xid",
                    v.cov.watermark.map(|w| w.to_string()).unwrap_or_default(),
                ),
                ("filter_bits", b.bits().to_string()),
                // The settings it was built for (a set's may have changed since: ALTER).
                ("filter_capacity", b.capacity().to_string()),
                ("filter_error_rate", b.configured_fpr().to_string()),
                ("filter_hashes", b.hashes().to_string()),
                ("filter_items", b.items().to_string()),
                ("filter_bytes", b.bytes().to_string()),
                ("filter_fill", f(b.fill())),
                ("filter_fpr_est", f(b.estimated_fpr())),
                // The design and its parts (filter.rs): the rows of the last build in a
                // static part, adds since in a Bloom delta; fill and hashes are the delta's.
                ("filter_design", b.design().to_string()),
                ("filter_static_items", b.static_items().to_string()),
                ("filter_static_bits", b.static_bits().to_string()),
                ("filter_static_parts", b.static_parts().to_string()),
                ("filter_static_fpr_est", f(b.static_fpr())),
                ("filter_delta_items", b.delta_items().to_string()),
                ("filter_delta_bits", b.delta_bits().to_string()),
                ("filter_delta_fpr_est", f(b.delta_fpr())),
                ("fp_cache_entries", v.known_absent.live().to_string()),
                (
                    "cluster_slots_covered",
                    v.slots
                        .as_ref()
                        .map_or("all".to_string(), |s| s.len().to_string()),
                ),
            ]
        })
        .unwrap_or_else(|| {
            // No filter: every lookup goes to the database. The fields operators alert on
            // say so rather than disappear.
            vec![
                ("filter_present", "0".to_string()),
                ("filter_complete", "0".to_string()),
                ("filter_caught_up", "0".to_string()),
                ("filter_serves_absent", "0".to_string()),
            ]
        });
        out.extend(filter);
        state::with(|r| {
            let s = r.sets.get(name).expect("checked above");
            match &s.rebuild {
                Rebuild::Idle => out.push(("rebuild_state", "idle".into())),
                Rebuild::Running {
                    reason,
                    started,
                    rows,
                    estimate,
                    ..
                } => {
                    out.push(("rebuild_state", "running".into()));
                    out.push(("rebuild_reason", reason.name().into()));
                    let n = rows.load(Ordering::Relaxed);
                    let estimate = estimate.load(Ordering::Relaxed);
                    out.push(("rebuild_rows", n.to_string()));
                    out.push(("rebuild_rows_estimate", estimate.to_string()));
                    let pct = if estimate > 0 {
                        (n as f64 / estimate as f64 * 100.0).min(100.0)
                    } else {
                        0.0
                    };
                    out.push(("rebuild_percent", format!("{pct:.1}")));
                    out.push((
                        "rebuild_elapsed_s",
                        format!("{:.3}", started.elapsed().as_secs_f64()),
                    ));
                }
            }
            match &s.last_rebuild {
                None => out.push(("last_rebuild", "none".into())),
                Some((_, Ok((rows, took)))) => {
                    out.push(("last_rebuild", "ok".into()));
                    out.push(("last_rebuild_rows", rows.to_string()));
                    out.push(("last_rebuild_s", format!("{:.3}", took.as_secs_f64())));
                }
                Some((_, Err(e))) => {
                    out.push(("last_rebuild", "failed".into()));
                    out.push(("last_rebuild_error", e.clone()));
                    // Failed in a row, and the wait before the next automatic try.
                    out.push(("rebuild_failures", s.rebuild_failures.to_string()));
                    let wait = state::retry_after_failures(s.rebuild_failures.max(1));
                    out.push(("rebuild_retry_wait_s", wait.as_secs().to_string()));
                }
            }
            out.push((
                "rebuild_source",
                crate::upkeep::rebuild::source_of(&s.def).into(),
            ));
            out.push((
                "last_rebuild_reason",
                s.last_rebuild_reason.map_or("none", |r| r.name()).into(),
            ));
            out.push(("auto_grow", (config::auto_grow() as u8).to_string()));
            out.push(("auto_grow_rebuilds", s.grow.rebuilds.to_string()));
            if let Some(e) = &s.grow.error {
                out.push(("auto_grow_error", e.clone()));
            }
            out.push(("recent_marks", s.recent_marks().to_string()));
            out.push((
                "sync_age_ms",
                crate::upkeep::sync::age(&s.sync)
                    .map(|d| d.as_millis().to_string())
                    .unwrap_or_else(|| "never".into()),
            ));
            out.push(("sync_rows_applied", s.sync.rows_applied.to_string()));
            // What the set's pages, build parts and payloads hold now, and held at most.
            let (held, peak) = crate::server::transient::of_set(&s.def.name);
            out.push(("transient_bytes", held.to_string()));
            out.push(("transient_peak_bytes", peak.to_string()));
            if crate::server::cluster_mode::enabled() {
                // Everything below is this node's part of the set, and says which node that is.
                let me = match ctx.call("CLUSTER", &["MYID"]) {
                    Ok(redis_module::RedisValue::BulkString(s))
                    | Ok(redis_module::RedisValue::SimpleString(s)) => s,
                    _ => "unknown".into(),
                };
                out.push(("cluster_node", me));
                let role = if crate::cluster::owner::is_primary() {
                    "primary"
                } else {
                    "replica"
                };
                out.push(("cluster_role", role.into()));
                // The slots it answers for, and those whose negatives count.
                let (owned, ready, err) = crate::cluster::owner::summary(s.covered_since);
                out.push(("cluster_slots_owned", owned.to_string()));
                out.push(("cluster_slots_ready", ready.to_string()));
                if let Some(e) = err {
                    out.push(("cluster_poll_error", e));
                }
            }
            out.push((
                "sync_horizon",
                crate::upkeep::sync::horizon(Some(name)).into(),
            ));
            if let Some(e) = &s.sync.last_error {
                out.push(("sync_last_error", e.clone()));
            }
            let c = &s.stats;
            out.push(("exists_calls", c.exists.to_string()));
            out.push(("path_bloom_negative", c.bloom_negative.to_string()));
            out.push(("path_recent", c.recent.to_string()));
            out.push(("path_cache_hit", c.cache_hit.to_string()));
            out.push(("path_fp_cache", c.fp_cache.to_string()));
            out.push(("path_db_hit", c.db_hit.to_string()));
            out.push(("path_db_miss", c.db_miss.to_string()));
            out.push(("false_positives", c.false_positives.to_string()));
            out.push(("lapsed_lookups", c.lapsed.to_string()));
            out.push(("lapsed_fp_cache", c.lapsed_cached.to_string()));
            out.push(("filter_incomplete_lookups", c.filter_incomplete.to_string()));
            out.push(("filter_withheld_lookups", c.withheld.to_string()));
            out.push(("db_errors", c.db_errors.to_string()));
            out.push(("adds", c.adds.to_string()));
            out.push(("adds_new", c.adds_new.to_string()));
            out.push(("dels", c.dels.to_string()));
            out.push(("bloom_exists_true_rate", f(c.bloom_exists_true_rate())));
            out.push(("db_fallback_rate", f(c.db_fallback_rate())));
            out.push(("false_positive_rate_est", f(c.false_positive_rate_est())));
        });
        Ok(out)
    })
}

/// Replies with `fields` as a map, in their order: a map under RESP3, the same field, value,
/// field, value … array under RESP2 (the server flattens it).
pub(in crate::command) fn reply_map(ctx: &Context, fields: Vec<(&'static str, String)>) {
    raw::reply_with_map(ctx.ctx, fields.len() as std::os::raw::c_long);
    for (k, v) in fields {
        ctx.reply(Ok(RedisValue::SimpleStringStatic(k)));
        ctx.reply(Ok(RedisValue::BulkString(v)));
    }
}

/// A tokenized set's online key rotation (docs/security.md): its phase (`none` when none
/// runs), the id of the key it moves to, the form this node computes, and, on the primary
/// driving it, the rows its steps moved, their rate, the nodes it waits for and its last error.
fn rotation_fields(
    set: &str,
    rot: Option<&crate::sets::rotation::Rotating>,
) -> Vec<(&'static str, String)> {
    let Some(rot) = rot else {
        return vec![("token_rotation", "none".into())];
    };
    let to = crate::config::token_key::entries()
        .into_iter()
        .find(|(_, fp)| *fp == rot.row.to)
        .map_or_else(|| "?".to_string(), |(id, _)| id);
    let mut out = vec![
        ("token_rotation", rot.row.phase.name().to_string()),
        ("token_rotation_to", to),
        (
            "token_rotation_form",
            if rot.switched { "new" } else { "old" }.to_string(),
        ),
    ];
    let pace = crate::upkeep::rotation::status(set);
    // The driving primary's count as its last step left it; elsewhere the catalog's as this
    // node last read it.
    if let Some(left) = pace.as_ref().and_then(|p| p.left).or(rot.row.left) {
        out.push(("token_rotation_rows_left", left.to_string()));
    }
    if let Some(p) = pace {
        let secs = p.since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let rate = if secs > 0.0 {
            p.rows as f64 / secs
        } else {
            0.0
        };
        out.push(("token_rotation_rows", p.rows.to_string()));
        out.push(("token_rotation_rows_per_s", format!("{rate:.0}")));
        out.push(("token_rotation_waiting_for", p.waiting_for.join(",")));
        out.push((
            "token_rotation_last_error",
            p.last_error.unwrap_or_default(),
        ));
    }
    out
}
