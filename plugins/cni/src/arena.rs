//! A bump allocator for the plugin processes, which live for one CNI call.
//!
//! Why: a pass-through ADD made ~190 allocations and the masquerade ADD
//! ~400, and glibc's malloc/free were a quarter of the user-space
//! instructions (callgrind; README "Performance"). A plugin frees almost
//! everything only at exit, and most of what it frees early is the block
//! it allocated last (a `String` built and dropped, a `Vec` grown in
//! place). So: blocks come off a static zero-initialised region (`.bss`:
//! no syscall to get it, and a page costs a fault only once touched); the
//! last block is given back or grown in place; any other free is a no-op
//! until exit. What does not fit falls through to the system allocator,
//! so the region bounds only the fast path, never what a call may use.
//! Pages touched, measured against glibc's: equal on the pass-through,
//! 4 more of ~145 on the masquerade ADD (README design note "A bump
//! allocator").

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The largest alignment a block gets from the region.
const PAGE_ALIGN: usize = 4096;

/// `N` bytes handed out front to back; see the module doc.
///
/// `top` comes first, on the page the first blocks are on: behind the
/// region it had a page of its own, faulted twice per process (read, then
/// written) for 8 bytes. Aligned to a cache line, not a page: the region
/// then starts on the page the `.bss` before it is on (crt's, written at
/// start-up anyway) instead of a page of its own.
#[repr(C, align(64))]
pub struct Arena<const N: usize> {
    /// Offset of the first free byte.
    top: AtomicUsize,
    mem: UnsafeCell<[u8; N]>,
}

// SAFETY: the region is only reached through offsets claimed with atomic
// compare-exchange on `top`, so two threads never get overlapping blocks.
unsafe impl<const N: usize> Sync for Arena<N> {}

impl<const N: usize> Default for Arena<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Arena<N> {
    pub const fn new() -> Self {
        Arena {
            top: AtomicUsize::new(0),
            mem: UnsafeCell::new([0; N]),
        }
    }

    fn base(&self) -> usize {
        self.mem.get() as usize
    }

    /// Offset of `ptr` in the region, if it is one of ours.
    fn offset_of(&self, ptr: *mut u8) -> Option<usize> {
        let p = ptr as usize;
        (p >= self.base() && p < self.base() + N).then(|| p - self.base())
    }

    /// Write `top` (leaving it as it is) before the first block is claimed.
    /// The first access to a `.bss` page that reads maps the shared zero
    /// page and the write after it faults again: two faults for the
    /// region's first page, where one will do. Harmless at any time: a
    /// compare-exchange of 0 for 0 (x86's `lock cmpxchg` writes even when
    /// it fails; `fetch_add(0)` is compiled into a load).
    pub fn touch(&self) {
        let _ = self
            .top
            .compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Bytes in use (for tests and measurements).
    pub fn used(&self) -> usize {
        self.top.load(Ordering::Relaxed)
    }

    fn claim(&self, layout: Layout) -> Option<*mut u8> {
        // A stricter alignment than a page goes to the system allocator.
        if layout.align() > PAGE_ALIGN {
            return None;
        }
        let base = self.base();
        let mut top = self.top.load(Ordering::Relaxed);
        loop {
            // Aligned as an address: the region's own start is only 8-aligned.
            let addr = (base + top).checked_add(layout.align() - 1)? & !(layout.align() - 1);
            let start = addr - base;
            let end = start.checked_add(layout.size())?;
            if end > N {
                return None;
            }
            match self
                .top
                .compare_exchange_weak(top, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                // SAFETY: start < end <= N: inside the region.
                Ok(_) => return Some(unsafe { (self.mem.get() as *mut u8).add(start) }),
                Err(now) => top = now,
            }
        }
    }
}

// SAFETY: blocks are disjoint (see `Sync`), aligned as asked, and never
// reused while live: `top` only moves back over the block being freed or
// resized, and only when that block is the last one.
unsafe impl<const N: usize> GlobalAlloc for Arena<N> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.claim(layout) {
            Some(p) => p,
            // SAFETY: forwarded with the caller's layout.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.claim(layout) {
            Some(p) => {
                // Given back blocks are reused, so the region is not all zero.
                // SAFETY: p is a fresh block of layout.size() bytes.
                unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
                p
            }
            // SAFETY: forwarded with the caller's layout.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match self.offset_of(ptr) {
            Some(off) => {
                // The last block: give it back; any other: kept until exit.
                let _ = self.top.compare_exchange(
                    off + layout.size(),
                    off,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            // SAFETY: not ours, so it came from System with this layout.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if let Some(off) = self.offset_of(ptr) {
            // The last block grows or shrinks where it is.
            if off.checked_add(new_size).is_some_and(|end| end <= N)
                && self
                    .top
                    .compare_exchange(
                        off + layout.size(),
                        off + new_size,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                return ptr;
            }
            if new_size <= layout.size() {
                return ptr;
            }
        }
        // SAFETY: the caller guarantees new_size is valid for layout's align.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: forwarded; the copy covers the smaller of the two sizes.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: Arena<8192> = Arena::new();

    fn l(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    // One test: the arena is shared, and the assertions are about its top.
    #[test]
    fn bumps_gives_back_the_last_block_and_falls_through() {
        unsafe {
            let a = A.alloc(l(10, 1));
            let b = A.alloc(l(8, 8));
            assert_eq!(b as usize % 8, 0);
            assert_eq!(A.used(), 24);
            // Not the last block: kept.
            A.dealloc(a, l(10, 1));
            assert_eq!(A.used(), 24);
            // The last block grows in place and keeps its bytes.
            b.write(7);
            let b2 = A.realloc(b, l(8, 8), 100);
            assert_eq!((b2, *b2, A.used()), (b, 7, 116));
            // ... and is given back.
            A.dealloc(b2, l(100, 8));
            assert_eq!(A.used(), 16);
            // A block that is not last moves when it grows, bytes copied.
            let c = A.alloc(l(4, 4));
            c.write(9);
            let _d = A.alloc(l(4, 4));
            let c2 = A.realloc(c, l(4, 4), 64);
            assert_ne!(c2, c);
            assert_eq!(*c2, 9);
            // Zeroed even where a given-back block left bytes.
            let z = A.alloc_zeroed(l(64, 1));
            assert!(std::slice::from_raw_parts(z, 64).iter().all(|&x| x == 0));
            // Page-aligned from the region, though the region is not.
            let paged = A.alloc(l(32, PAGE_ALIGN));
            assert!(A.offset_of(paged).is_some());
            assert_eq!(paged as usize % PAGE_ALIGN, 0);
            // Aligned beyond a page: from the system allocator.
            let wide = A.alloc(l(64, 2 * PAGE_ALIGN));
            assert!(!wide.is_null() && A.offset_of(wide).is_none());
            assert_eq!(wide as usize % (2 * PAGE_ALIGN), 0);
            A.dealloc(wide, l(64, 2 * PAGE_ALIGN));
            // Too large for what is left: from the system allocator.
            let big = A.alloc(l(16384, 8));
            assert!(!big.is_null() && A.offset_of(big).is_none());
            big.write(1);
            let big2 = A.realloc(big, l(16384, 8), 32768);
            A.dealloc(big2, l(32768, 8));
        }
    }
}
