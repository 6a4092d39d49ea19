//! The module's glue to the server's own machinery: allocation, blocked clients, the
//! main-thread queue, replies and logs, metrics and latency events, transient memory,
//! whether the server runs in cluster mode, and what the primary sends its replicas.

pub mod alloc;
pub mod block;
pub mod cluster_mode;
pub mod latency;
pub mod mainq;
pub mod metrics;
pub mod redaction;
pub mod replication;
pub mod reply;
pub mod transient;
