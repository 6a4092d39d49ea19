//! libmember: "is X a member of set S?" in one round trip, never wrong. The module's
//! declaration only: its name, allocator, filter data type, load function and events. The
//! commands are one table (`command/table.rs`), created by `load::init`; the funnel lives in
//! `command/lookup.rs` → `funnel.rs`; the database in `db/`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cluster;
pub mod command;
pub mod config;
pub mod db;
pub mod filter;
pub mod hooks;
pub mod load;
pub mod model;
pub mod server;
pub mod sets;
pub mod upkeep;

// The macro names these two types unqualified.
use redis_module::{redis_module, InfoContext, RedisResult};

use filter::data_type::FILTER_TYPE;
use hooks::events;
use load::{info_member, init};

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
    ],
}
