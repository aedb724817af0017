//! Asking the CPU for memory before it is read: the one hint the codec's caches use
//! ([`super::ahead`] for the records ahead of the encoder's walk, the tuple ring for the
//! records it drops next). A hint changes no result, only when a miss is waited for.

/// Asks the CPU to bring the cache line at `addr` into its caches (0: nothing to ask for).
/// Never faults, whatever the address.
#[inline(always)]
pub(super) fn prefetch(addr: usize) {
    if addr == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` is a hint that never faults and reads nothing the program sees,
    // whatever the address; SSE, the target feature `_mm_prefetch` is declared with, is part
    // of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
