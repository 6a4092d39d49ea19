//! Arrays that may be larger than any cache: a filter's bit array and fingerprints.
//!
//! A probe of a 120 MB array misses the caches and, with 4 KiB pages, the TLB too: the page
//! walk is a second miss in front of the first (bench/PROFILE.md). An array of
//! `HUGE_FROM` bytes or more is therefore advised for transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`) before anything is written to it, so the kernel backs it with
//! 2 MiB pages as it is first touched (in the `madvise` THP mode, which Valkey recommends over
//! `always`, nothing else gets them).
//!
//! The memory itself comes from the global allocator (the server's, see `alloc.rs`), with the
//! layout of a `Vec<T>` of the same length: `used_memory`, `MEMORY USAGE` and the maxmemory
//! checks see exactly the bytes they saw before. Only the whole 2 MiB ranges inside the
//! allocation are advised (nothing outside it is touched, and no alignment beyond `T`'s is
//! asked of the allocator); the at most two partial ranges at the ends keep 4 KiB pages.
//! The advice is taken back (`MADV_NOHUGEPAGE`, the `madvise` mode's default) before the
//! memory goes back to the allocator, so whatever the allocator puts there later is not
//! backed by huge pages behind its back.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

/// The huge page size (x86-64 and most arm64 kernels).
pub const HUGE_PAGE: usize = 2 << 20;
/// Arrays from this many bytes are advised for huge pages: below it the array fits in the
/// last-level cache, and the first and last partial huge pages would be most of it.
pub const HUGE_FROM: usize = 8 << 20;

/// Whether large arrays are advised at all (`benches/filter.rs` turns it off to measure the
/// same filter on 4 KiB pages).
pub static HUGE_PAGES: AtomicBool = AtomicBool::new(true);

/// Element types whose all-zero bit pattern is a value and which need no drop.
///
/// # Safety
/// Implement only for plain integers.
pub unsafe trait Plain: Copy + PartialEq + std::fmt::Debug + 'static {}
// SAFETY: plain integers.
unsafe impl Plain for u8 {}
// SAFETY: plain integers.
unsafe impl Plain for u64 {}

/// A fixed-length heap array of `T`, zeroed or copied at birth, advised for huge pages when
/// large. Dereferences to a slice.
pub struct LargeArray<T: Plain> {
    ptr: NonNull<T>,
    len: usize,
    /// The advised range (start, bytes), if any.
    advised: Option<(usize, usize)>,
}

// SAFETY: owns its elements like a Vec<T>; T is a plain integer.
unsafe impl<T: Plain> Send for LargeArray<T> {}
// SAFETY: as above; shared access is read-only.
unsafe impl<T: Plain> Sync for LargeArray<T> {}

/// A hint to bring `w`'s cache line in; nothing else (a no-op off x86-64).
#[inline(always)]
pub fn prefetch<T>(w: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache; `w` is a valid reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (w as *const T).cast::<i8>(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
}

/// The allocator refused the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoMemory;

impl<T: Plain> LargeArray<T> {
    /// Room for `len` elements, advised, not yet initialized.
    fn try_alloc(len: usize) -> Result<Self, NoMemory> {
        if len == 0 || std::mem::size_of::<T>() == 0 {
            return Ok(LargeArray {
                ptr: NonNull::dangling(),
                len,
                advised: None,
            });
        }
        let layout = Layout::array::<T>(len).map_err(|_| NoMemory)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc(layout) }.cast::<T>()).ok_or(NoMemory)?;
        let advised = advise(ptr.as_ptr() as usize, layout.size());
        Ok(LargeArray { ptr, len, advised })
    }

    /// `len` zeros, or `NoMemory`.
    pub fn try_zeroed(len: usize) -> Result<Self, NoMemory> {
        let a = Self::try_alloc(len)?;
        // SAFETY: room for `len` elements; zero is a value of T (`Plain`). Written after the
        // advice, so these first touches fault in huge pages.
        unsafe { std::ptr::write_bytes(a.ptr.as_ptr(), 0, len) };
        Ok(a)
    }

    /// A copy of `src`, or `NoMemory`.
    pub fn try_copy_of(src: &[T]) -> Result<Self, NoMemory> {
        let a = Self::try_alloc(src.len())?;
        // SAFETY: room for `src.len()` elements, a fresh allocation, so no overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), a.ptr.as_ptr(), src.len()) };
        Ok(a)
    }

    /// `len` zeros; aborts like `vec!` when the allocator refuses.
    pub fn zeroed(len: usize) -> Self {
        Self::try_zeroed(len).unwrap_or_else(|_| oom::<T>(len))
    }

    /// Whether part of the array was advised for huge pages (whether the kernel granted
    /// them is its business: `AnonHugePages` in /proc/self/smaps).
    pub fn advised(&self) -> bool {
        self.advised.is_some()
    }
}

fn oom<T>(len: usize) -> ! {
    alloc::handle_alloc_error(Layout::array::<T>(len).unwrap_or(Layout::new::<T>()))
}

/// Advises the whole huge pages inside `[start, start + bytes)` when the array is at least
/// `HUGE_FROM` bytes; returns the advised range. A refusal (a kernel without THP) is only a
/// lost optimization.
fn advise(start: usize, bytes: usize) -> Option<(usize, usize)> {
    if bytes < HUGE_FROM || !HUGE_PAGES.load(Ordering::Relaxed) {
        return None;
    }
    let from = start.next_multiple_of(HUGE_PAGE);
    let to = (start + bytes) / HUGE_PAGE * HUGE_PAGE;
    if to <= from {
        return None;
    }
    madvise(from, to - from, true).then_some((from, to - from))
}

#[cfg(target_os = "linux")]
fn madvise(from: usize, len: usize, huge: bool) -> bool {
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: [from, from + len) is page-aligned and inside an allocation this array owns;
    // the advice changes how the kernel backs the pages, never their contents.
    unsafe { libc::madvise(from as *mut libc::c_void, len, advice) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn madvise(_from: usize, _len: usize, _huge: bool) -> bool {
    false
}

impl<T: Plain> Drop for LargeArray<T> {
    fn drop(&mut self) {
        if let Some((from, len)) = self.advised {
            madvise(from, len, false);
        }
        if self.len != 0 && std::mem::size_of::<T>() != 0 {
            // SAFETY: allocated in `try_alloc` with this very layout.
            unsafe {
                alloc::dealloc(
                    self.ptr.as_ptr().cast(),
                    Layout::array::<T>(self.len).unwrap(),
                )
            };
        }
    }
}

impl<T: Plain> std::ops::Deref for LargeArray<T> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialized elements (or a dangling pointer and len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Plain> std::ops::DerefMut for LargeArray<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Plain> Clone for LargeArray<T> {
    fn clone(&self) -> Self {
        Self::try_copy_of(self).unwrap_or_else(|_| oom::<T>(self.len))
    }
}

impl<T: Plain> PartialEq for LargeArray<T> {
    fn eq(&self, o: &Self) -> bool {
        **self == **o
    }
}

impl<T: Plain> std::fmt::Debug for LargeArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LargeArray<{}>[{}{}]",
            std::any::type_name::<T>(),
            self.len,
            if self.advised() { ", huge pages" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    // Used by the tests only: benches/filter.rs compiles this file without them.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn small_arrays_are_not_advised_and_large_ones_are() {
        let a = LargeArray::<u64>::zeroed(1000);
        assert!(!a.advised());
        assert!(a.iter().all(|&w| w == 0));
        let b = LargeArray::<u8>::zeroed(HUGE_FROM + 12_345);
        assert!(b.iter().all(|&w| w == 0));
        #[cfg(target_os = "linux")]
        if std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"))
        {
            assert!(b.advised());
        }
        assert_eq!(LargeArray::<u64>::zeroed(0).len(), 0);
    }

    #[test]
    fn copies_and_clones_keep_contents() {
        let src: Vec<u64> = (0..(HUGE_FROM as u64 / 8 * 3 + 7))
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let a = LargeArray::try_copy_of(&src).unwrap();
        assert_eq!(&*a, &src[..]);
        let mut b = a.clone();
        assert_eq!(a, b);
        b[5] ^= 1;
        assert_ne!(a, b);
        assert_eq!(a[5], src[5]);
    }
}
