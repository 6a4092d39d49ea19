//! The module's global allocator: the server's own (so `used_memory` and `MEMORY USAGE`
//! count what the module holds), through its *try* entry point where the server has one, so
//! a refused allocation reaches `try_reserve` as an error instead of aborting the server.

use std::alloc::{GlobalAlloc, Layout};

use redis_module::raw;

/// Allocates through `RedisModule_TryAlloc` (Valkey 8, Redis 7.0.x with it) or else
/// `RedisModule_Alloc`; frees through `RedisModule_Free`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerAlloc;

// SAFETY: every block comes from the server's allocator and goes back to it; sizes are rounded
// up to the alignment, which the server's allocator (jemalloc or libc, 16-byte aligned) meets
// for every alignment Rust asks of this module's types.
unsafe impl GlobalAlloc for ServerAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let size = (layout.size() + layout.align() - 1) & !(layout.align() - 1);
        // SAFETY: the server's allocation entry points take a size and return a block or null.
        unsafe {
            match (raw::RedisModule_TryAlloc, raw::RedisModule_Alloc) {
                (Some(try_alloc), _) => try_alloc(size).cast(),
                (None, Some(alloc)) => alloc(size).cast(),
                (None, None) => std::ptr::null_mut(),
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the API table is written once, at module load, before any allocation;
        // ptr came from `alloc` above.
        unsafe {
            if let Some(free) = raw::RedisModule_Free {
                free(ptr.cast());
            }
        }
    }
}
