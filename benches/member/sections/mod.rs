//! The sections of a run, one file each, by the name `--only` takes (`SECTIONS` in main.rs).
//! Each adds `impl Bench` methods that measure libmember against a baseline and add rows.

mod batch;
mod big_filters;
mod cluster;
mod cluster_batch;
mod cold;
mod dbcpu;
mod idle_sync;
mod memory;
mod mixed;
mod negative;
mod normalize;
mod pooler;
mod rebuild;
mod rebuild_memory;
mod replica;
mod rotation;
mod seeds_app;
pub(crate) mod sync_memory;
mod tokenize;
mod visibility;
mod write_path;
mod writes;
