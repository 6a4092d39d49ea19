//! A set's filter: the Bloom gate and its static part as plain Rust (`bloom/`, compiled by the
//! benches too), and around it what ties it to the server: the data type that persists it,
//! where it lives (`store`), where it was made (`origin`) and the confirmed false positives.

pub mod bloom;
pub mod data_type;
pub mod known_absent;
pub mod origin;
pub mod store;
pub mod value;

pub use bloom::*;
