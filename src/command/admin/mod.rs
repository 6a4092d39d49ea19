//! Set administration: MEMBER.CREATE (and the options that attach a set to an application's
//! table), MEMBER.ALTER (and its ROTATE-KEY, `rotate.rs`), MEMBER.DROP and MEMBER.REBUILD (on every primary of a cluster:
//! `rebuild_wide.rs`), the set settings CREATE and ALTER parse, and MEMBER.KEYS, the node's
//! ring of tokenization keys.

pub mod alter;
pub mod attach;
pub mod create;
pub mod drop;
pub mod keys;
pub mod rebuild;
pub mod rebuild_wide;
pub mod rotate;
pub mod settings;
