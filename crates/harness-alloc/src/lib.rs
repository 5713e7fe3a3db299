//! The global allocator of the harness and its benches: mimalloc, asked for a plain block when
//! the alignment wanted is one every mimalloc block has (its blocks are at least word-aligned,
//! as `std`'s `System` allocator relies on malloc's alignment). The `mimalloc` crate sends every
//! allocation through mimalloc's aligned entry points, which check the alignment on each call
//! and fall back to a slower path when a free block does not happen to have it; nearly all of
//! a turn's blocks (JSON values, strings, map nodes) ask for 8 bytes or less.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

// Links mimalloc (its C library comes with the `mimalloc` crate, whose own allocator type is
// not used).
extern crate mimalloc;

unsafe extern "C" {
    fn mi_malloc(size: usize) -> *mut c_void;
    fn mi_zalloc(size: usize) -> *mut c_void;
    fn mi_realloc(p: *mut c_void, new_size: usize) -> *mut c_void;
    fn mi_malloc_aligned(size: usize, alignment: usize) -> *mut c_void;
    fn mi_zalloc_aligned(size: usize, alignment: usize) -> *mut c_void;
    fn mi_realloc_aligned(p: *mut c_void, new_size: usize, alignment: usize) -> *mut c_void;
    fn mi_free(p: *mut c_void);
    fn mi_option_set(option: core::ffi::c_int, value: core::ffi::c_long);
    #[cfg(test)]
    fn mi_option_get(option: core::ffi::c_int) -> core::ffi::c_long;
}

/// `mi_option_purge_delay` in mimalloc's option enum (the same index in its v2 and v3; the
/// `mimalloc` crate builds v3).
const MI_OPTION_PURGE_DELAY: core::ffi::c_int = 15;

/// mimalloc (v3) holds freed pages for a second and purges them only on later allocator
/// activity, so an idle harness kept about 12 MiB it no longer used (bench/results/memory.md).
/// The `harness` binary and the turn bench both call this, so the bench measures the
/// allocator as it ships (bench/results/turn-speed.md, ninth session: within the noise at
/// fifty sessions). `MIMALLOC_PURGE_DELAY` still wins.
pub fn purge_freed_pages_at_once() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: a plain setter of mimalloc's; options may be changed at any time.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    }
}

/// The alignment of every block mimalloc hands out (`MI_INTPTR_SIZE`: its size classes are
/// whole words).
const WORD: usize = core::mem::size_of::<usize>();

pub struct MiMalloc;

// SAFETY: every path returns a block of mimalloc's for at least `layout.size()` bytes aligned to
// `layout.align()`: plain blocks only where the alignment is at most a word (every block's),
// the aligned entry points otherwise; blocks are freed and resized by mimalloc, whichever
// entry point made them.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain calls into mimalloc (see the impl's comment for the alignment).
        unsafe {
            if layout.align() <= WORD {
                mi_malloc(layout.size()) as *mut u8
            } else {
                mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if layout.align() <= WORD {
                mi_zalloc(layout.size()) as *mut u8
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract).
        unsafe { mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (GlobalAlloc's contract).
        unsafe {
            if layout.align() <= WORD {
                mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index is mimalloc's enum position, not a name: if an upgrade moved it, this would
    /// set another option. Its v3 default (1 000 ms, though the header's comment says 10) is
    /// there before, and 0 after.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: plain getters and setters of mimalloc's options.
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, 1000);
        purge_freed_pages_at_once();
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, 0);
    }

    /// Every size and alignment a program asks for comes back aligned, holds what was written,
    /// keeps it through a resize, and zeroed blocks are zero.
    #[test]
    fn blocks_have_the_alignment_and_size_asked_for() {
        let a = MiMalloc;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1, 3, 8, 12, 16, 24, 40, 100, 1000, 5000, 70_000, 1 << 20] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; each block is freed once, by the allocator that
                // made it.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                    p.write_bytes(0xAB, size);
                    let grown = size * 3 + 5;
                    let q = a.realloc(p, layout, grown);
                    assert_eq!(q as usize % align, 0, "realloc: size {size}, align {align}");
                    assert!((0..size).all(|i| *q.add(i) == 0xAB), "kept on resize");
                    a.dealloc(q, Layout::from_size_align(grown, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| *z.add(i) == 0), "zeroed");
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
