//! A cache prefetch hint, for walks over many objects spread across the
//! heap (large Lists): asking for an item's memory a few items before it is
//! read hides the cache miss behind the work on the items before it.

/// Asks the CPU to bring the cache line at `p` in; no effect elsewhere
/// than x86_64.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache: it reads nothing the program
    // sees and cannot fault, whatever the address.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
