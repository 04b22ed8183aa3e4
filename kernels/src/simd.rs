//! The kernel bodies (`*_body`, `#[inline(always)]`), their `#[target_feature]` copies and the
//! dispatch on [`Isa`]. A body is plain Rust over slices; the wrappers only change what the
//! compiler may emit for it (FMA, 256-bit vectors), never the order of the arithmetic.

use crate::math::{exp_approx, gelu_new_scalar};
use crate::{Isa, Kind};

/// Lanes of the fixed-order reductions (two AVX2 registers).
const LANES: usize = 16;

/// Calls `$body(args)` in the compiled copy that `$isa` names.
macro_rules! dispatch {
    ($isa:expr, $name:ident ( $($arg:expr),* $(,)? )) => {
        match $isa.0 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an `Isa` of kind Avx2Fma is only made by `Isa::detect` after the CPU
            // reported AVX2 and FMA.
            Kind::Avx2Fma => unsafe { avx2::$name($($arg),*) },
            Kind::Scalar => $name($($arg),*),
        }
    };
}

/// Defines, for each listed body, a thin AVX2+FMA wrapper with the same signature.
macro_rules! avx2_copies {
    ($( $(#[$m:meta])* fn $name:ident ( $($a:ident : $t:ty),* $(,)? ) $(-> $r:ty)? ; )*) => {
        #[cfg(target_arch = "x86_64")]
        mod avx2 {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[target_feature(enable = "avx2,fma")]
                pub(super) unsafe fn $name($($a: $t),*) $(-> $r)? { super::$name($($a),*) }
            )*
        }
    };
}

avx2_copies! {
    fn matmul_cols_body(out: *mut f32, inp: &[f32], w: &[f32], bias: &[f32], t: usize, k: usize, n: usize, c0: usize, c1: usize);
    fn matmul_t_rows_body(out: *mut f32, inp: &[f32], w: &[f32], t: usize, k: usize, n: usize, r0: usize, r1: usize);
    fn dot_body(a: &[f32], b: &[f32]) -> f32;
    fn sum_body(a: &[f32]) -> f32;
    fn layernorm_row_body(out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], eps: f32);
    fn gelu_body(x: &mut [f32]);
    fn softmax_body(x: &mut [f32]);
    fn scores_body(scores: &mut [f32], q: &[f32], kh: &[f32], hs: usize, scale: f32);
    fn weighted_sum_body(out: &mut [f32], probs: &[f32], vh: &[f32], hs: usize);
}

// ---------------------------------------------------------------------------------------------
// Dispatchers.

/// # Safety
/// `out` must point to `t * n` writable floats, and no other thread may touch columns `c0..c1`.
pub(crate) unsafe fn matmul_cols(
    isa: Isa,
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    bias: &[f32],
    t: usize,
    k: usize,
    n: usize,
    c0: usize,
    c1: usize,
) {
    dispatch!(isa, matmul_cols_body(out, inp, w, bias, t, k, n, c0, c1))
}

/// # Safety
/// `out` must point to `t * n` writable floats, and no other thread may touch columns `r0..r1`.
pub(crate) unsafe fn matmul_t_rows(
    isa: Isa,
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    t: usize,
    k: usize,
    n: usize,
    r0: usize,
    r1: usize,
) {
    dispatch!(isa, matmul_t_rows_body(out, inp, w, t, k, n, r0, r1))
}

pub(crate) fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    dispatch!(isa, dot_body(a, b))
}

pub(crate) fn sum(isa: Isa, a: &[f32]) -> f32 {
    dispatch!(isa, sum_body(a))
}

pub(crate) fn layernorm_row(isa: Isa, out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], eps: f32) {
    dispatch!(isa, layernorm_row_body(out, inp, weight, bias, eps))
}

pub(crate) fn gelu(isa: Isa, x: &mut [f32]) {
    dispatch!(isa, gelu_body(x))
}

pub(crate) fn softmax(isa: Isa, x: &mut [f32]) {
    dispatch!(isa, softmax_body(x))
}

pub(crate) fn scores(isa: Isa, scores: &mut [f32], q: &[f32], kh: &[f32], hs: usize, scale: f32) {
    dispatch!(isa, scores_body(scores, q, kh, hs, scale))
}

pub(crate) fn weighted_sum(isa: Isa, out: &mut [f32], probs: &[f32], vh: &[f32], hs: usize) {
    dispatch!(isa, weighted_sum_body(out, probs, vh, hs))
}

// ---------------------------------------------------------------------------------------------
// Bodies.

/// Columns `c0..c1` of `out[T, N] = inp[T, K] @ w[K, N] + bias`, in register tiles of
/// `MR` rows × `NR` columns; every tile reduces over `i = 0..K` in order.
#[inline(always)]
unsafe fn matmul_cols_body(
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    bias: &[f32],
    t: usize,
    k: usize,
    n: usize,
    c0: usize,
    c1: usize,
) {
    let mut r = 0;
    while r + 4 <= t {
        matmul_rows::<4>(out, inp, w, bias, r, k, n, c0, c1);
        r += 4;
    }
    while r < t {
        matmul_rows::<1>(out, inp, w, bias, r, k, n, c0, c1);
        r += 1;
    }
}

#[inline(always)]
unsafe fn matmul_rows<const MR: usize>(
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    bias: &[f32],
    r0: usize,
    k: usize,
    n: usize,
    c0: usize,
    c1: usize,
) {
    let mut c = c0;
    if MR == 1 {
        while c + 64 <= c1 {
            matmul_tile::<MR, 64>(out, inp, w, bias, r0, k, n, c);
            c += 64;
        }
    }
    while c + 16 <= c1 {
        matmul_tile::<MR, 16>(out, inp, w, bias, r0, k, n, c);
        c += 16;
    }
    while c < c1 {
        matmul_tile::<MR, 1>(out, inp, w, bias, r0, k, n, c);
        c += 1;
    }
}

#[inline(always)]
unsafe fn matmul_tile<const MR: usize, const NR: usize>(
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    bias: &[f32],
    r0: usize,
    k: usize,
    n: usize,
    c: usize,
) {
    let mut acc = [[0.0f32; NR]; MR];
    for i in 0..k {
        let wrow: &[f32; NR] = w[i * n + c..i * n + c + NR].try_into().unwrap();
        for (r, accr) in acc.iter_mut().enumerate() {
            let x = inp[(r0 + r) * k + i];
            for j in 0..NR {
                accr[j] = x.mul_add(wrow[j], accr[j]);
            }
        }
    }
    for (r, accr) in acc.iter().enumerate() {
        for j in 0..NR {
            // SAFETY (caller): row r0+r < t and column c+j < c1 <= n lie inside `out`.
            *out.add((r0 + r) * n + c + j) = accr[j] + bias[c + j];
        }
    }
}

/// Rows `r0..r1` of `w` against every row of `inp`: columns `r0..r1` of `out[T, N]`.
#[inline(always)]
unsafe fn matmul_t_rows_body(
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    t: usize,
    k: usize,
    n: usize,
    r0: usize,
    r1: usize,
) {
    for j in r0..r1 {
        let wj = &w[j * k..(j + 1) * k];
        for m in 0..t {
            // SAFETY (caller): m < t and j < r1 <= n lie inside `out`.
            *out.add(m * n + j) = dot_body(&inp[m * k..(m + 1) * k], wj);
        }
    }
}

/// Sums 16 lane partials in a fixed pairwise order.
#[inline(always)]
fn reduce_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (xa, xb) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] = xa[l].mul_add(xb[l], acc[l]);
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] = x.mul_add(*y, acc[l]);
    }
    reduce_lanes(acc)
}

#[inline(always)]
fn sum_body(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut ch = a.chunks_exact(LANES);
    for x in &mut ch {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    for (l, x) in ch.remainder().iter().enumerate() {
        acc[l] += x;
    }
    reduce_lanes(acc)
}

#[inline(always)]
fn layernorm_row_body(out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], eps: f32) {
    let c = inp.len();
    let mean = sum_body(inp) / c as f32;
    let mut acc = [0.0f32; LANES];
    let mut ch = inp.chunks_exact(LANES);
    for x in &mut ch {
        for l in 0..LANES {
            let d = x[l] - mean;
            acc[l] = d.mul_add(d, acc[l]);
        }
    }
    for (l, x) in ch.remainder().iter().enumerate() {
        let d = x - mean;
        acc[l] = d.mul_add(d, acc[l]);
    }
    let var = reduce_lanes(acc) / c as f32;
    let rstd = 1.0 / (var + eps).sqrt();
    for (((o, x), w), b) in out.iter_mut().zip(inp).zip(weight).zip(bias) {
        *o = ((x - mean) * rstd).mul_add(*w, *b);
    }
}

#[inline(always)]
fn gelu_body(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = gelu_new_scalar(*v);
    }
}

#[inline(always)]
fn softmax_body(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for v in x.iter_mut() {
        *v = exp_approx(*v - max);
    }
    let sum = sum_body(x);
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[inline(always)]
fn scores_body(scores: &mut [f32], q: &[f32], kh: &[f32], hs: usize, scale: f32) {
    for (j, s) in scores.iter_mut().enumerate() {
        *s = dot_body(q, &kh[j * hs..(j + 1) * hs]) * scale;
    }
}

#[inline(always)]
fn weighted_sum_body(out: &mut [f32], probs: &[f32], vh: &[f32], hs: usize) {
    out.fill(0.0);
    for (j, &a) in probs.iter().enumerate() {
        let vj = &vh[j * hs..(j + 1) * hs];
        for (o, v) in out.iter_mut().zip(vj) {
            *o = a.mul_add(*v, *o);
        }
    }
}
