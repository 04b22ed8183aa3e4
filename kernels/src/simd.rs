//! The kernel bodies (`*_body`, `#[inline(always)]`), their `#[target_feature]` copies and the
//! dispatch on [`Isa`]. A body is plain Rust over slices; the wrappers only change what the
//! compiler may emit for it (FMA, 256-bit vectors), never the order of the arithmetic.

use crate::int8::{self, quantize_row_body, IntLanes, QuantizedActs};
use crate::math::{exp_approx, gelu_new_scalar};
use crate::packed::{Bf16s, F16s, F32s, Format, PackedMatrix, Panels, Q8s, Storage, NR};
use crate::{Isa, Kind, SendPtr};

/// Lanes of the fixed-order reductions (two AVX2 registers).
const LANES: usize = 16;

/// The one dispatch mechanism. Each entry `[unsafe] fn name(args) -> R = LANES_BODY, SCALAR_BODY;`
/// makes the dispatcher `name(isa, args)` and, per x86 ISA, a module holding its lanes as `L`
/// (two AVX2 registers, one AVX-512 register) and a `#[target_feature]` copy that calls
/// `LANES_BODY`, a path that may name `L`. One feature set per ISA; the bodies' arithmetic is
/// fixed, only the registers and instructions differ. For `unsafe` kernels the caller upholds the
/// body's contract.
macro_rules! kernels {
    ($( [$($kw:tt)*] fn $name:ident ( $($a:ident : $t:ty),* $(,)? ) $(-> $r:ty)? = $lanes:path, $scalar:path ; )*) => {
        $(
            #[allow(clippy::too_many_arguments, unused_unsafe)] // the bodies' own signatures
            pub(crate) $($kw)* fn $name(isa: Isa, $($a: $t),*) $(-> $r)? {
                match isa.0 {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: an `Isa` of kind Avx2Fma is only made by `Isa::available` after the
                    // CPU reported AVX2, FMA and F16C (the caller upholds the body's contract).
                    Kind::Avx2Fma => unsafe { avx2::$name($($a),*) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: an `Isa` of kind Avx512 is only made after the CPU reported AVX-512
                    // F, BW, VL and VNNI besides AVX2, FMA and F16C (as above).
                    Kind::Avx512 => unsafe { avx512::$name($($a),*) },
                    // SAFETY: the plain body; the caller upholds its contract.
                    Kind::Scalar => unsafe { $scalar($($a),*) },
                }
            }
        )*
        kernels!(@module avx2, x86::Y, "avx2,fma,f16c", $( fn $name ( $($a : $t),* ) $(-> $r)? = $lanes ; )*);
        kernels!(@module avx512, x86::Z, "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
            $( fn $name ( $($a : $t),* ) $(-> $r)? = $lanes ; )*);
    };
    (@module $module:ident, $lanes_ty:ty, $features:literal,
        $( fn $name:ident ( $($a:ident : $t:ty),* ) $(-> $r:ty)? = $lanes:path ; )*) => {
        #[cfg(target_arch = "x86_64")]
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            /// This ISA's lanes: what the generic bodies are compiled with here.
            type L = $lanes_ty;
            $(
                #[allow(clippy::too_many_arguments, unused_unsafe)] // the bodies' own signatures
                #[target_feature(enable = $features)]
                pub(super) unsafe fn $name($($a: $t),*) $(-> $r)? {
                    // SAFETY: the caller (the dispatcher) upholds the body's contract.
                    unsafe { $lanes($($a),*) }
                }
            )*
        }
    };
}

kernels! {
    // # Safety: `out` must point to `t * n` writable floats, and no other thread may touch
    // columns `c0..c1`.
    [unsafe] fn matmul_cols(out: *mut f32, inp: &[f32], w: &[f32], bias: &[f32], t: usize, k: usize, n: usize, c0: usize, c1: usize)
        = matmul_cols_body, matmul_cols_body;
    // # Safety: `c.out` must point to `c.t * c.w.n()` writable floats, and no other thread may
    // touch the columns of panels `p0..p1`.
    [unsafe] fn packed_cols(c: &Call, p0: usize, p1: usize) = packed_cols_body::<Simd<L>>, packed_cols_body::<Portable>;
    [] fn sum(a: &[f32]) -> f32 = sum_body, sum_body;
    [] fn layernorm_row(out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], eps: f32)
        = layernorm_row_body, layernorm_row_body;
    [] fn gelu(x: &mut [f32]) = gelu_body, gelu_body;
    [] fn softmax(x: &mut [f32]) = softmax_body, softmax_body;
    [] fn quantize_row(q: &mut [i8], s: &mut [f32], corr: &mut [i32], x: &[f32]) = quantize_row_body, quantize_row_body;
    [] fn scores(scores: &mut [f32], q: &[f32], kh: &[f32], hs: usize, scale: f32) = x86::scores_lanes::<L>, scores_body;
    [] fn weighted_sum(out: &mut [f32], probs: &[f32], vh: &[f32], hs: usize)
        = x86::weighted_sum_lanes::<L>, weighted_sum_body;
    [] fn weighted_sum_pair(o0: &mut [f32], o1: &mut [f32], p0: &[f32], p1: &[f32], vh: &[f32], hs: usize)
        = x86::weighted_sum_pair_lanes::<L>, weighted_sum_pair_body;
}

/// One packed matmul call, as the tasks share it: `out[T, N] = inp[T, K] @ w + bias`, with the
/// activations also quantized in `acts` when `w` is W8A8.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    /// `T * N` writable floats; each task writes only the columns of its own panels.
    pub(crate) out: SendPtr,
    pub(crate) inp: &'a [f32],
    pub(crate) acts: &'a QuantizedActs,
    pub(crate) w: &'a PackedMatrix,
    pub(crate) bias: &'a [f32],
    pub(crate) t: usize,
}

// ---------------------------------------------------------------------------------------------
// Bodies.

/// Columns `c0..c1` of `out[T, N] = inp[T, K] @ w[K, N] + bias`, in register tiles of
/// `MR` rows × `NR` columns; every tile reduces over `i = 0..K` in order.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
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
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
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
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
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

/// The largest element (−∞ for none), 16 lanes at a time. `if v > m`, not `f32::max`, whose
/// NaN rule keeps the loop scalar; the maximum of finite values is the same either way.
#[inline(always)]
fn max_body(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut ch = x.chunks_exact(LANES);
    for c in &mut ch {
        for (ml, &v) in m.iter_mut().zip(c) {
            *ml = if v > *ml { v } else { *ml };
        }
    }
    for (ml, &v) in m.iter_mut().zip(ch.remainder()) {
        *ml = if v > *ml { v } else { *ml };
    }
    m.iter().fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a })
}

#[inline(always)]
fn gelu_body(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = gelu_new_scalar(*v);
    }
}

#[inline(always)]
fn softmax_body(x: &mut [f32]) {
    let max = max_body(x);
    for v in x.iter_mut() {
        *v = exp_approx(*v - max);
    }
    let sum = sum_body(x);
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[inline(always)]
pub(crate) fn scores_body(scores: &mut [f32], q: &[f32], kh: &[f32], hs: usize, scale: f32) {
    for (j, s) in scores.iter_mut().enumerate() {
        *s = dot_body(q, &kh[j * hs..(j + 1) * hs]) * scale;
    }
}

#[inline(always)]
pub(crate) fn weighted_sum_body(out: &mut [f32], probs: &[f32], vh: &[f32], hs: usize) {
    out.fill(0.0);
    for (j, &a) in probs.iter().enumerate() {
        let vj = &vh[j * hs..(j + 1) * hs];
        for (o, v) in out.iter_mut().zip(vj) {
            *o = a.mul_add(*v, *o);
        }
    }
}

/// [`weighted_sum_body`] for two queries at once: `o0` over the keys of `p0`, `o1` over those of
/// `p1` (the same keys and one more, the next query's own). Each output keeps its own chain.
#[inline(always)]
pub(crate) fn weighted_sum_pair_body(o0: &mut [f32], o1: &mut [f32], p0: &[f32], p1: &[f32], vh: &[f32], hs: usize) {
    weighted_sum_body(o0, p0, vh, hs);
    weighted_sum_body(o1, p1, vh, hs);
}

// ---------------------------------------------------------------------------------------------
// Packed matmul.

/// Reduction rows per cache block (GPT-2's C: c_attn and c_fc in one pass, mlp.c_proj in four).
/// Chosen by measurement (256, 512, 768, 1024, 4096 tried with `kvgpt bench`); the result's bits
/// do not depend on it.
const KC: usize = 768;
/// Rows per register tile: 6 x 16 accumulators fill 12 of the 16 AVX2 registers.
const MR: usize = 6;
/// Rows per cache group (a multiple of MR): the group's KC-slice of activations, 96 x 768 floats =
/// 288 KiB, stays in L2 while the task's panels pass over it.
const MC: usize = 96;

/// One panel row, widened to f32.
pub(crate) trait Source {
    fn row(&self, p: usize, i: usize) -> [f32; NR];
    /// The same row in registers of `L` (the same values, loaded and converted in registers).
    unsafe fn lanes<L: Lanes>(&self, p: usize, i: usize) -> L;
    /// Asks for the row to be brought into cache (a hint; a no-op unless overridden).
    #[inline(always)]
    fn prefetch(&self, _p: usize, _i: usize) {}
}

/// One panel row of 16 f32 lanes held in registers, as one ISA spells it (two AVX2 registers, one
/// AVX-512 register), with the few operations the tiles need. The tile bodies ([`Simd`]) are
/// written once over it; each implementation owns its tile shape for the few-rows path.
pub(crate) trait Lanes: Copy {
    /// Rows per pass of the few-rows path (2 or 8); three panels per pass either way.
    const FEW_MR: usize;
    /// Broadcast the R activations first, then stream the panels (fewer registers for the
    /// weights: AVX2's 16), or load the G panel rows first (AVX-512's 32 hold them).
    const BROADCAST_FIRST: bool;
    /// Prefetch the weight streams ahead in the wide passes (decode and the few-rows path).
    const PREFETCH: bool;
    /// Up to how many rows the few-rows path runs (see [`TileKernel::FEW_ROWS`]).
    const FEW_ROWS: usize;
    /// Keys per step of the attention scores (4, or 16 where a key's row is one register and 16
    /// of them reduce together, then 8 and 4).
    const KEYS: usize = 4;
    /// The same ISA's integer dot products (W8A8).
    type Int: IntLanes<F = Self>;
    unsafe fn zero() -> Self;
    unsafe fn splat(a: f32) -> Self;
    /// `a * b + acc`, fused, lane by lane.
    unsafe fn fma(a: Self, b: Self, acc: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    // Panel rows of each storage type at element `base` (callers keep `base + 16` in bounds).
    unsafe fn f32_row(d: &[f32], base: usize) -> Self;
    unsafe fn f16_row(d: &[u16], base: usize) -> Self;
    unsafe fn bf16_row(d: &[u16], base: usize) -> Self;
    unsafe fn q8_row(d: &[i8], base: usize, scale: f32) -> Self;
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
        x86::prefetch(self.d, self.base(p, i))
    }
}

/// What every tile of one packed matmul call shares: `out[T, N] = inp[T, K] @ W + bias`, with
/// `W`'s panels read through `src`.
pub(crate) struct Job<'a, S> {
    pub(crate) src: &'a S,
    /// `T * N` writable floats; each task writes only the columns of its own panels.
    pub(crate) out: *mut f32,
    pub(crate) inp: &'a [f32],
    pub(crate) bias: &'a [f32],
    pub(crate) t: usize,
    pub(crate) k: usize,
    pub(crate) n: usize,
}

impl<S> Clone for Job<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for Job<'_, S> {}

/// A register tile: rows `r0..r0+R` of the activations against panel `p`, reduction rows
/// `kc0..kc1`. Implementations differ only in how they spell the same FMA chains.
pub(crate) trait TileKernel {
    /// Up to this many rows take the few-rows path ([`TileKernel::few`], whole-reduction passes
    /// over groups of panels); more take `MR`-row tiles over `KC` blocks.
    const FEW_ROWS: usize = 16;

    /// One activation row (decode) against panels `p0..p1`, over the whole reduction.
    #[inline(always)]
    unsafe fn decode<S: Source>(j: &Job<S>, p0: usize, p1: usize) {
        let Job { k, .. } = *j;
        for p in p0..p1 {
            Self::tile::<S, 1>(j, p, 0, 0, k);
        }
    }

    unsafe fn tile<S: Source, const R: usize>(j: &Job<S>, p: usize, r0: usize, kc0: usize, kc1: usize);

    /// Rows `r0..r0+R` against the `G` whole panels `p..p+G` at once, over the whole reduction:
    /// `G` weight streams in flight, for the few rows of a batch of decode steps.
    ///
    /// # Safety
    /// As [`TileKernel::tile`]: `out` holds rows `r0..r0+R` of `n` columns, no other thread
    /// writes the columns of panels `p..p+G`, and those panels are whole (`(p+G)·NR <= n`).
    #[inline(always)]
    unsafe fn wide<S: Source, const R: usize, const G: usize>(j: &Job<S>, p: usize, r0: usize) {
        let Job { k, .. } = *j;
        for q in p..p + G {
            Self::tile::<S, R>(j, q, r0, 0, k);
        }
    }

    /// All `t` rows (a few: the decode steps of a batch) against panels `p0..p1`, over the whole
    /// reduction. By default two rows against three panels at a time ([`few_pairs`]).
    #[inline(always)]
    unsafe fn few<S: Source>(j: &Job<S>, p0: usize, p1: usize) {
        few_pairs::<Self, S>(j, p0, p1)
    }

    /// A W8A8 matmul's panels `p0..p1`: plain Rust by default.
    #[inline(always)]
    unsafe fn int8(j: &int8::Job, p0: usize, p1: usize) {
        int8::cols_portable(j, p0, p1)
    }
}

/// Plain Rust: the reference (and what non-x86 targets vectorize themselves).
pub(crate) struct Portable;

impl TileKernel for Portable {
    #[inline(always)]
    unsafe fn tile<S: Source, const R: usize>(j: &Job<S>, p: usize, r0: usize, kc0: usize, kc1: usize) {
        packed_tile::<S, R>(j, p, r0, kc0, kc1)
    }
}

/// The few-rows path two rows at a time: three panels per pass, so three weight streams are in
/// flight; the other rows find the group in cache.
#[inline(always)]
unsafe fn few_pairs<T: TileKernel + ?Sized, S: Source>(j: &Job<S>, p0: usize, p1: usize) {
    let Job { t, k, n, .. } = *j;
    let mut p = p0;
    while p + 3 <= p1 && (p + 3) * NR <= n {
        let mut r = 0;
        while r + 2 <= t {
            T::wide::<S, 2, 3>(j, p, r);
            r += 2;
        }
        if r < t {
            T::wide::<S, 1, 3>(j, p, r);
        }
        p += 3;
    }
    for q in p..p1 {
        let mut r = 0;
        while r + 2 <= t {
            T::tile::<S, 2>(j, q, r, 0, k);
            r += 2;
        }
        if r < t {
            T::tile::<S, 1>(j, q, r, 0, k);
        }
    }
}

/// The few-rows path eight rows at a time (all of a batch of 8 in one pass over the weights):
/// three panels per pass, then single panels, then the ragged last one.
#[inline(always)]
unsafe fn few_eights<T: TileKernel + ?Sized, S: Source>(j: &Job<S>, p0: usize, p1: usize) {
    let Job { t, k, n, .. } = *j;
    let mut p = p0;
    while p + 3 <= p1 && (p + 3) * NR <= n {
        rows_by_eight::<T, S, 3>(j, p);
        p += 3;
    }
    while p < p1 && (p + 1) * NR <= n {
        rows_by_eight::<T, S, 1>(j, p);
        p += 1;
    }
    for q in p..p1 {
        for r in 0..t {
            T::tile::<S, 1>(j, q, r, 0, k);
        }
    }
}

/// Rows `0..t` against the `G` whole panels `p..p+G`, eight rows per pass.
#[inline(always)]
unsafe fn rows_by_eight<T: TileKernel + ?Sized, S: Source, const G: usize>(j: &Job<S>, p: usize) {
    let Job { t, .. } = *j;
    let mut r = 0;
    while r + 8 <= t {
        T::wide::<S, 8, G>(j, p, r);
        r += 8;
    }
    match t - r {
        0 => {}
        1 => T::wide::<S, 1, G>(j, p, r),
        2 => T::wide::<S, 2, G>(j, p, r),
        3 => T::wide::<S, 3, G>(j, p, r),
        4 => T::wide::<S, 4, G>(j, p, r),
        5 => T::wide::<S, 5, G>(j, p, r),
        6 => T::wide::<S, 6, G>(j, p, r),
        _ => T::wide::<S, 7, G>(j, p, r),
    }
}

/// Panel rows ahead that the wide passes prefetch, where the lanes ask for it (24 rows = 24 cache
/// lines per stream). Measured on AVX-512: 8 sequences 4.7–5.1× → 5.7–5.95× one sequence's tok/s;
/// one sequence's decode (R = 1) 3–8% faster, six interleaved pairs.
const PREFETCH: usize = 24;

/// The SIMD tiles, written once over the lanes of an ISA: the same FMA chains as
/// [`packed_tile`], with the accumulators pinned in registers.
pub(crate) struct Simd<L>(std::marker::PhantomData<L>);

impl<L: Lanes> TileKernel for Simd<L> {
    const FEW_ROWS: usize = L::FEW_ROWS;

    /// Four panels at a time: four FMA chains and four weight streams in flight, so one token's
    /// matrix-vector product runs at the memory's pace, not the FMA latency's.
    #[inline(always)]
    unsafe fn decode<S: Source>(j: &Job<S>, p0: usize, p1: usize) {
        let Job { k, n, .. } = *j;
        const G: usize = 4;
        let mut p = p0;
        while p + G <= p1 && (p + G) * NR <= n {
            Self::wide::<S, 1, G>(j, p, 0);
            p += G;
        }
        for p in p..p1 {
            Self::tile::<S, 1>(j, p, 0, 0, k);
        }
    }

    #[inline(always)]
    unsafe fn tile<S: Source, const R: usize>(j: &Job<S>, p: usize, r0: usize, kc0: usize, kc1: usize) {
        let Job { src, out, inp, bias, k, n, .. } = *j;
        let c0 = p * NR;
        if NR.min(n - c0) < NR {
            // A partial panel: the portable tile handles the ragged edge.
            return packed_tile::<S, R>(j, p, r0, kc0, kc1);
        }
        let mut acc = [L::zero(); R];
        if kc0 > 0 {
            for (r, a) in acc.iter_mut().enumerate() {
                *a = L::load(out.add((r0 + r) * n + c0));
            }
        }
        let a_ptr: [*const f32; R] = std::array::from_fn(|r| inp[(r0 + r) * k..(r0 + r) * k + kc1].as_ptr());
        for i in kc0..kc1 {
            let b = src.lanes::<L>(p, i);
            for r in 0..R {
                // SAFETY (caller): i < kc1 and row r0+r holds kc1 elements from a_ptr[r].
                acc[r] = L::fma(L::splat(*a_ptr[r].add(i)), b, acc[r]);
            }
        }
        let last = kc1 == k;
        let b = if last { L::load(bias.as_ptr().add(c0)) } else { L::zero() };
        for (r, a) in acc.iter().enumerate() {
            let v = if last { L::add(*a, b) } else { *a };
            v.store(out.add((r0 + r) * n + c0));
        }
    }

    #[inline(always)]
    unsafe fn wide<S: Source, const R: usize, const G: usize>(j: &Job<S>, p: usize, r0: usize) {
        let Job { src, out, inp, bias, k, n, .. } = *j;
        let mut acc = [[L::zero(); R]; G]; // [panel][row]
        let a_ptr: [*const f32; R] = std::array::from_fn(|r| inp[(r0 + r) * k..(r0 + r + 1) * k].as_ptr());
        for i in 0..k {
            if L::PREFETCH && i + PREFETCH < k {
                for q in 0..G {
                    src.prefetch(p + q, i + PREFETCH);
                }
            }
            // SAFETY (caller): i < k and row r0+r holds k elements from a_ptr[r].
            if L::BROADCAST_FIRST {
                // Loops, not `array::from_fn`: its closure is not compiled with the caller's
                // target features, so the intrinsics in it would become calls.
                let mut a = [L::zero(); R];
                for (ar, p) in a.iter_mut().zip(&a_ptr) {
                    *ar = L::splat(*p.add(i));
                }
                for (q, accq) in acc.iter_mut().enumerate() {
                    let b = src.lanes::<L>(p + q, i);
                    for (c, &ar) in accq.iter_mut().zip(&a) {
                        *c = L::fma(ar, b, *c);
                    }
                }
            } else {
                let mut b = [L::zero(); G];
                for (q, bq) in b.iter_mut().enumerate() {
                    *bq = src.lanes::<L>(p + q, i);
                }
                for r in 0..R {
                    let a = L::splat(*a_ptr[r].add(i));
                    for (accq, &bq) in acc.iter_mut().zip(&b) {
                        accq[r] = L::fma(a, bq, accq[r]);
                    }
                }
            }
        }
        for (q, accq) in acc.iter().enumerate() {
            let c0 = (p + q) * NR;
            let b = L::load(bias.as_ptr().add(c0));
            for (r, c) in accq.iter().enumerate() {
                L::add(*c, b).store(out.add((r0 + r) * n + c0));
            }
        }
    }

    #[inline(always)]
    unsafe fn int8(j: &int8::Job, p0: usize, p1: usize) {
        int8::cols::<L::Int>(j, p0, p1)
    }

    #[inline(always)]
    unsafe fn few<S: Source>(j: &Job<S>, p0: usize, p1: usize) {
        if L::FEW_MR == 8 {
            few_eights::<Self, S>(j, p0, p1)
        } else {
            few_pairs::<Self, S>(j, p0, p1)
        }
    }
}

#[inline(always)]
unsafe fn packed_cols_body<T: TileKernel>(c: &Call, p0: usize, p1: usize) {
    let Call { out: SendPtr(out), inp, acts, w, bias, t } = *c;
    let (k, n) = (w.k(), w.n());
    match &w.data {
        Storage::F32(d) => {
            packed_generic::<_, T>(&Job { src: &Panels::<F32s>::new(d, &[], k), out, inp, bias, t, k, n }, p0, p1)
        }
        Storage::F16(d) => {
            packed_generic::<_, T>(&Job { src: &Panels::<F16s>::new(d, &[], k), out, inp, bias, t, k, n }, p0, p1)
        }
        Storage::Bf16(d) => {
            packed_generic::<_, T>(&Job { src: &Panels::<Bf16s>::new(d, &[], k), out, inp, bias, t, k, n }, p0, p1)
        }
        Storage::Q8 { q, scales } => {
            packed_generic::<_, T>(&Job { src: &Panels::<Q8s>::new(q, scales, k), out, inp, bias, t, k, n }, p0, p1)
        }
        Storage::W8A8(w) => T::int8(&int8::Job { w, a: acts, out, bias, t, n }, p0, p1),
    }
}

#[inline(always)]
unsafe fn packed_generic<S: Source, T: TileKernel>(j: &Job<S>, p0: usize, p1: usize) {
    let Job { t, k, .. } = *j;
    if t == 1 {
        return T::decode(j, p0, p1);
    }
    if t <= T::FEW_ROWS {
        return T::few(j, p0, p1);
    }
    let mut kc0 = 0;
    loop {
        let kc1 = (kc0 + KC).min(k);
        // Rows in groups of MC: a group's KC-slice of activations stays in L2 while every
        // panel of this task passes over it.
        let mut g0 = 0;
        while g0 < t {
            let g1 = (g0 + MC).min(t);
            for p in p0..p1 {
                let mut r = g0;
                while r + MR <= g1 {
                    T::tile::<S, MR>(j, p, r, kc0, kc1);
                    r += MR;
                }
                match g1 - r {
                    0 => {}
                    1 => T::tile::<S, 1>(j, p, r, kc0, kc1),
                    2 => T::tile::<S, 2>(j, p, r, kc0, kc1),
                    3 => T::tile::<S, 3>(j, p, r, kc0, kc1),
                    4 => T::tile::<S, 4>(j, p, r, kc0, kc1),
                    _ => T::tile::<S, 5>(j, p, r, kc0, kc1),
                }
            }
            g0 = g1;
        }
        if kc1 >= k {
            break;
        }
        kc0 = kc1;
    }
}

/// Rows `r0..r0+R`, panel `p`, reduction rows `kc0..kc1`: continues the FMA chains stored in
/// `out` (unless `kc0 == 0`), and adds the bias after the last block.
#[inline(always)]
unsafe fn packed_tile<S: Source, const R: usize>(j: &Job<S>, p: usize, r0: usize, kc0: usize, kc1: usize) {
    let Job { src, out, inp, bias, k, n, .. } = *j;
    let c0 = p * NR;
    let width = NR.min(n - c0);
    let mut acc = [[0.0f32; NR]; R];
    if kc0 > 0 {
        for (r, accr) in acc.iter_mut().enumerate() {
            for (j, a) in accr.iter_mut().enumerate().take(width) {
                // SAFETY (caller): row r0+r < t and column c0+j < n lie inside `out`.
                *a = *out.add((r0 + r) * n + c0 + j);
            }
        }
    }
    let rows: [&[f32]; R] = std::array::from_fn(|r| &inp[(r0 + r) * k + kc0..(r0 + r) * k + kc1]);
    for i in 0..kc1 - kc0 {
        let b = src.row(p, kc0 + i);
        for (accr, row) in acc.iter_mut().zip(&rows) {
            let a = row[i];
            for (x, bj) in accr.iter_mut().zip(&b) {
                *x = a.mul_add(*bj, *x);
            }
        }
    }
    let last = kc1 == k;
    for (r, accr) in acc.iter().enumerate() {
        for (j, a) in accr.iter().enumerate().take(width) {
            let v = if last { a + bias[c0 + j] } else { *a };
            // SAFETY (caller): as above.
            *out.add((r0 + r) * n + c0 + j) = v;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// x86-64 AVX2 + FMA (+ F16C) spelling of the packed tile: the same FMA chains as `packed_tile`,
// with the accumulators pinned in registers.

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{scores_body, weighted_sum_body, weighted_sum_pair_body, Lanes, NR};
    use crate::int8::x86::{Yi, Zi};
    use std::arch::x86_64::*;

    type V = __m256;

    /// A hint to bring `d[at]` into cache; any `at` is allowed.
    #[inline(always)]
    pub(crate) fn prefetch<T>(d: &[T], at: usize) {
        // SAFETY: a prefetch never faults and never changes memory, whatever the address; the
        // pointer is formed with wrapping arithmetic and never dereferenced.
        unsafe { _mm_prefetch(d.as_ptr().wrapping_add(at) as *const i8, _MM_HINT_T0) }
    }

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
                *w =
                    _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0b01_00_01_00), _mm512_shuffle_f32x4(x, y, 0b11_10_11_10));
            }
            // Width 4: [a 0-3 | b 0-3 | c 0-3 | d 0-3] + [a 4-7 | …] for keys 4i..4i+4.
            let mut w4 = [_mm512_setzero_ps(); 4];
            for (i, w) in w4.iter_mut().enumerate() {
                let (u, v) = (w8[2 * i], w8[2 * i + 1]);
                *w =
                    _mm512_add_ps(_mm512_shuffle_f32x4(u, v, 0b10_00_10_00), _mm512_shuffle_f32x4(u, v, 0b11_01_11_01));
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

    /// Attention scores of one query against keys `0..scores.len()` of one head, four keys at a
    /// time; each key's dot product keeps `dot_body`'s lanes and reduction order.
    #[inline(always)]
    pub(crate) unsafe fn scores_lanes<L: Halves>(scores: &mut [f32], q: &[f32], kh: &[f32], hs: usize, scale: f32) {
        let n = scores.len();
        if !hs.is_multiple_of(NR) || q.len() < hs || kh.len() < n * hs {
            return scores_body(scores, q, kh, hs, scale);
        }
        let (qp, kp) = (q.as_ptr(), kh.as_ptr());
        let mut j = 0;
        if L::KEYS == 16 {
            while j + 16 <= n {
                // SAFETY: keys j..j+16 < n lie inside kh (checked above), and j + 16 <= scores.len().
                let acc = dot_key_lanes::<L, 16>(qp, kp.add(j * hs), hs);
                L::reduce_keys16(&acc, scale, scores.as_mut_ptr().add(j));
                j += 16;
            }
        }
        if L::KEYS >= 8 {
            // Eight keys in flight: eight FMA chains, enough to cover the FMA latency in one
            // register per key.
            while j + 8 <= n {
                // SAFETY: keys j..j+8 < n lie inside kh (checked above), and j + 8 <= scores.len().
                let acc = dot_keys::<L, 8>(qp, kp.add(j * hs), hs);
                let (a, b): (&[[V; 2]; 4], &[[V; 2]; 4]) = (acc[..4].try_into().unwrap(), acc[4..].try_into().unwrap());
                let sc = _mm_set1_ps(scale);
                _mm_storeu_ps(scores.as_mut_ptr().add(j), _mm_mul_ps(reduce16x4(a), sc));
                _mm_storeu_ps(scores.as_mut_ptr().add(j + 4), _mm_mul_ps(reduce16x4(b), sc));
                j += 8;
            }
        }
        while j + 4 <= n {
            // SAFETY: keys j..j+4 < n lie inside kh (checked above), and j + 4 <= scores.len().
            let r = _mm_mul_ps(reduce16x4(&dot_keys::<L, 4>(qp, kp.add(j * hs), hs)), _mm_set1_ps(scale));
            _mm_storeu_ps(scores.as_mut_ptr().add(j), r);
            j += 4;
        }
        for (x, s) in scores.iter_mut().enumerate().skip(j) {
            // SAFETY: key x < n lies inside kh.
            let [[lo, hi]] = dot_keys::<L, 1>(qp, kp.add(x * hs), hs);
            *s = reduce16(lo, hi) * scale;
        }
    }

    /// The 16-lane partial sums of `q · k` for `G` consecutive keys of `hs` floats at `k`.
    #[inline(always)]
    unsafe fn dot_keys<L: Halves, const G: usize>(q: *const f32, k: *const f32, hs: usize) -> [[V; 2]; G] {
        let acc = dot_key_lanes::<L, G>(q, k, hs);
        // A loop, not `array::map`: its closure would not get the caller's target features.
        let mut out = [[_mm256_setzero_ps(); 2]; G];
        for (o, a) in out.iter_mut().zip(acc) {
            *o = a.halves();
        }
        out
    }

    /// The same partial sums, one row of lanes per key.
    #[inline(always)]
    unsafe fn dot_key_lanes<L: Lanes, const G: usize>(q: *const f32, k: *const f32, hs: usize) -> [L; G] {
        let mut acc = [L::zero(); G];
        let mut c = 0;
        while c < hs {
            // SAFETY (caller): c + 16 <= hs floats of q, and of each of the G keys.
            let a = L::load(q.add(c));
            for (x, accx) in acc.iter_mut().enumerate() {
                *accx = L::fma(a, L::load(k.add(x * hs + c)), *accx);
            }
            c += NR;
        }
        acc
    }

    /// `out = Σ_j probs[j] · v_j` over one head of 64 outputs held in four rows of lanes; the same
    /// chain per output as `weighted_sum_body`.
    #[inline(always)]
    pub(crate) unsafe fn weighted_sum_lanes<L: Lanes>(out: &mut [f32], probs: &[f32], vh: &[f32], hs: usize) {
        if hs != 64 || out.len() < 64 || vh.len() < probs.len() * 64 {
            return weighted_sum_body(out, probs, vh, hs);
        }
        let mut acc = [L::zero(); 4];
        for (j, &pj) in probs.iter().enumerate() {
            let a = L::splat(pj);
            // SAFETY: row j of vh holds 64 floats (checked above).
            let v = vh.as_ptr().add(j * 64);
            for (d, accd) in acc.iter_mut().enumerate() {
                *accd = L::fma(a, L::load(v.add(NR * d)), *accd);
            }
        }
        for (d, accd) in acc.iter().enumerate() {
            accd.store(out.as_mut_ptr().add(NR * d));
        }
    }

    /// [`weighted_sum_lanes`] for two queries that share their keys but the second's last: eight
    /// FMA chains in flight instead of four, and each value row loaded once for both.
    #[inline(always)]
    pub(crate) unsafe fn weighted_sum_pair_lanes<L: Lanes>(
        o0: &mut [f32],
        o1: &mut [f32],
        p0: &[f32],
        p1: &[f32],
        vh: &[f32],
        hs: usize,
    ) {
        let n = p0.len();
        if hs != 64 || o0.len() < 64 || o1.len() < 64 || p1.len() != n + 1 || vh.len() < (n + 1) * 64 {
            return weighted_sum_pair_body(o0, o1, p0, p1, vh, hs);
        }
        let (mut a0, mut a1) = ([L::zero(); 4], [L::zero(); 4]);
        for j in 0..n {
            let (x0, x1) = (L::splat(p0[j]), L::splat(p1[j]));
            // SAFETY: row j of vh holds 64 floats (checked above).
            let v = vh.as_ptr().add(j * 64);
            for d in 0..4 {
                let vd = L::load(v.add(NR * d));
                a0[d] = L::fma(x0, vd, a0[d]);
                a1[d] = L::fma(x1, vd, a1[d]);
            }
        }
        let x1 = L::splat(p1[n]);
        // SAFETY: row n of vh holds 64 floats (checked above).
        let v = vh.as_ptr().add(n * 64);
        for (d, a) in a1.iter_mut().enumerate() {
            *a = L::fma(x1, L::load(v.add(NR * d)), *a);
        }
        for d in 0..4 {
            a0[d].store(o0.as_mut_ptr().add(NR * d));
            a1[d].store(o1.as_mut_ptr().add(NR * d));
        }
    }

    /// Sums the 16 lanes of (lo, hi) in `reduce_lanes` order.
    /// [`reduce16`] of four (lo, hi) pairs at once, the same additions done in vectors:
    /// `[r0, r1, r2, r3]`.
    #[inline(always)]
    unsafe fn reduce16x4(acc: &[[V; 2]; 4]) -> __m128 {
        let mut a = [_mm256_setzero_ps(); 4]; // a[l] = acc[l] + acc[l+8] (a loop: see `wide`)
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

    #[inline(always)]
    unsafe fn reduce16(lo: V, hi: V) -> f32 {
        let mut a = [0.0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), _mm256_add_ps(lo, hi)); // acc[l] + acc[l+8]
        let b = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
        let c = [b[0] + b[2], b[1] + b[3]];
        c[0] + c[1]
    }

    // The loaders read 16 values at `base`; callers guarantee `base + 16 <= d.len()` (panel and
    // row indices are always inside the matrix), checked in debug builds. AVX2 and AVX-512 use
    // the same conversions, so the same values.

    /// One panel row in two AVX2 registers (lanes 0–7, 8–15).
    #[derive(Clone, Copy)]
    pub(crate) struct Y(pub(crate) V, pub(crate) V);

    impl Lanes for Y {
        const FEW_MR: usize = 2; // 2 rows × 3 panels × 2 registers = 12 accumulators of 16
        const BROADCAST_FIRST: bool = true;
        const PREFETCH: bool = false; // measured no faster on AVX2
        const FEW_ROWS: usize = 16;
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

    /// One panel row in one AVX-512 register.
    #[derive(Clone, Copy)]
    pub(crate) struct Z(pub(crate) __m512);

    impl Lanes for Z {
        // 8 rows × 3 panels = 24 accumulators, three weight vectors and a broadcast within the
        // 32 registers: a batch of 8 reads each weight once per step.
        const FEW_MR: usize = 8;
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
}
