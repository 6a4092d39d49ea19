//! The module's glue to the server's own machinery: allocation, blocked clients, the
//! main-thread queue, replies and logs, metrics and latency events, transient memory and
//! resource limits, and what the primary sends its replicas.

pub mod alloc;
pub mod block;
pub mod effects;
pub mod latency;
pub mod limits;
pub mod mainq;
pub mod metrics;
pub mod replication;
pub mod reply;
pub mod transient;
