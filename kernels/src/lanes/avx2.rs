//! AVX2 + FMA + F16C: a panel row in two 256-bit registers ([`Y`], lanes 0–7 and 8–15) and its
//! integer dot products ([`Yi`]).

use super::traits::{IntLanes, Lanes};
use crate::packed::NR;
use std::arch::x86_64::*;

type V = __m256;

/// One panel row in two AVX2 registers (lanes 0–7, 8–15).
#[derive(Clone, Copy)]
pub(crate) struct Y(pub(crate) V, pub(crate) V);

impl Lanes for Y {
    const FEW_MR: usize = 2; // 2 rows × 3 panels × 2 registers = 12 accumulators of 16
    const REGISTERS: usize = 2;
    const BROADCAST_FIRST: bool = true;
    const PREFETCH: bool = false; // 24 rows ahead in whole passes: measured no faster on AVX2
    /// Up to 64 rows in two-row passes over chunks: the MR-row tiles at 17–64 rows were
    /// 1.03–1.45× slower (kvgpt bench --roofline, AMD EPYC Zen 5 class, AVX2, 2 threads: 17 rows'
    /// vocabulary 7.2–7.4 against 5.3 ms, 48 rows' 15.9 against 13.7), the same at 128 and 256,
    /// 3% faster at 96.
    const FEW_ROWS: usize = 64;
    type Int = Yi;
    #[inline(always)]
    unsafe fn zero() -> Y {
        Y(_mm256_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn splat(a: f32) -> Y {
        let v = _mm256_set1_ps(a);
        Y(v, v)
    }
    #[inline(always)]
    unsafe fn fma(a: Y, b: Y, acc: Y) -> Y {
        Y(_mm256_fmadd_ps(a.0, b.0, acc.0), _mm256_fmadd_ps(a.1, b.1, acc.1))
    }
    #[inline(always)]
    unsafe fn add(a: Y, b: Y) -> Y {
        Y(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn mul(a: Y, b: Y) -> Y {
        Y(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Y {
        Y(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self.0);
        _mm256_storeu_ps(p.add(8), self.1);
    }
    #[inline(always)]
    unsafe fn f32_row(d: &[f32], base: usize) -> Y {
        debug_assert!(base + NR <= d.len());
        Y::load(d.as_ptr().add(base))
    }
    #[inline(always)]
    unsafe fn f16_row(d: &[u16], base: usize) -> Y {
        debug_assert!(base + NR <= d.len());
        let p = d.as_ptr().add(base);
        let lo = _mm_loadu_si128(p as *const __m128i);
        let hi = _mm_loadu_si128(p.add(8) as *const __m128i);
        Y(_mm256_cvtph_ps(lo), _mm256_cvtph_ps(hi))
    }
    #[inline(always)]
    unsafe fn bf16_row(d: &[u16], base: usize) -> Y {
        debug_assert!(base + NR <= d.len());
        let p = d.as_ptr().add(base);
        let lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        let hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(8) as *const __m128i));
        Y(_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)))
    }
    #[inline(always)]
    unsafe fn q8_row(d: &[i8], base: usize, scale: f32) -> Y {
        debug_assert!(base + NR <= d.len());
        let q = _mm_loadu_si128(d.as_ptr().add(base) as *const __m128i);
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
        let sc = _mm256_set1_ps(scale);
        Y(_mm256_mul_ps(lo, sc), _mm256_mul_ps(hi, sc))
    }
}

/// AVX2: `pmaddubsw` multiplies unsigned by signed bytes into saturating i16 pairs, so it
/// takes |a| and w·sign(a) (w back from its offset): each pair is at most 2·127·127 < 2¹⁵, nothing saturates, and
/// `pmaddwd` by ones sums the pairs into the i32 lanes exactly.
#[derive(Clone, Copy)]
pub(crate) struct Yi(__m256i, __m256i);

impl IntLanes for Yi {
    type F = Y;
    /// (|a|, a) broadcast.
    type A = (__m256i, __m256i);
    type W = (__m256i, __m256i);
    const WIDE: bool = false;
    /// |a| comes with the activations (one instruction less for every row and group of four).
    const TAKES_ABS: bool = true;
    #[inline(always)]
    unsafe fn start(_corr: i32) -> Yi {
        Yi(_mm256_setzero_si256(), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn start_u(corr: i32) -> Yi {
        Yi(_mm256_set1_epi32(-corr), _mm256_set1_epi32(-corr))
    }
    #[inline(always)]
    unsafe fn prep(a4: i32) -> Self::A {
        let a = _mm256_set1_epi32(a4);
        (_mm256_abs_epi8(a), a)
    }
    #[inline(always)]
    unsafe fn prep_abs(a4: i32, abs4: i32) -> Self::A {
        (_mm256_set1_epi32(abs4), _mm256_set1_epi32(a4))
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        let off = _mm256_set1_epi8(-128);
        let w = |p: *const u8| _mm256_xor_si256(_mm256_loadu_si256(p as *const __m256i), off);
        (w(p), w(p.add(32)))
    }
    #[inline(always)]
    unsafe fn load_w4(p: *const u8) -> (Self::W, Self::W) {
        let m = _mm256_set1_epi8(0x0F);
        let (v0, v1) = (_mm256_loadu_si256(p as *const __m256i), _mm256_loadu_si256(p.add(32) as *const __m256i));
        let hi = |v| _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
        ((_mm256_and_si256(v0, m), _mm256_and_si256(v1, m)), (hi(v0), hi(v1)))
    }
    /// Unsigned weights below 16 times signed activations: `pmaddubsw` as it is (pairs at most
    /// 2·15·128, nothing saturates).
    #[inline(always)]
    unsafe fn dot4u(acc: Yi, (_, a): Self::A, (w0, w1): Self::W) -> Yi {
        let ones = _mm256_set1_epi16(1);
        let d = |w| _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
        Yi(_mm256_add_epi32(acc.0, d(w0)), _mm256_add_epi32(acc.1, d(w1)))
    }
    #[inline(always)]
    unsafe fn dot4(acc: Yi, (abs, a): Self::A, (w0, w1): Self::W) -> Yi {
        let ones = _mm256_set1_epi16(1);
        let d = |w| _mm256_madd_epi16(_mm256_maddubs_epi16(abs, _mm256_sign_epi8(w, a)), ones);
        Yi(_mm256_add_epi32(acc.0, d(w0)), _mm256_add_epi32(acc.1, d(w1)))
    }
    #[inline(always)]
    unsafe fn to_f32(acc: Yi) -> Y {
        Y(_mm256_cvtepi32_ps(acc.0), _mm256_cvtepi32_ps(acc.1))
    }
}
