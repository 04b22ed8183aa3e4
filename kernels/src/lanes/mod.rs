//! The register vocabulary: a panel row of 16 lanes as each ISA holds it, f32 ([`Lanes`]) and
//! integer ([`IntLanes`]), with the few operations the kernels are written over. The kernels'
//! scalar references (plain Rust over slices) need no vocabulary; the x86 ISAs have one module
//! each: [`avx2`] (`Y`, `Yi`: two 256-bit registers) and [`avx512`] (`Z`, `Zi`: one 512-bit
//! register). A spelling's constants (tile shapes, keys per step) are numbers the kernels above
//! read; this layer imports nothing above it, only the panel width.

mod traits;

pub(crate) use traits::{IntLanes, Lanes};

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

/// A hint to bring the cache line at `p` in; any address is allowed (formed with wrapping
/// arithmetic by the callers, never dereferenced).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and never changes memory, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
