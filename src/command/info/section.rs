//! The server's `INFO member` section: module-wide figures (MEMBER.NODEINFO gives one set's,
//! `info/mod.rs`).

use std::sync::atomic::Ordering;

use redis_module::InfoContext;

use crate::command::info::f;
use crate::sets::state::{self, Rebuild};
use crate::{config, db, server::metrics};

/// The `INFO member` section: the seeds' monitoring figures, module-wide.
pub fn info_section(ctx: &InfoContext, for_crash_report: bool) {
    if for_crash_report {
        // The crash may have happened mid-update of the state read below; print nothing
        // rather than panic inside the crash report.
        return;
    }
    let (sets, catalog_loaded, catalog_version, journaled) = state::with(|r| {
        let v = r.catalog.version.map(|v| v.to_string()).unwrap_or_default();
        let journaled: usize = r
            .sets
            .values()
            .map(|s| match &s.rebuild {
                Rebuild::Running { journal, .. } => journal.len(),
                Rebuild::Idle => 0,
            })
            .sum();
        (r.sets.len(), r.catalog.loaded, v, journaled)
    });
    let sync = crate::upkeep::sync::with_loop(|l| {
        [
            (
                "sync_horizon",
                crate::upkeep::sync::horizon(None).to_string(),
            ),
            ("sync_blind_sets", l.blind.len().to_string()),
            ("sync_passes", l.passes.to_string()),
            ("sync_statements", l.statements.to_string()),
            ("sync_rows_applied", l.rows.to_string()),
            ("sync_rows_read", l.rows_read.to_string()),
            ("sync_statements_per_pass", l.last_statements.to_string()),
            ("sync_rows_per_pass", l.last_rows.to_string()),
            (
                "sync_notify",
                crate::upkeep::notify::state().name().to_string(),
            ),
            (
                "sync_notify_received",
                crate::upkeep::notify::RECEIVED
                    .load(Ordering::Relaxed)
                    .to_string(),
            ),
            ("sync_notify_passes", l.woken_passes.to_string()),
            (
                "sync_notify_connects",
                crate::upkeep::notify::CONNECTS
                    .load(Ordering::Relaxed)
                    .to_string(),
            ),
            (
                "sync_notify_error",
                crate::upkeep::notify::last_error()
                    .unwrap_or_else(|| "none".into())
                    .replace(['\r', '\n'], " "),
            ),
        ]
    });
    let mut fields: Vec<(&str, String)> = metrics::global(|m| {
        let c = &m.paths;
        vec![
            ("sets", sets.to_string()),
            ("catalog_loaded", (catalog_loaded as u8).to_string()),
            ("catalog_version", catalog_version),
            (
                "catalog_asks",
                crate::sets::catalog_ask::ASKS_SENT
                    .load(Ordering::Relaxed)
                    .to_string(),
            ),
            (
                "catalog_unknown_cached",
                crate::sets::catalog_ask::unknown_cached().to_string(),
            ),
            ("db_queue", db::pool::queued().to_string()),
            (
                "db_batches",
                db::pool::BATCHES.load(Ordering::Relaxed).to_string(),
            ),
            (
                "db_batched_points",
                db::pool::BATCHED_POINTS.load(Ordering::Relaxed).to_string(),
            ),
            ("exists_calls", c.exists.to_string()),
            ("bloom_exists_true_rate", f(c.bloom_exists_true_rate())),
            ("db_fallback_rate", f(c.db_fallback_rate())),
            ("false_positive_rate_est", f(c.false_positive_rate_est())),
            ("path_bloom_negative", c.bloom_negative.to_string()),
            ("path_recent", c.recent.to_string()),
            ("path_cache_hit", c.cache_hit.to_string()),
            ("path_fp_cache", c.fp_cache.to_string()),
            ("path_db_hit", c.db_hit.to_string()),
            ("path_db_miss", c.db_miss.to_string()),
            ("false_positives", c.false_positives.to_string()),
            ("lapsed_lookups", c.lapsed.to_string()),
            ("lapsed_fp_cache", c.lapsed_cached.to_string()),
            ("filter_incomplete_lookups", c.filter_incomplete.to_string()),
            ("filter_withheld_lookups", c.withheld.to_string()),
            ("db_errors", c.db_errors.to_string()),
            ("db_timeouts", m.db_timeouts.to_string()),
            ("exists_p50_us", m.exists_latency.quantile(0.50).to_string()),
            ("exists_p95_us", m.exists_latency.quantile(0.95).to_string()),
            ("exists_p99_us", m.exists_latency.quantile(0.99).to_string()),
            (
                "exists_p999_us",
                m.exists_latency.quantile(0.999).to_string(),
            ),
            (
                "blocked_clients",
                crate::server::block::waiting().to_string(),
            ),
            (
                "timers_waiting",
                crate::server::timer::waiting().to_string(),
            ),
            (
                "max_blocked_clients",
                config::MAX_BLOCKED_CLIENTS
                    .load(Ordering::Relaxed)
                    .to_string(),
            ),
            (
                "max_sets",
                config::MAX_SETS.load(Ordering::Relaxed).to_string(),
            ),
            ("rebuild_journal", journaled.to_string()),
            (
                "max_journal",
                config::MAX_JOURNAL.load(Ordering::Relaxed).to_string(),
            ),
            (
                "memory_budget",
                match crate::server::transient::memory_budget() {
                    u64::MAX => "unlimited".to_string(),
                    b => b.to_string(),
                },
            ),
            (
                "transient_bytes",
                crate::server::transient::current().to_string(),
            ),
            (
                "transient_peak_bytes",
                crate::server::transient::peak().to_string(),
            ),
            (
                "memory_waits",
                crate::server::transient::memory_waits().to_string(),
            ),
            ("rebuilds_done", m.rebuilds_done.to_string()),
            ("auto_grow_rebuilds", m.auto_grow_rebuilds.to_string()),
            (
                "slot_fills_done",
                crate::upkeep::slot_fill::counters().0.to_string(),
            ),
            (
                "slot_fills_failed",
                crate::upkeep::slot_fill::counters().1.to_string(),
            ),
            ("loads_off_thread", m.loads_off_thread.to_string()),
            ("rebuilds_failed", m.rebuilds_failed.to_string()),
        ]
    });
    fields.extend(sync);
    // Why PostgreSQL cannot be reached (TLS, password, network), never with the password.
    let link_error = db::link::last_error().unwrap_or_else(|| "none".into());
    fields.push(("db_link_error", link_error.replace(['\r', '\n'], " ")));
    // How the workers' connections hold their statements: `direct`, or `pooled` behind a
    // connection pooler (member.pg-pooler, docs/pooler.md).
    fields.push(("db_session", db::session_shown().to_string()));
    // The history of the database this node follows, and its changes (docs/failover.md).
    fields.extend(db::identity::info_fields());
    // Whether this node's filters answer "absent" now, and why not (docs/replicas.md).
    fields.extend(crate::command::info::standing_fields());
    // The ring of tokenization keys: ids and fingerprints, never a key (docs/security.md).
    fields.extend(crate::config::token_key::ring_fields());
    // Where rebuilds read (member.pg-rebuild-url), and why it could not be used last time.
    fields.push((
        "rebuild_source",
        crate::upkeep::rebuild::source().to_string(),
    ));
    let rebuild_error = db::link::last_rebuild_error().unwrap_or_else(|| "none".into());
    fields.push((
        "rebuild_link_error",
        rebuild_error.replace(['\r', '\n'], " "),
    ));
    if crate::server::cluster_mode::enabled() {
        use crate::cluster::bus;
        let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed).to_string();
        fields.extend([
            ("forwarded_sent", n(&bus::SENT)),
            ("forwarded_waiting", bus::pending().to_string()),
            ("forwarded_timeouts", n(&bus::TIMEOUTS)),
            ("forwarded_served", n(&bus::SERVED)),
            ("forwarded_refused", n(&bus::REFUSED)),
            ("bus_nodelay_set", n(&crate::cluster::bus_nodelay::SET)),
            (
                "slot_migration_events",
                crate::server::metrics::global(|m| m.slot_migration_events).to_string(),
            ),
            (
                "slots_exporting",
                crate::cluster::owner::exporting_count().to_string(),
            ),
        ]);
    }
    let mut b = ctx.builder().add_section("");
    for (k, v) in fields {
        // Printable ASCII only: the framework makes a C string of each value (a NUL byte
        // there aborts the server), and some carry config or driver text.
        b = match b.field(k, crate::server::reply::printable(&v)) {
            Ok(b) => b,
            Err(_) => return,
        };
    }
    if let Ok(b) = b.build_section() {
        let _ = b.build_info();
    }
}
