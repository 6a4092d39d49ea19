//! Valkey Cluster placement: which hash slot an item belongs to and the short hash tags that
//! put a key in a chosen slot (`slot`, pure), which node serves which slot (`nodes`, `owner`),
//! requests forwarded to it (`wire`, pure; `bus`), and whether this node runs in cluster mode.

pub mod bus;
pub mod nodes;
pub mod owner;
pub mod sentinel;
pub mod slot;
pub mod slotset;
pub mod wire;

use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Records whether the server runs in cluster mode (fixed at start-up; set once at load).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// True when the server runs in cluster mode.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}
