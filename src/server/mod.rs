//! The module's glue to the server's own machinery: allocation, blocked clients, the
//! main-thread queue, replies and logs, metrics and latency events, transient memory,
//! whether the server runs in cluster mode, what the primary sends its replicas and what
//! `INFO replication` says of the link, and timers
//! that can be called off.

pub mod alloc;
pub mod block;
pub mod cluster_mode;
pub mod latency;
pub mod mainq;
pub mod metrics;
pub mod redaction;
pub mod repl_info;
pub mod replication;
pub mod reply;
pub mod timer;
pub mod transient;
