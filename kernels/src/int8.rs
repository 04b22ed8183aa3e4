//! W8A8: int8 weights times int8 activations, with exact integer block sums.
//!
//! Each activation row is quantized on its own, per block of [`W8_BLOCK`] reduction elements
//! (`sa[r, b]`, `qa[r, i]`); each weight column likewise (`sw[b, c]`, `qw[i, c]`). An output is
//!
//! ```text
//! acc = 0; for b in 0..KP/32 { acc = fma(sa[r,b] * sw[b,c], Σ_{i in b} qa[r,i]·qw[i,c], acc) }
//! out = acc + bias[c]
//! ```
//!
//! The block sum is an integer (|Σ| ≤ 32·127·127 < 2²⁴, so its f32 is exact) and integer sums are
//! exact in any order: whatever the instruction (VNNI's `vpdpbusd`, AVX2's `pmaddubsw` +
//! `pmaddwd`, plain Rust) and however the work is split, the f32 chain over blocks is the same,
//! so the bits are the same on every path, for any T, batch and thread count.
//!
//! `T` rows of `KP` (the reduction padded to whole blocks with zeros), `N` columns in panels of
//! [`NR`] as [`crate::packed::w8_index`] lays them out.
//!
//! Layered on the lanes alone: the dot products are written over [`IntLanes`] (each ISA's
//! spelling lives in `crate::lanes`), and the GEMM drivers call them; nothing here imports GEMM.

use crate::dispatch::kernels;
use crate::isa::Isa;
use crate::lanes::{IntLanes, Lanes};
use crate::packed::{quantize, quantize_by, scale_of, w8_block_index, w8_index, w8_value, NR, W8, W8_BLOCK};

kernels! {
    [] fn quantize_row(q: &mut [i8], s: &mut [f32], corr: &mut [i32], x: &[f32]) = quantize_row_body, quantize_row_body;
}

/// Room for a matmul's activations quantized to int8 (W8A8 weights only): kept by the caller
/// and reused, so the per-token path does not allocate once it has grown.
#[derive(Default)]
pub struct QuantizedActs {
    /// `[T, KP]` int8 values.
    pub(crate) q: Vec<i8>,
    /// `[T, KP / 32]` scales.
    pub(crate) s: Vec<f32>,
    /// `[T, KP / 32]`: 128 × the block's sum of int8 values (what a dot product with the weights
    /// offset by 128 into unsigned bytes must take off).
    pub(crate) corr: Vec<i32>,
}

impl QuantizedActs {
    /// Quantizes `inp[T, K]` per row and block of 32, padding each row to `kp` with zeros.
    pub(crate) fn fill(&mut self, isa: Isa, inp: &[f32], t: usize, k: usize, kp: usize) {
        let nb = kp / W8_BLOCK;
        self.q.clear();
        self.q.resize(t * kp, 0);
        self.s.clear();
        self.s.resize(t * nb, 0.0);
        self.corr.clear();
        self.corr.resize(t * nb, 0);
        for r in 0..t {
            let (q, s, corr) =
                (&mut self.q[r * kp..][..kp], &mut self.s[r * nb..][..nb], &mut self.corr[r * nb..][..nb]);
            quantize_row(isa, q, s, corr, &inp[r * k..(r + 1) * k]);
        }
    }
}

/// One activation row `x` quantized per block of 32 (max-abs, symmetric) into `q` (padded with
/// zeros), its scales `s` and corrections `corr` (`128 Σ q` per block). Plain IEEE operations
/// (max, reciprocal, product, round-half-even), so the same values whichever ISA compiles it.
#[inline(always)]
pub(crate) fn quantize_row_body(q: &mut [i8], s: &mut [f32], corr: &mut [i32], x: &[f32]) {
    for (b, ((qb, sb), cb)) in q.chunks_mut(W8_BLOCK).zip(s.iter_mut()).zip(corr.iter_mut()).enumerate() {
        let blk = &x[(b * W8_BLOCK).min(x.len())..((b + 1) * W8_BLOCK).min(x.len())];
        if blk.len() == W8_BLOCK {
            // A whole block, in fixed-size arrays so that it vectorizes.
            let blk: &[f32; W8_BLOCK] = blk.try_into().expect("a whole block");
            // (`if a > m` rather than `f32::max`, whose NaN rule keeps it scalar; the values
            // are finite, so both give the same maximum.)
            let mut m = [0.0f32; 16];
            for h in blk.chunks_exact(16) {
                for (ml, v) in m.iter_mut().zip(h) {
                    let a = v.abs();
                    *ml = if a > *ml { a } else { *ml };
                }
            }
            let sc = scale_of(m.iter().fold(0.0f32, |a, &v| if v > a { v } else { a }));
            let mut qs = [0i8; W8_BLOCK];
            if sc != 0.0 {
                let inv = 1.0 / sc;
                for (qv, &v) in qs.iter_mut().zip(blk) {
                    *qv = quantize_by(v, inv);
                }
            }
            qb.copy_from_slice(&qs);
            *sb = sc;
            *cb = 128 * qs.iter().map(|&v| v as i32).sum::<i32>();
        } else {
            let sc = scale_of(blk.iter().fold(0.0f32, |m, v| m.max(v.abs())));
            qb.fill(0);
            for (qv, &v) in qb.iter_mut().zip(blk) {
                *qv = quantize(v, sc);
            }
            *sb = sc;
            *cb = 128 * qb.iter().map(|&v| v as i32).sum::<i32>();
        }
    }
}

/// What every tile of one W8A8 matmul call shares.
pub(crate) struct Job<'a> {
    pub(crate) w: &'a W8,
    pub(crate) a: &'a QuantizedActs,
    /// `T * N` writable floats; each task writes only the columns of its own panels.
    pub(crate) out: *mut f32,
    pub(crate) bias: &'a [f32],
    pub(crate) t: usize,
    pub(crate) n: usize,
}

/// Row `r` against panel `p`, in plain Rust: the reference the SIMD tiles are tested against.
#[inline(always)]
pub(crate) unsafe fn tile_portable(j: &Job, p: usize, r: usize) {
    let Job { w, a, out, bias, n, .. } = *j;
    let (kp, nb) = (w.kp, w.kp / W8_BLOCK);
    let c0 = p * NR;
    let mut acc = [0.0f32; NR];
    for b in 0..nb {
        let mut isum = [0i32; NR];
        for i in b * W8_BLOCK..(b + 1) * W8_BLOCK {
            let x = a.q[r * kp + i] as i32;
            for (l, s) in isum.iter_mut().enumerate() {
                *s += x * w8_value(w.q[w8_index(kp, p, i, l)]) as i32;
            }
        }
        let sa = a.s[r * nb + b];
        let sw = &w.scales[w8_block_index(kp, p, b)..];
        for l in 0..NR {
            acc[l] = (sa * sw[l]).mul_add(isum[l] as f32, acc[l]);
        }
    }
    for (l, v) in acc.iter().enumerate().take(NR.min(n - c0)) {
        // SAFETY (caller): row r < t and column c0 + l < n lie inside `out`.
        *out.add(r * n + c0 + l) = v + bias[c0 + l];
    }
}

/// Panels `p0..p1` (every row) in plain Rust.
#[inline(always)]
pub(crate) unsafe fn cols_portable(j: &Job, p0: usize, p1: usize) {
    for p in p0..p1 {
        for r in 0..j.t {
            tile_portable(j, p, r);
        }
    }
}

/// Rows `r0..r0+R` against the whole panels `p..p+G`.
#[inline(always)]
unsafe fn tile<L: IntLanes, const R: usize, const G: usize>(j: &Job, p: usize, r0: usize) {
    let Job { w, a, out, bias, n, .. } = *j;
    let (kp, nb) = (w.kp, w.kp / W8_BLOCK);
    let (wq, aq) = (w.q.as_ptr(), a.q.as_ptr());
    let mut acc = [[L::F::zero(); R]; G]; // [panel][row]
    for b in 0..nb {
        let mut start = [L::start(0); R];
        for (r, st) in start.iter_mut().enumerate() {
            *st = L::start(a.corr[(r0 + r) * nb + b]);
        }
        let mut isum = [start; G];
        for i in (b * W8_BLOCK..(b + 1) * W8_BLOCK).step_by(4) {
            // SAFETY (caller): panels p..p+G are inside the matrix and i + 4 <= kp, so each
            // group's 64 bytes and each row's 4 activation bytes are in bounds.
            // A loop, not `array::from_fn`: its closure would not get the caller's target
            // features, and the intrinsics in it would become calls.
            let mut wg = [L::load_w(wq.add(w8_index(kp, p, i, 0))); G];
            for (q, wgq) in wg.iter_mut().enumerate().skip(1) {
                *wgq = L::load_w(wq.add(w8_index(kp, p + q, i, 0)));
            }
            for r in 0..R {
                let x = L::prep((aq.add((r0 + r) * kp + i) as *const i32).read_unaligned());
                for (sq, &wgq) in isum.iter_mut().zip(&wg) {
                    sq[r] = L::dot4(sq[r], x, wgq);
                }
            }
        }
        for (q, (accq, sq)) in acc.iter_mut().zip(&isum).enumerate() {
            let at = w8_block_index(kp, p + q, b);
            let sw = L::F::load(w.scales.as_ptr().add(at));
            for r in 0..R {
                let s = L::F::mul(sw, L::F::splat(a.s[(r0 + r) * nb + b]));
                accq[r] = L::F::fma(s, L::to_f32(sq[r]), accq[r]);
            }
        }
    }
    for (q, accq) in acc.iter().enumerate() {
        let c0 = (p + q) * NR;
        let bv = L::F::load(bias.as_ptr().add(c0));
        for (r, v) in accq.iter().enumerate() {
            // SAFETY (caller): rows r0+r < t and the panel's 16 columns < n lie inside `out`.
            L::F::add(*v, bv).store(out.add((r0 + r) * n + c0));
        }
    }
}

/// Every row against panels `p0..p1` in register tiles; the ragged last panel in plain Rust.
#[inline(always)]
pub(crate) unsafe fn cols<L: IntLanes>(j: &Job, p0: usize, p1: usize) {
    let Job { t, n, .. } = *j;
    let whole = p1.min(n / NR).max(p0);
    let mut p = p0;
    if t == 1 {
        if L::WIDE {
            while p + 4 <= whole {
                tile::<L, 1, 4>(j, p, 0);
                p += 4;
            }
        } else {
            while p + 2 <= whole {
                tile::<L, 1, 2>(j, p, 0);
                p += 2;
            }
        }
    } else if L::WIDE {
        while p + 3 <= whole {
            rows::<L, 4, 3>(j, p);
            p += 3;
        }
        while p < whole {
            rows::<L, 4, 1>(j, p);
            p += 1;
        }
    } else {
        while p < whole {
            rows::<L, 2, 1>(j, p);
            p += 1;
        }
    }
    for q in p..whole {
        tile::<L, 1, 1>(j, q, 0); // decode's last few panels
    }
    cols_portable(j, whole, p1);
}

/// Every row against the whole panels `p..p+G`, `R` rows at a time, then one at a time.
#[inline(always)]
unsafe fn rows<L: IntLanes, const R: usize, const G: usize>(j: &Job, p: usize) {
    let mut r = 0;
    while r + R <= j.t {
        tile::<L, R, G>(j, p, r);
        r += R;
    }
    while r < j.t {
        tile::<L, 1, G>(j, p, r);
        r += 1;
    }
}
