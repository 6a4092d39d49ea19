//! Work off the request path that keeps each set's filter complete: rebuilds, auto-grow, the
//! sync loop and its change notification, the periodic housekeeping, cluster slot fills and
//! filters loaded from the primary.

pub mod grow;
pub mod history;
pub mod housekeeping;
pub mod node_report;
pub mod notify;
pub mod rebuild;
pub mod rebuild_wait;
pub mod replica_load;
pub mod rotation;
pub mod slot_fill;
pub mod sync;
