//! Module load: `init` (configs first, then the data types, commands, events and the threads
//! and timers that run the module), the INFO section, and the server events that make a node
//! re-read the set catalog. `lib.rs` hands these to the server.

use redis_module::{Context, InfoContext, RedisString, Status};

use crate::command::info::section;
use crate::{
    cluster, command, config, config::token_key, db, hooks::config_filter, hooks::config_load,
    hooks::events, hooks::slot_migration, server::mainq, server::reply, sets::catalog, sets::learn,
    sets::standing, sets::state, upkeep::housekeeping, upkeep::notify, upkeep::sync,
};

/// The module's load function: fails the load (`Status::Err`) on a refused config value or a
/// command, data type or event the server refuses; everything after the commands only logs.
pub fn init(ctx: &Context, args: &[RedisString]) -> Status {
    // First: a refused value must fail the load before anything of ours runs (hooks/config_load.rs).
    if let Err(e) = config_load::register_and_load(ctx, args) {
        reply::log(ctx, reply::Level::Warning, &e);
        return Status::Err;
    }
    // The sync loop hears of every filter installed, so its next sweep looks at once.
    state::on_installed(sync::filter_installed);
    // A set resized by MEMBER.ALTER (here or on another node) gets its filter rebuilt.
    learn::on_resized(|set| {
        crate::upkeep::rebuild::start(set, crate::upkeep::rebuild::Reason::Alter);
    });
    crate::server::cluster_mode::set_enabled(
        ctx.get_flags()
            .contains(redis_module::ContextFlags::CLUSTER),
    );
    // Cluster mode only: the RDB aux field that carries the filters held
    // in module memory (standalone RDB files stay loadable as before).
    if crate::server::cluster_mode::enabled() {
        if let Err(e) = cluster::sentinel::SENTINEL_TYPE.create_data_type(ctx.ctx) {
            reply::log(ctx, reply::Level::Warning, &format!("libmember: {e}"));
            return Status::Err;
        }
    }
    // The character tables of NORMALIZE username, built before any client can wait on them.
    crate::model::canon_chars::prepare();
    crate::model::canon_forms::prepare();
    // The configs are applied by now. From here on a key ring that drops a key some set
    // uses is refused (CONFIG SET, MEMBER.KEYS RELOAD).
    token_key::uses_keys(state::tokenized_keys);
    token_key::started(ctx);
    config::started(ctx);
    // A node started with `replicaof` is a replica without a link yet (docs/replicas.md).
    standing::at_load(ctx);
    config::PG_URL.default_if_empty(config::PG_URL_DEFAULT);
    config_filter::register(ctx);
    // A short read of a filter payload must fail the load cleanly (rdb_load checks for it),
    // not abort the server. On Valkey ≥ 9.0 the module also takes part in atomic slot
    // migration, following its events (hooks/slot_migration.rs).
    let asm = slot_migration::server_has_asm(ctx);
    crate::server::cluster_mode::set_asm(asm);
    slot_migration::set_options(
        ctx,
        redis_module::ModuleOptions::HANDLE_IO_ERRORS.bits(),
        asm,
    );
    // Every command of the table (command/table.rs), the hot path's raw one included.
    if let Status::Err = command::table::register::create(ctx) {
        return Status::Err;
    }
    if let Err(e) = events::subscribe(ctx) {
        reply::log(ctx, reply::Level::Warning, e);
        return Status::Err;
    }
    if asm {
        if let Err(e) = slot_migration::subscribe(ctx) {
            reply::log(ctx, reply::Level::Warning, e);
            return Status::Err;
        }
    }
    // Nothing below fails the load: a failed load cleans up commands, events, configs and the
    // filter, not a cluster message receiver (its code would be unloaded under it).
    if crate::server::cluster_mode::enabled() {
        // Items whose canonical slot another node holds are forwarded to it over the bus.
        cluster::bus::init(
            ctx,
            cluster::bus::Handlers {
                serve: command::forwarded::serve,
                rebuild: command::admin::rebuild_wide::serve,
                many: command::forwarded::serve_many,
                info: command::info::wide::serve,
                catalog_changed: catalog::reread,
            },
        );
    }
    command::table::register::declare(ctx);
    db::pool::start();
    if mainq::batch_per_iteration(ctx, db::pool::flush) {
        db::pool::flush_before_sleep();
    }
    mainq::start(ctx, housekeeping::tick);
    notify::started();
    Status::Ok
}

/// The module's INFO section (`# member`).
pub fn info_member(ctx: &InfoContext, for_crash_report: bool) {
    section::info_section(ctx, for_crash_report);
}

/// A promotion makes every filter untrusted for "absent" until it has caught up again, and
/// makes the node re-read the set catalog; so does becoming a replica, until its link is up
/// (docs/replicas.md).
#[redis_module_macros::role_changed_event_handler]
fn on_role_changed(ctx: &Context, role: redis_module::server_events::ServerRole) {
    cluster::owner::role_changed();
    if role == redis_module::server_events::ServerRole::Primary {
        standing::on_promoted();
        catalog::promoted();
    } else {
        standing::on_demoted(ctx);
    }
}

/// Any dataset just loaded (a replica's full synchronization, DEBUG RELOAD, a start-up load)
/// may hold filters of sets whose definitions never reached this node: re-read the catalog.
#[redis_module_macros::loading_event_handler]
fn on_loading(_ctx: &Context, event: redis_module::server_events::LoadingSubevent) {
    if event == redis_module::server_events::LoadingSubevent::Ended {
        catalog::reread();
        state::after_load();
    }
}
