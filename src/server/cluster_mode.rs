//! Whether the server runs in cluster mode: read once at load, asked on every path that
//! places a key or an item.

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
