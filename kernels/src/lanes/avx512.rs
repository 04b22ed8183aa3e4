//! AVX-512 (F, BW, VL, VNNI): a panel row in one 512-bit register ([`Z`]) and its integer dot
//! products with `vpdpbusd` ([`Zi`]).

use super::traits::{IntLanes, Lanes};
use crate::packed::NR;
use std::arch::x86_64::*;

/// One panel row in one AVX-512 register.
#[derive(Clone, Copy)]
pub(crate) struct Z(pub(crate) __m512);

impl Lanes for Z {
    // 8 rows × 3 panels = 24 accumulators, three weight vectors and a broadcast within the
    // 32 registers: a batch of 8 reads each weight once per step.
    const FEW_MR: usize = 8;
    const REGISTERS: usize = 1;
    const BROADCAST_FIRST: bool = false;
    const PREFETCH: bool = true;
    // Every T: eight rows against three panels over the whole reduction beat the 6-row
    // KC-blocked tile at prefill too (pp128 1520–1620 → 2120–2170 tok/s, pp512 likewise).
    const FEW_ROWS: usize = usize::MAX;
    const KEYS: usize = 16;
    type Int = Zi;
    #[inline(always)]
    unsafe fn zero() -> Z {
        Z(_mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn splat(a: f32) -> Z {
        Z(_mm512_set1_ps(a))
    }
    #[inline(always)]
    unsafe fn fma(a: Z, b: Z, acc: Z) -> Z {
        Z(_mm512_fmadd_ps(a.0, b.0, acc.0))
    }
    #[inline(always)]
    unsafe fn add(a: Z, b: Z) -> Z {
        Z(_mm512_add_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul(a: Z, b: Z) -> Z {
        Z(_mm512_mul_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Z {
        Z(_mm512_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn f32_row(d: &[f32], base: usize) -> Z {
        debug_assert!(base + NR <= d.len());
        Z::load(d.as_ptr().add(base))
    }
    #[inline(always)]
    unsafe fn f16_row(d: &[u16], base: usize) -> Z {
        debug_assert!(base + NR <= d.len());
        Z(_mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr().add(base) as *const __m256i)))
    }
    #[inline(always)]
    unsafe fn bf16_row(d: &[u16], base: usize) -> Z {
        debug_assert!(base + NR <= d.len());
        let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(d.as_ptr().add(base) as *const __m256i));
        Z(_mm512_castsi512_ps(_mm512_slli_epi32(h, 16)))
    }
    #[inline(always)]
    unsafe fn q8_row(d: &[i8], base: usize, scale: f32) -> Z {
        debug_assert!(base + NR <= d.len());
        let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(d.as_ptr().add(base) as *const __m128i));
        Z(_mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale)))
    }
}

/// AVX-512 VNNI: `vpdpbusd` sums four unsigned × signed byte products into each i32 lane
/// without saturating; the weights are stored offset by 128 (unsigned), so the sums start
/// from the activation block's `-128 Σ a`.
#[derive(Clone, Copy)]
pub(crate) struct Zi(__m512i);

impl IntLanes for Zi {
    type F = Z;
    type A = __m512i;
    type W = __m512i;
    const WIDE: bool = true;
    #[inline(always)]
    unsafe fn start(corr: i32) -> Zi {
        Zi(_mm512_set1_epi32(-corr))
    }
    #[inline(always)]
    unsafe fn prep(a4: i32) -> __m512i {
        _mm512_set1_epi32(a4)
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const __m512i)
    }
    #[inline(always)]
    unsafe fn load_w4(p: *const u8) -> (__m512i, __m512i) {
        let v = _mm512_loadu_si512(p as *const __m512i);
        let m = _mm512_set1_epi8(0x0F);
        (_mm512_and_si512(v, m), _mm512_and_si512(_mm512_srli_epi16(v, 4), m))
    }
    #[inline(always)]
    unsafe fn dot4(acc: Zi, a: __m512i, w: __m512i) -> Zi {
        Zi(_mm512_dpbusd_epi32(acc.0, w, a))
    }
    #[inline(always)]
    unsafe fn to_f32(acc: Zi) -> Z {
        Z(_mm512_cvtepi32_ps(acc.0))
    }
}
