//! The x86 inner loops of attention over either ISA's lanes, each keeping its scalar body's
//! chains and reduction order.

use super::{pair_chunk, scores_body, KvBlocks};
use crate::kv::{Bf16s, F16s, F32s, KvType, Q8s, RowFormat};
use crate::lanes::avx2::Y;
use crate::lanes::avx512::Z;
use crate::lanes::Lanes;
use crate::packed::NR;
use std::arch::x86_64::*;

mod tile;
pub(crate) use tile::{block_scores_tile_lanes, block_sums_tile_lanes};

type V = __m256;

/// A row of 16 lanes as the two AVX2 halves (lanes 0–7, 8–15) the reductions take.
pub(crate) trait Halves: Lanes {
    unsafe fn halves(self) -> [V; 2];
    /// Where [`Lanes::KEYS`] is 16: writes `scale ·` the lane sums of 16 keys (one register
    /// each) to `out[0..16]`, in `reduce_lanes` order.
    unsafe fn reduce_keys16(_acc: &[Self; 16], _scale: f32, _out: *mut f32) {
        unreachable!("only lanes with KEYS = 16 reduce 16 keys at once")
    }
}

impl Halves for Y {
    #[inline(always)]
    unsafe fn halves(self) -> [V; 2] {
        [self.0, self.1]
    }
}

impl Halves for Z {
    #[inline(always)]
    unsafe fn halves(self) -> [V; 2] {
        [_mm512_castps512_ps256(self.0), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(self.0), 1))]
    }

    /// The reduction tree of `reduce_lanes` (lane l plus lane l + 8, then + 4, + 2, + 1) for 16
    /// keys at once, by transposing as it goes: each step adds the same pairs of values for
    /// every key, two to eight keys per instruction.
    #[inline(always)]
    unsafe fn reduce_keys16(acc: &[Z; 16], scale: f32, out: *mut f32) {
        // Width 8: [x lanes 0-7 | y lanes 0-7] + [x 8-15 | y 8-15] for key pairs (2i, 2i+1).
        let mut w8 = [_mm512_setzero_ps(); 8];
        for (i, w) in w8.iter_mut().enumerate() {
            let (x, y) = (acc[2 * i].0, acc[2 * i + 1].0);
            *w = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0b01_00_01_00), _mm512_shuffle_f32x4(x, y, 0b11_10_11_10));
        }
        // Width 4: [a 0-3 | b 0-3 | c 0-3 | d 0-3] + [a 4-7 | …] for keys 4i..4i+4.
        let mut w4 = [_mm512_setzero_ps(); 4];
        for (i, w) in w4.iter_mut().enumerate() {
            let (u, v) = (w8[2 * i], w8[2 * i + 1]);
            *w = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, 0b10_00_10_00), _mm512_shuffle_f32x4(u, v, 0b11_01_11_01));
        }
        // Width 2, within each 128-bit lane L: [x0 x1 y0 y1] + [x2 x3 y2 y3], x = key L (+8),
        // y = key L + 4 (+8).
        let w2: [__m512; 2] = [
            _mm512_add_ps(
                _mm512_shuffle_ps(w4[0], w4[1], 0b01_00_01_00),
                _mm512_shuffle_ps(w4[0], w4[1], 0b11_10_11_10),
            ),
            _mm512_add_ps(
                _mm512_shuffle_ps(w4[2], w4[3], 0b01_00_01_00),
                _mm512_shuffle_ps(w4[2], w4[3], 0b11_10_11_10),
            ),
        ];
        // Width 1: lane L holds keys [L, L + 4, L + 8, L + 12].
        let w1 = _mm512_add_ps(
            _mm512_shuffle_ps(w2[0], w2[1], 0b10_00_10_00),
            _mm512_shuffle_ps(w2[0], w2[1], 0b11_01_11_01),
        );
        // Key j sits at 4 (j mod 4) + j / 4.
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_permutexvar_ps(idx, w1), _mm512_set1_ps(scale)));
    }
}

/// [`super::block_scores_body`] over these lanes.
#[inline(always)]
pub(crate) unsafe fn block_scores_lanes<L: Halves, K: KvBlocks>(
    s: &mut [f32],
    q: &[f32],
    kv: &K,
    h: usize,
    hs: usize,
    scale: f32,
) {
    by_format!(kv.kv_type(), block_scores_as::<L, K>, (s, q, kv, h, hs, scale))
}

#[inline(always)]
unsafe fn block_scores_as<L: Halves, K: KvBlocks, F: RowFormat>(
    s: &mut [f32],
    q: &[f32],
    kv: &K,
    h: usize,
    hs: usize,
    scale: f32,
) {
    for (j, chunk) in s.chunks_mut(kv.block()).enumerate() {
        scores_lanes::<L, F>(chunk, q, kv.k(j, h), hs, scale);
    }
}

/// [`super::block_sums_body`] over these lanes: the 64 outputs stay in four rows of lanes from
/// the first block to the last (the same chain per output as `weighted_sum_body`).
#[inline(always)]
pub(crate) unsafe fn block_sums_lanes<L: Lanes, K: KvBlocks>(
    out: &mut [f32],
    probs: &[f32],
    kv: &K,
    h: usize,
    hs: usize,
) {
    if hs != 64 || out.len() < 64 {
        return super::block_sums_body(out, probs, kv, h, hs);
    }
    by_format!(kv.kv_type(), block_sums_as::<L, K>, (out, probs, kv, h))
}

#[inline(always)]
unsafe fn block_sums_as<L: Lanes, K: KvBlocks, F: RowFormat>(out: &mut [f32], probs: &[f32], kv: &K, h: usize) {
    let w = F::words(64);
    let mut acc = [L::zero(); 4];
    for (j, chunk) in probs.chunks(kv.block()).enumerate() {
        let vh = kv.v(j, h);
        assert!(vh.len() >= chunk.len() * w, "a block holds its rows");
        for (r, &pr) in chunk.iter().enumerate() {
            let a = L::splat(pr);
            // SAFETY: row r of the block's rows holds 64 values (asserted above).
            let v = vh.as_ptr().add(r * w);
            for (d, accd) in acc.iter_mut().enumerate() {
                *accd = L::fma(a, F::lanes::<L>(v, NR * d), *accd);
            }
        }
    }
    for (d, accd) in acc.iter().enumerate() {
        // SAFETY: out holds 64 floats (checked by the caller).
        accd.store(out.as_mut_ptr().add(NR * d));
    }
}

/// [`super::block_sums_pair_body`] over these lanes: each value row loaded once for both queries,
/// the accumulators in registers across blocks (AVX-512: all 64 columns, eight rows of lanes;
/// AVX2: two passes over the blocks, 32 columns each).
#[inline(always)]
pub(crate) unsafe fn block_sums_pair_lanes<L: Lanes, K: KvBlocks>(
    o0: &mut [f32],
    o1: &mut [f32],
    p0: &[f32],
    p1: &[f32],
    kv: &K,
    h: usize,
    hs: usize,
) {
    let n = p0.len();
    if hs != 64 || o0.len() < 64 || o1.len() < 64 || !(p1.len() == n || p1.len() == n + 1) {
        return super::block_sums_pair_body(o0, o1, p0, p1, kv, h, hs);
    }
    by_format!(kv.kv_type(), block_sums_pair_as::<L, K>, (o0, o1, p0, p1, kv, h))
}

#[inline(always)]
unsafe fn block_sums_pair_as<L: Lanes, K: KvBlocks, F: RowFormat>(
    o0: &mut [f32],
    o1: &mut [f32],
    p0: &[f32],
    p1: &[f32],
    kv: &K,
    h: usize,
) {
    // Two queries' 64 outputs are 8 of AVX-512's 32 registers but all 16 of AVX2's (its loop
    // spilled them): AVX2 takes the columns in two halves, each output's chain the same.
    if L::REGISTERS == 1 {
        pair_part::<L, K, F, 4>((o0, o1), (p0, p1), kv, h, 0);
    } else {
        pair_part::<L, K, F, 2>((&mut *o0, &mut *o1), (p0, p1), kv, h, 0);
        pair_part::<L, K, F, 2>((o0, o1), (p0, p1), kv, h, 2);
    }
}

/// Columns `NR·d0..NR·(d0 + D)` of [`block_sums_pair_as`]: the accumulators in registers from
/// the first block to the last.
///
/// # Safety
/// `o0` and `o1` hold 64 floats (checked by `block_sums_pair_lanes`) and `d0 + D <= 4`.
#[inline(always)]
unsafe fn pair_part<L: Lanes, K: KvBlocks, F: RowFormat, const D: usize>(
    (o0, o1): (&mut [f32], &mut [f32]),
    (p0, p1): (&[f32], &[f32]),
    kv: &K,
    h: usize,
    d0: usize,
) {
    debug_assert!(d0 + D <= 4 && o0.len() >= 64 && o1.len() >= 64, "columns inside the 64 outputs");
    let (b, w) = (kv.block(), F::words(64));
    let (mut a0, mut a1) = ([L::zero(); D], [L::zero(); D]);
    for (j, c1) in p1.chunks(b).enumerate() {
        let (c0, vh) = (pair_chunk(p0, j, b), kv.v(j, h));
        assert!(vh.len() >= c1.len() * w, "a block holds its rows");
        for (r, &x0) in c0.iter().enumerate() {
            let (x0, x1) = (L::splat(x0), L::splat(c1[r]));
            // SAFETY: row r of the block's rows holds 64 values (asserted above).
            let v = vh.as_ptr().add(r * w);
            for d in 0..D {
                let vd = F::lanes::<L>(v, NR * (d0 + d));
                a0[d] = L::fma(x0, vd, a0[d]);
                a1[d] = L::fma(x1, vd, a1[d]);
            }
        }
        if c1.len() > c0.len() {
            // The second query's own key: the last row, for it alone.
            let (r, x1) = (c0.len(), L::splat(c1[c0.len()]));
            // SAFETY: row r < c1.len() holds 64 values (asserted above).
            let v = vh.as_ptr().add(r * w);
            for (d, a) in a1.iter_mut().enumerate() {
                *a = L::fma(x1, F::lanes::<L>(v, NR * (d0 + d)), *a);
            }
        }
    }
    for d in 0..D {
        // SAFETY: o0 and o1 hold 64 floats each (checked by the caller), d0 + d < 4.
        a0[d].store(o0.as_mut_ptr().add(NR * (d0 + d)));
        a1[d].store(o1.as_mut_ptr().add(NR * (d0 + d)));
    }
}

/// Attention scores of one query against keys `0..scores.len()` of one head, four keys at a
/// time; each key's dot product keeps `dot_row`'s lanes and reduction order.
#[inline(always)]
pub(crate) unsafe fn scores_lanes<L: Halves, F: RowFormat>(
    scores: &mut [f32],
    q: &[f32],
    kh: &[f32],
    hs: usize,
    scale: f32,
) {
    let (n, w) = (scores.len(), F::words(hs));
    if !hs.is_multiple_of(NR) || q.len() < hs || kh.len() < n * w {
        return scores_body::<F>(scores, q, kh, hs, scale);
    }
    let (qp, kp) = (q.as_ptr(), kh.as_ptr());
    let mut j = 0;
    if L::KEYS == 16 {
        while j + 16 <= n {
            // SAFETY: keys j..j+16 < n lie inside kh (checked above), and j + 16 <= scores.len().
            let acc = dot_key_lanes::<L, F, 16>(qp, kp.add(j * w), hs);
            L::reduce_keys16(&acc, scale, scores.as_mut_ptr().add(j));
            j += 16;
        }
    }
    if L::KEYS >= 8 {
        // Eight keys in flight: eight FMA chains, enough to cover the FMA latency in one
        // register per key.
        while j + 8 <= n {
            // SAFETY: keys j..j+8 < n lie inside kh (checked above), and j + 8 <= scores.len().
            let acc = dot_keys::<L, F, 8>(qp, kp.add(j * w), hs);
            let (a, b): (&[[V; 2]; 4], &[[V; 2]; 4]) = (acc[..4].try_into().unwrap(), acc[4..].try_into().unwrap());
            let sc = _mm_set1_ps(scale);
            _mm_storeu_ps(scores.as_mut_ptr().add(j), _mm_mul_ps(reduce16x4(a), sc));
            _mm_storeu_ps(scores.as_mut_ptr().add(j + 4), _mm_mul_ps(reduce16x4(b), sc));
            j += 8;
        }
    }
    while j + 4 <= n {
        // SAFETY: keys j..j+4 < n lie inside kh (checked above), and j + 4 <= scores.len().
        let r = _mm_mul_ps(reduce16x4(&dot_keys::<L, F, 4>(qp, kp.add(j * w), hs)), _mm_set1_ps(scale));
        _mm_storeu_ps(scores.as_mut_ptr().add(j), r);
        j += 4;
    }
    for (x, s) in scores.iter_mut().enumerate().skip(j) {
        // SAFETY: key x < n lies inside kh.
        let [[lo, hi]] = dot_keys::<L, F, 1>(qp, kp.add(x * w), hs);
        *s = reduce16(lo, hi) * scale;
    }
}

/// The 16-lane partial sums of `q · k` for `G` consecutive keys of `hs` values (rows of format
/// `F`) at `k`.
#[inline(always)]
unsafe fn dot_keys<L: Halves, F: RowFormat, const G: usize>(q: *const f32, k: *const f32, hs: usize) -> [[V; 2]; G] {
    let acc = dot_key_lanes::<L, F, G>(q, k, hs);
    // A loop, not `array::map`: its closure would not get the caller's target features.
    let mut out = [[_mm256_setzero_ps(); 2]; G];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a.halves();
    }
    out
}

/// The same partial sums, one row of lanes per key.
#[inline(always)]
unsafe fn dot_key_lanes<L: Lanes, F: RowFormat, const G: usize>(q: *const f32, k: *const f32, hs: usize) -> [L; G] {
    let (mut acc, w) = ([L::zero(); G], F::words(hs));
    let mut c = 0;
    while c < hs {
        // SAFETY (caller): c + 16 <= hs values of q, and of each of the G keys.
        let a = L::load(q.add(c));
        for (x, accx) in acc.iter_mut().enumerate() {
            *accx = L::fma(a, F::lanes::<L>(k.add(x * w), c), *accx);
        }
        c += NR;
    }
    acc
}

/// [`reduce16`] of four (lo, hi) pairs at once, the same additions done in vectors:
/// `[r0, r1, r2, r3]`.
#[inline(always)]
unsafe fn reduce16x4(acc: &[[V; 2]; 4]) -> __m128 {
    let mut a = [_mm256_setzero_ps(); 4]; // a[l] = acc[l] + acc[l+8] (a loop: see `dot_keys`)
    for (ax, accx) in a.iter_mut().zip(acc) {
        *ax = _mm256_add_ps(accx[0], accx[1]);
    }
    // b[l] = a[l] + a[l+4], l < 4: low 128 bits plus high, two keys per vector.
    let half = |x: V, y: V| _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
    let (b01, b23) = (half(a[0], a[1]), half(a[2], a[3])); // [b0 | b1], [b2 | b3]

    // c[l] = b[l] + b[l+2], l < 2: low lanes [c0 c0 c2 c2], high lanes [c1 c1 c3 c3].
    let c = _mm256_add_ps(_mm256_shuffle_ps(b01, b23, 0x44), _mm256_shuffle_ps(b01, b23, 0xEE));
    // r = c[0] + c[1]: low lanes [r0 r2 r0 r2], high lanes [r1 r3 r1 r3].
    let r = _mm256_add_ps(_mm256_shuffle_ps(c, c, 0x88), _mm256_shuffle_ps(c, c, 0xDD));
    _mm_unpacklo_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1))
}

/// Sums the 16 lanes of (lo, hi) in `reduce_lanes` order.
#[inline(always)]
unsafe fn reduce16(lo: V, hi: V) -> f32 {
    let mut a = [0.0f32; 8];
    _mm256_storeu_ps(a.as_mut_ptr(), _mm256_add_ps(lo, hi)); // acc[l] + acc[l+8]
    let b = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let c = [b[0] + b[2], b[1] + b[3]];
    c[0] + c[1]
}
