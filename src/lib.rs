//! libmember: "is X a member of set S?" in one round trip, never wrong. Registration only:
//! commands, the filter data type and the INFO section (the configs: `hooks/config_load.rs`, first
//! thing in `init`). The funnel lives in `command/lookup.rs` → `funnel.rs`; the database in
//! `db/`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cluster;
pub mod command;
pub mod command_info;
pub mod config;
pub mod db;
pub mod fast_exists;
pub mod filter;
pub mod hooks;
pub mod model;
pub mod server;
pub mod sets;
pub mod upkeep;

use redis_module::{redis_module, Context, InfoContext, RedisResult, RedisString, Status};

use command::{create, info, internal, lookup, write};
use command_info::{Info, Item};
use config::token_key;
use filter::data_type::FILTER_TYPE;
use hooks::config_load;
use hooks::redact::{self, Shape};
use hooks::{config_filter, events};
use server::{mainq, reply};
use sets::{acl, catalog, state};
use upkeep::{housekeeping, notify, sync};

/// MEMBER.CREATE <set> [ERROR <rate>] [CAPACITY <n>] [CACHE-TTL <s>] [RECENT-TTL <s>] [NORMALIZE none|lower|username] [TOKENIZE none|hmac-sha256]
fn member_create(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.CREATE", || create::create(ctx, args))
}
/// MEMBER.ALTER <set> [ERROR <rate>] [CAPACITY <n>] [CACHE-TTL <s>] [RECENT-TTL <s>] [SYNC]
fn member_alter(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.ALTER", || command::alter::alter(ctx, args))
}
/// MEMBER.DROP <set> [DELETE-DATA]
fn member_drop(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.DROP", || command::drop::drop(ctx, args))
}
/// MEMBER.ADD <set> <item> [SCOPE <scope>] [TTL <s> | EXPIREAT <unix-s>]
fn member_add(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.ADD", || {
        redact::around(ctx, Shape::Item, args, |args| write::add(ctx, args))
    })
}
/// MEMBER.MEXISTS <set> [SCOPE <scope>] ITEMS <item> [<item> …]
fn member_mexists(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.MEXISTS", || {
        redact::around(ctx, Shape::Many, args, |args| {
            command::batch::mexists(ctx, args)
        })
    })
}
/// MEMBER.MADD <set> [SCOPE <scope>] [TTL <s> | EXPIREAT <unix-s>] ITEMS <item> [<item> …]
fn member_madd(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.MADD", || {
        redact::around(ctx, Shape::Many, args, |args| {
            command::batch::madd(ctx, args)
        })
    })
}
/// MEMBER.DEL <set> <item> [SCOPE <scope>]
fn member_del(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.DEL", || {
        redact::around(ctx, Shape::Item, args, |args| write::del(ctx, args))
    })
}
/// MEMBER.EXPLAIN <set> <item> [SCOPE <scope>]
fn member_explain(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.EXPLAIN", || {
        redact::around(ctx, Shape::Item, args, |args| {
            lookup::lookup(ctx, args, true)
        })
    })
}
/// MEMBER.REBUILD <set> [SYNC]
fn member_rebuild(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.REBUILD", || {
        command::rebuild::rebuild(ctx, args)
    })
}
/// MEMBER._ADD <set> <entity> <scope> (replication and AOF only)
fn member_int_add(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER._ADD", || internal::add(ctx, args))
}
/// MEMBER._DEL <set> <entity> <scope> (replication and AOF only)
fn member_int_del(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER._DEL", || internal::del(ctx, args))
}
/// MEMBER._LOAD <key> <payload> (replication and AOF only)
fn member_int_load(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER._LOAD", || internal::load(ctx, args))
}
/// MEMBER._SET <set> <error_rate> <capacity> <cache_ttl> <recent_ttl> <normalize> [<id> [<tokenize> <fp>]] (replication and AOF only)
fn member_int_set(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER._SET", || internal::set(ctx, args))
}
/// MEMBER._DROP <set> (replication and AOF only)
fn member_int_drop(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER._DROP", || internal::drop(ctx, args))
}
/// MEMBER._OWN <sentinel key> (replication and AOF only)
fn member_int_own(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER._OWN", || internal::own(ctx, args))
}
/// MEMBER.INFO <set>
fn member_info(ctx: &Context, args: Vec<RedisString>) -> redis_module::RedisResult {
    reply::guard(ctx, "MEMBER.INFO", || info::info(ctx, args))
}

// Unit tests and the fuzz targets (cargo-fuzz compiles with `--cfg fuzzing`) run outside the
// server, where its allocator does not exist.
#[cfg(not(any(test, fuzzing)))]
type Alloc = server::alloc::ServerAlloc;
#[cfg(not(any(test, fuzzing)))]
const ALLOC: Alloc = server::alloc::ServerAlloc;
#[cfg(any(test, fuzzing))]
type Alloc = std::alloc::System;
#[cfg(any(test, fuzzing))]
const ALLOC: Alloc = std::alloc::System;

fn info_member(ctx: &InfoContext, for_crash_report: bool) {
    info::info_section(ctx, for_crash_report);
}

/// A promotion makes every filter untrusted for "absent" until it has caught up again, and
/// makes the node re-read the set catalog.
#[redis_module_macros::role_changed_event_handler]
fn on_role_changed(_ctx: &Context, role: redis_module::server_events::ServerRole) {
    cluster::owner::role_changed();
    if role == redis_module::server_events::ServerRole::Primary {
        state::on_promoted();
        catalog::promoted();
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

/// Arity and cluster routing of every command, for COMMAND INFO and cluster-aware clients and
/// servers (docs/cluster.md). Per-item commands route by the item (argv[2]), the catalog
/// commands (CREATE, ALTER, DROP) by the set name (argv[1]), both declared NOT_KEY: never an
/// ACL key. INFO, REBUILD, MEXISTS, MADD and the internal commands declare no key and run on
/// any node.
const COMMAND_INFO: &[Info] = &[
    Info::by_set("member.create", -2, Item::Insert),
    Info::by_set("member.alter", -3, Item::Update),
    Info::by_item("member.add", -3, Item::Insert),
    Info::by_item("member.exists", -3, Item::Read),
    Info::by_item("member.del", -3, Item::Delete),
    Info::by_item("member.explain", -3, Item::Read),
    Info::anywhere("member.info", 2),
    Info::anywhere("member.rebuild", -2),
    Info::anywhere("member._add", 4),
    Info::anywhere("member._del", 4),
    Info::anywhere("member._load", -3),
    Info::anywhere("member._set", -7),
    Info::by_set("member.drop", -2, Item::Delete),
    Info::anywhere("member._drop", 2),
    Info::anywhere("member._own", 2),
    // Many items, maybe of many slots: no routing key; refused in cluster mode (README).
    Info::anywhere("member.mexists", -4),
    Info::anywhere("member.madd", -4),
];

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    // First: a refused value must fail the load before anything of ours runs (hooks/config_load.rs).
    if let Err(e) = config_load::register_and_load(ctx, args) {
        reply::log(ctx, reply::Level::Warning, &e);
        return Status::Err;
    }
    // The sync loop hears of every filter installed, so its next sweep looks at once.
    state::on_installed(sync::filter_installed);
    crate::server::cluster_mode::set_enabled(
        ctx.get_flags()
            .contains(redis_module::ContextFlags::CLUSTER),
    );
    // Cluster mode only: slot sentinels, and the RDB aux field that carries the filters held
    // in module memory (standalone RDB files stay loadable as before).
    if crate::server::cluster_mode::enabled() {
        if let Err(e) = cluster::sentinel::SENTINEL_TYPE.create_data_type(ctx.ctx) {
            reply::log(ctx, reply::Level::Warning, &format!("libmember: {e}"));
            return Status::Err;
        }
    }
    // The configs are applied by now.
    token_key::started(ctx);
    config::started(ctx);
    config::PG_URL.default_if_empty(config::PG_URL_DEFAULT);
    config_filter::register(ctx);
    // A short read of a filter payload must fail the load cleanly (rdb_load checks for it),
    // not abort the server.
    ctx.set_module_options(redis_module::ModuleOptions::HANDLE_IO_ERRORS);
    // MEMBER.EXISTS <set> <item> [SCOPE <scope>]: the hot path, registered raw.
    if let Status::Err = fast_exists::register(ctx) {
        return Status::Err;
    }
    if let Err(e) = events::subscribe(ctx) {
        reply::log(ctx, reply::Level::Warning, e);
        return Status::Err;
    }
    // Nothing below fails the load: a failed load cleans up commands, events, configs and the
    // filter, not a cluster message receiver (its code would be unloaded under it).
    if crate::server::cluster_mode::enabled() {
        // Items whose canonical slot another node holds are forwarded to it over the bus.
        cluster::bus::init(ctx, command::forwarded::serve);
    }
    command_info::declare(ctx, COMMAND_INFO);
    acl::declare_category(
        ctx,
        &[
            "member.create",
            "member.alter",
            "member.add",
            "member.exists",
            "member.del",
            "member.explain",
            "member.info",
            "member.rebuild",
            "member.drop",
            "member.mexists",
            "member.madd",
        ],
    );
    db::pool::start();
    if mainq::batch_per_iteration(ctx, db::pool::flush) {
        db::pool::flush_before_sleep();
    }
    mainq::start(ctx, housekeeping::tick);
    notify::started();
    Status::Ok
}

redis_module! {
    name: "member",
    version: 1,
    allocator: (Alloc, ALLOC),
    data_types: [FILTER_TYPE],
    init: init,
    info: info_member,
    commands: [
        ["member.create", member_create, "write deny-oom", 0, 0, 0, ""],
        ["member.alter", member_alter, "write deny-oom", 0, 0, 0, ""],
        ["member.drop", member_drop, "write", 0, 0, 0, ""],
        ["member.add", member_add, "write deny-oom", 0, 0, 0, ""],
        ["member.del", member_del, "write", 0, 0, 0, ""],
        ["member.mexists", member_mexists, "readonly", 0, 0, 0, ""],
        ["member.madd", member_madd, "write deny-oom", 0, 0, 0, ""],
        ["member.explain", member_explain, "readonly", 0, 0, 0, ""],
        ["member.info", member_info, "readonly", 0, 0, 0, ""],
        ["member.rebuild", member_rebuild, "write", 0, 0, 0, ""],
        ["member._add", member_int_add, "write deny-oom", 0, 0, 0, ""],
        ["member._del", member_int_del, "write", 0, 0, 0, ""],
        ["member._load", member_int_load, "write deny-oom", 0, 0, 0, ""],
        ["member._set", member_int_set, "write", 0, 0, 0, ""],
        ["member._drop", member_int_drop, "write", 0, 0, 0, ""],
        ["member._own", member_int_own, "write", 0, 0, 0, ""],
    ],
    event_handlers: [
        [@GENERIC: events::on_generic],
        [@STRING: events::on_write],
        [@EXPIRED @EVICTED: events::on_sentinel_gone],
    ],
}
