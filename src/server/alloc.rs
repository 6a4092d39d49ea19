//! The module's global allocator: the server's own (so `used_memory` and `MEMORY USAGE`
//! count what the module holds), through its *try* entry point where the server has one, so
//! a refused allocation reaches `try_reserve` as an error instead of aborting the server.

use std::alloc::{GlobalAlloc, Layout};

use redis_module::raw;

/// Allocates through `RedisModule_TryAlloc` (Valkey 8, Redis 7.0.x with it) or else
/// `RedisModule_Alloc`; frees through `RedisModule_Free`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerAlloc;

/// The alignment every block of the server's allocator has (jemalloc and glibc malloc on
/// 64-bit targets). Larger alignments (crossbeam's and tokio's cache-padded structures ask for
/// 128) are made by over-allocating: see [`aligned`].
const SERVER_ALIGN: usize = 16;

/// A block of `size` bytes from the server, or null.
///
/// # Safety
/// The module API table must be loaded (it is, before the first allocation).
unsafe fn server_alloc(size: usize) -> *mut u8 {
    // SAFETY: the server's allocation entry points take a size and return a block or null.
    unsafe {
        match (raw::RedisModule_TryAlloc, raw::RedisModule_Alloc) {
            (Some(try_alloc), _) => try_alloc(size).cast(),
            (None, Some(alloc)) => alloc(size).cast(),
            (None, None) => std::ptr::null_mut(),
        }
    }
}

/// # Safety
/// `ptr` came from [`server_alloc`].
unsafe fn server_free(ptr: *mut u8) {
    // SAFETY: the API table is written once, at module load, before any allocation.
    unsafe {
        if let Some(free) = raw::RedisModule_Free {
            free(ptr.cast());
        }
    }
}

/// Where the block for an over-aligned layout starts within a server block at `base`: the
/// first multiple of `align` with room for one pointer before it (the server block's start,
/// kept there for `dealloc`). `base` is `SERVER_ALIGN`-aligned and `align` is larger, so the
/// result is at most `base + align`: a server block of `size + align` bytes holds it.
fn aligned(base: usize, align: usize) -> usize {
    (base + std::mem::size_of::<usize>() + align - 1) & !(align - 1)
}

// SAFETY: every block comes from the server's allocator and goes back to it. Blocks are
// aligned as asked: directly up to SERVER_ALIGN, by over-allocation beyond it.
unsafe impl GlobalAlloc for ServerAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= SERVER_ALIGN {
            // SAFETY: see server_alloc.
            return unsafe { server_alloc(layout.size()) };
        }
        let Some(total) = layout.size().checked_add(layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: see server_alloc.
        let base = unsafe { server_alloc(total) };
        if base.is_null() {
            return base;
        }
        let at = aligned(base as usize, layout.align());
        // SAFETY: `at - size_of::<usize>()` lies inside the block (`aligned`), and is
        // pointer-aligned (`at` is a multiple of an alignment above 16, `base` of 16).
        unsafe {
            let ptr = base.add(at - base as usize);
            ptr.cast::<*mut u8>().sub(1).write(base);
            ptr
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let base = if layout.align() <= SERVER_ALIGN {
            ptr
        } else {
            // SAFETY: `alloc` wrote the block's start just before the over-aligned pointer.
            unsafe { ptr.cast::<*mut u8>().sub(1).read() }
        };
        // SAFETY: base came from server_alloc.
        unsafe { server_free(base) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_over_aligned_block_fits_in_its_server_block() {
        for align in [32usize, 64, 128, 4096, 2 << 20] {
            for base in (0..64).map(|i| 0x10_0000 + i * SERVER_ALIGN) {
                let at = aligned(base, align);
                assert_eq!(at % align, 0);
                assert!(at - base >= std::mem::size_of::<usize>(), "{base} {align}");
                assert!(at <= base + align, "{base} {align}");
            }
        }
    }
}
