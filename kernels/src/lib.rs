//! Hand-written numeric kernels for kvgpt.
//!
//! Conventions (after llm.c): plain functions over flat row-major `f32` buffers, outputs first,
//! dimensions last, one dimension vocabulary: `T` tokens in this call, `P` tokens already in the
//! cache, `C` channels, `NH` heads, `HS` head size, `K` reduction length, `N` output columns.
//!
//! Exactness rule: every output element is reduced in one fixed order that depends only on the
//! reduction length, never on how many rows are processed, how the work is split between threads,
//! or which instruction set runs it. Every product-sum is a chain of fused multiply-adds, so the
//! scalar path (`f32::mul_add`, correctly rounded) and the SIMD paths give the same bits. That is
//! what makes cached and uncached decoding bit-identical in the engine.
//!
//! Instruction sets: each kernel has one body (`#[inline(always)]`), compiled once plainly (the
//! scalar reference, always present) and once inside a thin `#[target_feature]` wrapper. The
//! [`Isa`] is detected once by the caller and passed in; tests run every path against the scalar one.

mod aligned;
mod int8;
mod math;
mod packed;
mod simd;

pub use int8::QuantizedActs;
pub use math::{exp_approx, gelu_new_scalar, tanh_approx};
pub use packed::{
    bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, PackedMatrix, WeightType, NR, Q8_BLOCK,
    W8_BLOCK,
};

use rayon::prelude::*;

/// Which compiled copy of the kernel bodies runs. Only [`Isa::scalar`], [`Isa::detect`] and
/// [`Isa::available`] make one, so a SIMD path is only ever chosen on a CPU that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa(pub(crate) Kind);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    /// AVX-512 F, BW, VL and VNNI on top of AVX2 + FMA + F16C: the packed matmul and attention
    /// in 512-bit registers, W8A8 with `vpdpbusd`; the other kernels are the AVX2 bodies compiled
    /// with these features. (An AVX-512 CPU without VNNI, as Skylake-SP, runs the AVX2 path.)
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The plain compilation: the reference every other path is tested against. On aarch64 it is
    /// already NEON code, since NEON and FMA are part of the baseline there.
    pub fn scalar() -> Isa {
        Isa(Kind::Scalar)
    }

    /// The best instruction set this CPU supports. Call once and keep the value.
    pub fn detect() -> Isa {
        *Isa::available().last().expect("the scalar path is always available")
    }

    /// Every instruction set usable on this CPU, the scalar reference first, the best last.
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::scalar()];
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                v.push(Isa(Kind::Avx2Fma));
                if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                    v.push(Isa(Kind::Avx512));
                }
            }
        }
        v
    }

    /// The available instruction set called `name` (as [`Isa::name`] spells it).
    pub fn by_name(name: &str) -> Option<Isa> {
        Isa::available().into_iter().find(|i| i.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            Kind::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2Fma => "avx2+fma",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => "avx512",
        }
    }
}

/// Below this many multiply-adds a kernel runs on the calling thread.
pub(crate) const PAR_MIN_WORK: usize = 1 << 16;
/// Output columns per parallel task (a multiple of every tile width).
const PAR_COLS: usize = 64;

/// A raw pointer that may be sent to other threads; each task writes a disjoint region.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: used only to hand disjoint sub-regions of one `&mut [f32]` to rayon tasks that all end
// before the borrow does.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer is only read (copied) from shared references.
unsafe impl Sync for SendPtr {}

/// `out[T, N] = inp[T, K] @ w[K, N] + bias[N]` — GPT-2's Conv1D, weights stored `[in, out]`.
///
/// Each element: `acc = 0; for i in 0..K { acc = fma(inp[t, i], w[i, n], acc) }; out = acc + bias`.
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
pub fn matmul(isa: Isa, out: &mut [f32], inp: &[f32], w: &[f32], bias: &[f32], t: usize, k: usize, n: usize) {
    assert!(out.len() >= t * n && inp.len() >= t * k && w.len() >= k * n && bias.len() >= n);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let run = |c0: usize, c1: usize| {
        let p = out_ptr;
        // SAFETY: tasks get disjoint column ranges [c0, c1) of `out`; `out` holds t*n floats
        // (asserted above) and outlives every task.
        unsafe { simd::matmul_cols(isa, p.0, inp, w, bias, t, k, n, c0, c1) }
    };
    if t * k * n < PAR_MIN_WORK || rayon::current_num_threads() == 1 || n <= PAR_COLS {
        run(0, n);
    } else {
        let chunks = n.div_ceil(PAR_COLS);
        (0..chunks).into_par_iter().for_each(|c| run(c * PAR_COLS, ((c + 1) * PAR_COLS).min(n)));
    }
}

/// `out[T, N] = inp[T, K] @ W + bias` over a packed `W`: the same bits as [`crate::matmul`] on
/// `W.unpack()`, except for W8A8, whose activations are quantized too (into `acts`, which the
/// caller keeps so that decoding does not allocate); see the `int8` module for its arithmetic.
pub fn matmul_packed(
    isa: Isa,
    out: &mut [f32],
    inp: &[f32],
    w: &PackedMatrix,
    bias: &[f32],
    t: usize,
    acts: &mut QuantizedActs,
) {
    let (k, n, panels) = (w.k(), w.n(), w.panels());
    assert!(out.len() >= t * n && inp.len() >= t * k && bias.len() >= n);
    if t == 0 {
        return;
    }
    if let packed::Storage::W8A8(w8) = &w.data {
        acts.fill(isa, inp, t, k, w8.kp);
    }
    let call = simd::Call { out: SendPtr(out.as_mut_ptr()), inp, acts, w, bias, t };
    let run = |p0: usize, p1: usize| {
        // SAFETY: tasks get disjoint panel ranges, i.e. disjoint column ranges of `out`, which
        // holds t*n floats (asserted above) and outlives every task.
        unsafe { simd::packed_cols(isa, &call, p0, p1) }
    };
    // Panels per task. Decode: four (the tile's width). Prefill: few, large tasks (about four per
    // thread), since every task streams all the activations once per KC block.
    let per = if t == 1 { 4 } else { panels.div_ceil(4 * rayon::current_num_threads()).max(2) };
    if t * k * n < PAR_MIN_WORK || rayon::current_num_threads() == 1 || panels <= per {
        run(0, panels);
    } else {
        (0..panels.div_ceil(per)).into_par_iter().for_each(|c| run(c * per, ((c + 1) * per).min(panels)));
    }
}

/// The sum of `a` in the engine's fixed order (16 lanes, then a fixed pairwise sum).
pub fn sum(isa: Isa, a: &[f32]) -> f32 {
    simd::sum(isa, a)
}

/// The SIMD-related features this CPU reports (for benchmark headers).
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $( if std::is_x86_feature_detected!($f) { v.push($f); } )* };
        }
        probe!("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni", "avx512bf16", "avx512fp16");
    }
    #[cfg(target_arch = "aarch64")]
    {
        v.push("neon");
    }
    v
}

/// `out[T, C] = (inp - mean) / sqrt(var + eps) * weight + bias`, per row, biased variance.
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
pub fn layernorm(isa: Isa, out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], t: usize, c: usize, eps: f32) {
    assert!(out.len() >= t * c && inp.len() >= t * c && weight.len() >= c && bias.len() >= c);
    for r in 0..t {
        simd::layernorm_row(isa, &mut out[r * c..(r + 1) * c], &inp[r * c..(r + 1) * c], weight, bias, eps);
    }
}

/// In place: `x = 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` (GPT-2's `gelu_new`).
pub fn gelu_new(isa: Isa, x: &mut [f32]) {
    if x.len() >= PAR_MIN_WORK / 4 && rayon::current_num_threads() > 1 {
        x.par_chunks_mut(4096).for_each(|ch| simd::gelu(isa, ch));
    } else {
        simd::gelu(isa, x);
    }
}

/// In place residual: `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    assert!(x.len() <= y.len());
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// In place softmax over the whole slice (max-subtracted, `exp` of [`exp_approx`]).
pub fn softmax_inplace(isa: Isa, x: &mut [f32]) {
    simd::softmax(isa, x);
}

/// The sizes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    /// Tokens in this call (queries).
    pub t: usize,
    /// Tokens already in the cache before this call; query `i` sits at position `p + i`.
    pub p: usize,
    /// Heads.
    pub nh: usize,
    /// Head size.
    pub hs: usize,
    /// Capacity of the cache in positions (its row stride per head).
    pub t_max: usize,
    /// Multiplier of the scores (`1/√HS`, possibly divided by the layer index).
    pub scale: f32,
}

/// Causal multi-head attention of `T` new queries over a KV cache holding `P + T` positions.
///
/// - `out`: `[T, C]` with `C = NH*HS`, head `h` written to columns `h*HS..(h+1)*HS`.
/// - `q`: `[T, q_stride]`, head `h` of query `i` at `q[i*q_stride + h*HS..]` (the fused c_attn output).
/// - `k_cache`, `v_cache`: `[NH, t_max, HS]`, positions `0..P+T` filled.
/// - `scratch`: at least `2 * NH * (P + T)` floats (two score rows per head).
/// - `probs`: when given, `[NH, T, P+T]` receives the softmax weights (0 above the diagonal).
///
/// Query at position `pos`: `s_j = dot(q, k_j) * scale` for `j <= pos`, `a = softmax(s)`,
/// `out = Σ_j a_j v_j` accumulated in `j` order. Nothing depends on `T` or `P`, only on `pos`.
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
pub fn attention(
    isa: Isa,
    out: &mut [f32],
    mut probs: Option<&mut [f32]>,
    q: &[f32],
    q_stride: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    scratch: &mut [f32],
    d: AttnDims,
) {
    let AttnDims { t, p, nh, hs, t_max, scale } = d;
    if t == 0 {
        return;
    }
    let c = nh * hs;
    let kv = p + t;
    assert!(kv <= t_max, "attention: {kv} positions exceed the cache's {t_max}");
    assert!(out.len() >= t * c && q.len() >= (t - 1) * q_stride + c);
    assert!(k_cache.len() >= nh * t_max * hs && v_cache.len() >= nh * t_max * hs);
    assert!(scratch.len() >= 2 * nh * kv, "attention: scratch needs 2 × NH × (P + T) floats");
    if let Some(pr) = probs.as_deref() {
        assert!(pr.len() >= nh * t * kv);
    }
    let out_ptr = SendPtr(out.as_mut_ptr());
    let probs_ptr = SendPtr(probs.as_deref_mut().map_or(std::ptr::null_mut(), |p| p.as_mut_ptr()));
    let want_probs = probs.is_some();
    let head = |h: usize, rows: &mut [f32]| {
        let (out_ptr, probs_ptr) = (out_ptr, probs_ptr); // the Send wrappers, not their fields
        let kh = &k_cache[h * t_max * hs..];
        let vh = &v_cache[h * t_max * hs..];
        let (row0, row1) = rows.split_at_mut(kv);
        // Queries two at a time where there are two: their weighted sums share the value rows.
        let mut i = 0;
        while i < t {
            let pair = i + 1 < t;
            let n = p + i + 1; // keys of query i: positions 0..=p+i
            let qrow = |i: usize| &q[i * q_stride + h * hs..i * q_stride + (h + 1) * hs];
            let s0 = &mut row0[..n];
            simd::scores(isa, s0, qrow(i), kh, hs, scale);
            simd::softmax(isa, s0);
            // SAFETY: head h writes only columns h*HS..(h+1)*HS of rows i and i+1 of `out` (t*c
            // floats, asserted above); no other task touches them.
            let orow = |i: usize| unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(i * c + h * hs), hs) };
            if pair {
                let s1 = &mut row1[..n + 1];
                simd::scores(isa, s1, qrow(i + 1), kh, hs, scale);
                simd::softmax(isa, s1);
                simd::weighted_sum_pair(isa, orow(i), orow(i + 1), s0, s1, vh, hs);
            } else {
                simd::weighted_sum(isa, orow(i), s0, vh, hs);
            }
            if want_probs {
                for (r, s) in [(i, &*s0), (i + 1, &*row1)].into_iter().take(1 + usize::from(pair)) {
                    let m = p + r + 1;
                    // SAFETY: head h writes only its own [T, kv] slab of `probs` (nh*t*kv floats,
                    // asserted above).
                    let prow = unsafe { std::slice::from_raw_parts_mut(probs_ptr.0.add((h * t + r) * kv), kv) };
                    prow[..m].copy_from_slice(&s[..m]);
                    prow[m..].fill(0.0);
                }
            }
            i += 1 + usize::from(pair);
        }
    };
    let scratch = &mut scratch[..2 * nh * kv];
    if rayon::current_num_threads() > 1 && t * kv * hs * nh >= PAR_MIN_WORK / 4 {
        scratch.par_chunks_mut(2 * kv).enumerate().for_each(|(h, rows)| head(h, rows));
    } else {
        scratch.chunks_mut(2 * kv).enumerate().for_each(|(h, rows)| head(h, rows));
    }
}
