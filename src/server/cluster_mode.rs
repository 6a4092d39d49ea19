//! Whether the server runs in cluster mode and has atomic slot migration: read once at load,
//! asked on every path that places a key or an item.

use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);
static ASM: AtomicBool = AtomicBool::new(false);

/// `VALKEYMODULE_CTX_FLAGS_SLOT_IMPORT_CLIENT` (Valkey ≥ 9.0): the context's client is the
/// connection an atomic slot migration streams the slots' commands through.
const CTX_FLAGS_SLOT_IMPORT_CLIENT: i32 = 1 << 25;

/// Records whether the server runs in cluster mode (fixed at start-up; set once at load).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// True when the server runs in cluster mode.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Records whether the server has atomic slot migration (Valkey ≥ 9.0; set once at load).
pub fn set_asm(on: bool) {
    ASM.store(on, Ordering::Relaxed);
}

/// True when the server has atomic slot migration (`CLUSTER MIGRATESLOTS`).
#[inline]
pub fn asm() -> bool {
    ASM.load(Ordering::Relaxed)
}

/// True when `ctx` runs a command an atomic slot migration streams into this node (the
/// target of a `CLUSTER MIGRATESLOTS`). Always false on servers without one: the bit may
/// mean something else there.
pub fn from_slot_import(ctx: &redis_module::Context) -> bool {
    if !asm() {
        return false;
    }
    // SAFETY: a plain query of the context's flags, on the main thread.
    let flags = unsafe { redis_module::raw::RedisModule_GetContextFlags.unwrap()(ctx.ctx) };
    flags & CTX_FLAGS_SLOT_IMPORT_CLIENT != 0
}
