//! A counting global allocator for the memory benches and soak examples: live heap bytes,
//! exactly, whichever allocator the binary installs (`src/allocator.rs`, included by path).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts live heap bytes around an inner allocator: every allocation adds its size, every
/// free subtracts it. Generic so that RSS is measured over the allocator the binary uses.
pub struct Counting<A>(A);

/// Live heap bytes.
pub static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the inner allocator; only a counter is added.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from the inner allocator with this layout.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: `ptr` came from the inner allocator with `layout`.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting<crate::allocator::Chosen> = Counting(crate::allocator::Chosen);
