//! GEMM sources: one panel row of a packed matrix, widened to f32, as plain values (the portable
//! tile's) or in the registers of any ISA (the SIMD tiles'), for every storage format.

use crate::lanes::Lanes;
use crate::packed::{Bf16s, F16s, F32s, Format, Panels, Q8s, NR};

/// One panel row, widened to f32.
pub(crate) trait Source {
    fn row(&self, p: usize, i: usize) -> [f32; NR];
    /// The same row in registers of `L` (the same values, loaded and converted in registers).
    unsafe fn lanes<L: Lanes>(&self, p: usize, i: usize) -> L;
    /// Asks for the row to be brought into cache (a hint; a no-op unless overridden).
    #[inline(always)]
    fn prefetch(&self, _p: usize, _i: usize) {}
}

/// Loading a panel row of a format into registers of any ISA.
pub(crate) trait LoadLanes: Format {
    unsafe fn lanes<L: Lanes>(d: &[Self::E], base: usize, scale: f32) -> L;
}

impl LoadLanes for F32s {
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(d: &[f32], base: usize, _: f32) -> L {
        L::f32_row(d, base)
    }
}
impl LoadLanes for F16s {
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(d: &[u16], base: usize, _: f32) -> L {
        L::f16_row(d, base)
    }
}
impl LoadLanes for Bf16s {
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(d: &[u16], base: usize, _: f32) -> L {
        L::bf16_row(d, base)
    }
}
impl LoadLanes for Q8s {
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(d: &[i8], base: usize, scale: f32) -> L {
        L::q8_row(d, base, scale)
    }
}

impl<F: LoadLanes> Source for Panels<'_, F> {
    #[inline(always)]
    fn row(&self, p: usize, i: usize) -> [f32; NR] {
        Panels::row(self, p, i)
    }
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(&self, p: usize, i: usize) -> L {
        F::lanes(self.d, self.base(p, i), self.scale(p, i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch(&self, p: usize, i: usize) {
        prefetch(self.d, self.base(p, i))
    }
}

/// A hint to bring `d[at]` into cache; any `at` is allowed.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch<T>(d: &[T], at: usize) {
    crate::lanes::prefetch(d.as_ptr().wrapping_add(at) as *const u8)
}
