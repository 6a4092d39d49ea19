//! libmember: "is X a member of set S?" in one round trip, never wrong. The module's
//! declaration only: its name, allocator, filter data type, load function and events. The
//! commands are one table (`command/table.rs`), created by `load::init`; the funnel lives in
//! `command/lookup.rs` → `funnel.rs`; the database in `db/`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod acl;
pub mod alloc;
pub mod attach_allow;
pub mod block;
pub mod canon;
pub mod catalog;
pub mod cluster;
pub mod command;
pub mod config;
pub mod config_filter;
pub mod config_load;
pub mod config_text;
pub mod conninfo;
pub mod db;
pub mod effects;
pub mod error;
pub mod events;
pub mod filter;
pub mod filter_origin;
pub mod filter_static;
pub mod filter_store;
pub mod filter_type;
pub mod foreign_writes;
pub mod funnel;
pub mod grow;
pub mod housekeeping;
pub mod keys;
pub mod known_absent;
pub mod large_array;
pub mod latency;
pub mod limits;
pub mod load;
pub mod mainq;
pub mod metrics;
pub mod module_args;
pub mod notify;
pub mod pg_link;
pub mod rebuild;
pub mod redact;
pub mod replica_load;
pub mod replication;
pub mod reply;
pub mod secret_file;
pub mod set_def;
pub mod set_upkeep;
pub mod slot_fill;
pub mod state;
pub mod sync;
pub mod token;
pub mod token_key;
pub mod transient;

// The macro names these two types unqualified.
use redis_module::{redis_module, InfoContext, RedisResult};

use filter_type::FILTER_TYPE;
use load::{info_member, init};

// Unit tests and the fuzz targets (cargo-fuzz compiles with `--cfg fuzzing`) run outside the
// server, where its allocator does not exist.
#[cfg(not(any(test, fuzzing)))]
type Alloc = alloc::ServerAlloc;
#[cfg(not(any(test, fuzzing)))]
const ALLOC: Alloc = alloc::ServerAlloc;
#[cfg(any(test, fuzzing))]
type Alloc = std::alloc::System;
#[cfg(any(test, fuzzing))]
const ALLOC: Alloc = std::alloc::System;

redis_module! {
    name: "member",
    version: 1,
    allocator: (Alloc, ALLOC),
    data_types: [FILTER_TYPE],
    init: init,
    info: info_member,
    event_handlers: [
        [@GENERIC: events::on_generic],
        [@STRING: events::on_write],
        [@EXPIRED @EVICTED: events::on_sentinel_gone],
    ],
}
