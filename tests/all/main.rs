//! The integration tests, one binary: each module is one area, all sharing the harness in
//! `tests/support` (one PostgreSQL cluster and, for the cluster tests, one Valkey Cluster per
//! run). `cargo test --test all <area>::` runs one area.

#[path = "../support/mod.rs"]
mod support;

/// The chaos harness (faults, histories, the checker), for `chaos` and `cluster_reshard`.
#[path = "../support/chaos/mod.rs"]
mod chaos_harness;

mod acl;
mod add_combining;
mod alter;
mod asm;
mod attach;
mod attach_boundary;
mod backfill;
mod bad_input;
mod batch;
mod big_filters;
mod catalog;
mod change_log;
mod chaos;
mod client_snippets;
mod cluster;
mod cluster_attach;
mod cluster_batch;
mod cluster_clients;
mod cluster_forward;
mod cluster_info;
mod cluster_rebuild;
mod cluster_replica;
mod cluster_reshard;
mod cluster_slots;
mod command_docs;
mod commands;
mod compat;
mod config_values;
mod exporter;
mod failover;
mod failover_pooler;
mod false_positives;
mod faults;
mod foreign_filter;
mod foreign_writes;
mod funnel;
mod harness;
mod hostile;
mod key_chain;
mod key_ring;
mod key_rotation;
mod key_rotation_cluster;
mod key_rotation_cluster_load;
mod key_rotation_copy;
mod key_rotation_failover;
mod key_rotation_faults;
mod key_rotation_held;
mod key_rotation_in_place;
mod key_rotation_inflight;
mod key_rotation_planned;
mod keyslot;
mod latency;
mod lifecycle;
mod lifecycle_rebuild;
mod limits;
mod module_load;
mod moved_keys;
mod node_client;
mod notify;
mod pg_tls;
mod pg_versions;
mod pooler;
mod pooler_cluster;
mod python_client;
mod rebuild_memory;
mod rebuild_window;
mod replica;
mod restore;
mod sentinel;
mod signup_browser;
mod standby;
mod startup;
mod sync;
mod timeouts;
mod timeouts_config;
mod tokenize;
