//! What the server calls besides commands: its events (keyspace, flush, role change), and the
//! command filters that keep passwords and raw items out of logs.

pub mod config_filter;
pub mod config_load;
pub mod events;
pub mod redact;
pub mod slot_migration;
