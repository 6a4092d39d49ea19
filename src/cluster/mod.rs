//! Valkey Cluster placement: which node serves which slot (`nodes`, `owner`), requests
//! forwarded to it (`wire`, pure; `bus`, and `responder` for the answers and the raw send) and the data type whose RDB aux data carries the
//! filters (`sentinel`, named for the per-slot keys earlier versions kept).
//! The slot arithmetic itself is pure (`model::slot`, `model::slotset`); whether the server runs
//! in cluster mode is `server::cluster_mode`.

pub mod bus;
pub mod bus_nodelay;
pub mod nodes;
pub mod owner;
pub mod owners;
pub mod peers;
pub mod responder;
pub mod sentinel;
pub mod wire;
