//! Attention, its one home: the public [`attention_blocks`] over K/V held in blocks of positions
//! (a block table's, or one contiguous cache's: [`attention`]), its [`AttnDims`] and
//! [`KvBlocks`]; the scores (one query against a head's keys), the weighted sums of the value rows
//! (one query, or two sharing the rows); their x86 inner loops over the lanes of either ISA
//! (`x86.rs`), each keeping its scalar body's chains and reduction order (the scalar bodies are
//! the reference tests/attention.rs tests every path against).
//!
//! Blocks change no bit: a key's score is its own dot product whichever keys share the call, and
//! a weighted sum carries its accumulators from one block to the next (stored and loaded back
//! exactly), so every output is the same chain of fused multiply-adds in position order whatever
//! the block size and wherever the blocks are.

use crate::dispatch::kernels;
use crate::isa::Isa;
use crate::kv::{Bf16s, F16s, F32s, KvType, Q8s, RowFormat};
use crate::par::{SendPtr, PAR_MIN_WORK};
use crate::rows::{reduce_lanes, softmax, LANES};
use rayon::prelude::*;

// One dispatch per query and head: the loop over the blocks, and the reads of the block table,
// are inlined into each ISA's copy, so a block costs its kernel's work and a few loads.
kernels! {
    [] fn block_scores<K: KvBlocks>(s: &mut [f32], q: &[f32], kv: &K, h: usize, hs: usize, scale: f32)
        = x86::block_scores_lanes::<L, K>, block_scores_body;
    [] fn block_sums<K: KvBlocks>(out: &mut [f32], probs: &[f32], kv: &K, h: usize, hs: usize)
        = x86::block_sums_lanes::<L, K>, block_sums_body;
    [] fn block_sums_pair<K: KvBlocks>(o0: &mut [f32], o1: &mut [f32], p0: &[f32], p1: &[f32], kv: &K, h: usize, hs: usize)
        = x86::block_sums_pair_lanes::<L, K>, block_sums_pair_body;
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
    /// Positions the K/V may hold (a contiguous cache's row stride per head).
    pub t_max: usize,
    /// Multiplier of the scores (`1/√HS`, possibly divided by the layer index).
    pub scale: f32,
}

/// Where attention reads one layer's K and V: in blocks of [`KvBlocks::block`] positions, held as
/// [`KvBlocks::kv_type`]. Head `h`'s K rows of logical block `j` (positions `j·B..(j+1)·B`) are
/// `[B, W]` words, `W = kv_type().row_words(HS)` (`HS` for f32), and so are its V rows; a block
/// past the last filled position need not exist.
pub trait KvBlocks: Sync {
    /// Positions per block (`B`).
    fn block(&self) -> usize;
    /// Head `h`'s K rows of logical block `j`, `[B, W]` (at least the filled rows).
    fn k(&self, j: usize, h: usize) -> &[f32];
    /// Head `h`'s V rows of logical block `j`.
    fn v(&self, j: usize, h: usize) -> &[f32];
    /// How the rows are held (f32 unless said otherwise).
    fn kv_type(&self) -> KvType {
        KvType::F32
    }
}

/// Calls `$f::<…, F>($args)` with the row format of `$ty`: one copy of the loop per type, the
/// type matched once per call.
macro_rules! by_format {
    ($ty:expr, $f:ident :: < $($g:ty),* >, ($($a:expr),*)) => {
        match $ty {
            KvType::F32 => $f::<$($g,)* F32s>($($a),*),
            KvType::F16 => $f::<$($g,)* F16s>($($a),*),
            KvType::Bf16 => $f::<$($g,)* Bf16s>($($a),*),
            KvType::Q8_0 => $f::<$($g,)* Q8s>($($a),*),
        }
    };
}

/// One contiguous cache, `[NH, t_max, HS]` for K and for V: a single block of `t_max` positions.
pub(crate) struct Contiguous<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub t_max: usize,
    pub hs: usize,
}

impl KvBlocks for Contiguous<'_> {
    fn block(&self) -> usize {
        self.t_max
    }
    fn k(&self, _j: usize, h: usize) -> &[f32] {
        &self.k[h * self.t_max * self.hs..(h + 1) * self.t_max * self.hs]
    }
    fn v(&self, _j: usize, h: usize) -> &[f32] {
        &self.v[h * self.t_max * self.hs..(h + 1) * self.t_max * self.hs]
    }
}

/// [`attention_blocks`] over one contiguous cache: `k_cache`, `v_cache` are `[NH, t_max, HS]`.
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
pub fn attention(
    isa: Isa,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
    q: &[f32],
    q_stride: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    scratch: &mut [f32],
    d: AttnDims,
) {
    assert!(k_cache.len() >= d.nh * d.t_max * d.hs && v_cache.len() >= d.nh * d.t_max * d.hs);
    let kv = Contiguous { k: k_cache, v: v_cache, t_max: d.t_max, hs: d.hs };
    attention_blocks(isa, out, probs, q, q_stride, &kv, scratch, d)
}

/// Causal multi-head attention of `T` new queries over K/V holding `P + T` positions.
///
/// - `out`: `[T, C]` with `C = NH*HS`, head `h` written to columns `h*HS..(h+1)*HS`.
/// - `q`: `[T, q_stride]`, head `h` of query `i` at `q[i*q_stride + h*HS..]` (the fused c_attn output).
/// - `kv`: positions `0..P+T` filled, in blocks.
/// - `scratch`: at least `2 * NH * (P + T)` floats (two score rows per head).
/// - `probs`: when given, `[NH, T, P+T]` receives the softmax weights (0 above the diagonal).
///
/// Query at position `pos`: `s_j = dot(q, k_j) * scale` for `j <= pos`, `a = softmax(s)`,
/// `out = Σ_j a_j v_j` accumulated in `j` order. Nothing depends on `T`, `P`, the block size or
/// where the blocks are, only on `pos`.
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
pub fn attention_blocks<K: KvBlocks>(
    isa: Isa,
    out: &mut [f32],
    mut probs: Option<&mut [f32]>,
    q: &[f32],
    q_stride: usize,
    kv: &K,
    scratch: &mut [f32],
    d: AttnDims,
) {
    let AttnDims { t, p, nh, hs, t_max, scale } = d;
    if t == 0 {
        return;
    }
    let c = nh * hs;
    let n_kv = p + t;
    assert!(n_kv <= t_max, "attention: {n_kv} positions exceed the cache's {t_max}");
    assert!(kv.block() > 0, "attention: blocks of no positions");
    assert!(out.len() >= t * c && q.len() >= (t - 1) * q_stride + c);
    assert!(scratch.len() >= 2 * nh * n_kv, "attention: scratch needs 2 × NH × (P + T) floats");
    if let Some(pr) = probs.as_deref() {
        assert!(pr.len() >= nh * t * n_kv);
    }
    let out_ptr = SendPtr(out.as_mut_ptr());
    let probs_ptr = SendPtr(probs.as_deref_mut().map_or(std::ptr::null_mut(), |p| p.as_mut_ptr()));
    let want_probs = probs.is_some();
    let head = |h: usize, rows: &mut [f32]| {
        let (out_ptr, probs_ptr) = (out_ptr, probs_ptr); // the Send wrappers, not their fields
        let (row0, row1) = rows.split_at_mut(n_kv);
        // Queries two at a time where there are two: their weighted sums share the value rows.
        let mut i = 0;
        while i < t {
            let pair = i + 1 < t;
            let n = p + i + 1; // keys of query i: positions 0..=p+i
            let qrow = |i: usize| &q[i * q_stride + h * hs..i * q_stride + (h + 1) * hs];
            let s0 = &mut row0[..n];
            block_scores(isa, s0, qrow(i), kv, h, hs, scale);
            softmax(isa, s0);
            // SAFETY: head h writes only columns h*HS..(h+1)*HS of rows i and i+1 of `out` (t*c
            // floats, asserted above); no other task touches them.
            let orow = |i: usize| unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(i * c + h * hs), hs) };
            if pair {
                let s1 = &mut row1[..n + 1];
                block_scores(isa, s1, qrow(i + 1), kv, h, hs, scale);
                softmax(isa, s1);
                block_sums_pair(isa, orow(i), orow(i + 1), s0, s1, kv, h, hs);
            } else {
                block_sums(isa, orow(i), s0, kv, h, hs);
            }
            if want_probs {
                for (r, s) in [(i, &*s0), (i + 1, &*row1)].into_iter().take(1 + usize::from(pair)) {
                    let m = p + r + 1;
                    // SAFETY: head h writes only its own [T, P+T] slab of `probs` (nh*t*n_kv
                    // floats, asserted above).
                    let prow = unsafe { std::slice::from_raw_parts_mut(probs_ptr.0.add((h * t + r) * n_kv), n_kv) };
                    prow[..m].copy_from_slice(&s[..m]);
                    prow[m..].fill(0.0);
                }
            }
            i += 1 + usize::from(pair);
        }
    };
    let scratch = &mut scratch[..2 * nh * n_kv];
    if rayon::current_num_threads() > 1 && t * n_kv * hs * nh >= PAR_MIN_WORK / 4 {
        scratch.par_chunks_mut(2 * n_kv).enumerate().for_each(|(h, rows)| head(h, rows));
    } else {
        scratch.chunks_mut(2 * n_kv).enumerate().for_each(|(h, rows)| head(h, rows));
    }
}

/// The scores of one query against keys `0..s.len()` of head `h`, block by block.
#[inline(always)]
pub(crate) fn block_scores_body(s: &mut [f32], q: &[f32], kv: &impl KvBlocks, h: usize, hs: usize, scale: f32) {
    by_format!(kv.kv_type(), block_scores_as::<_>, (s, q, kv, h, hs, scale))
}

#[inline(always)]
fn block_scores_as<K: KvBlocks, F: RowFormat>(s: &mut [f32], q: &[f32], kv: &K, h: usize, hs: usize, scale: f32) {
    for (j, chunk) in s.chunks_mut(kv.block()).enumerate() {
        scores_body::<F>(chunk, q, kv.k(j, h), hs, scale);
    }
}

/// `out = Σ_j probs[j] · v_j` over head `h`'s value rows, block by block, one chain per output.
#[inline(always)]
pub(crate) fn block_sums_body(out: &mut [f32], probs: &[f32], kv: &impl KvBlocks, h: usize, hs: usize) {
    by_format!(kv.kv_type(), block_sums_as::<_>, (out, probs, kv, h, hs))
}

#[inline(always)]
fn block_sums_as<K: KvBlocks, F: RowFormat>(out: &mut [f32], probs: &[f32], kv: &K, h: usize, hs: usize) {
    out.fill(0.0);
    for (j, chunk) in probs.chunks(kv.block()).enumerate() {
        weighted_sum_body::<F>(out, chunk, kv.v(j, h), hs);
    }
}

/// [`block_sums_body`] of two queries at once: `p1` holds the weights of the keys of `p0` and
/// one more (the second query's own), so every block but the last gives both the same rows.
#[inline(always)]
pub(crate) fn block_sums_pair_body(
    o0: &mut [f32],
    o1: &mut [f32],
    p0: &[f32],
    p1: &[f32],
    kv: &impl KvBlocks,
    h: usize,
    hs: usize,
) {
    by_format!(kv.kv_type(), block_sums_pair_as::<_>, (o0, o1, p0, p1, kv, h, hs))
}

#[inline(always)]
fn block_sums_pair_as<K: KvBlocks, F: RowFormat>(
    o0: &mut [f32],
    o1: &mut [f32],
    p0: &[f32],
    p1: &[f32],
    kv: &K,
    h: usize,
    hs: usize,
) {
    let b = kv.block();
    o0.fill(0.0);
    o1.fill(0.0);
    for (j, c1) in p1.chunks(b).enumerate() {
        let vh = kv.v(j, h);
        weighted_sum_body::<F>(o0, pair_chunk(p0, j, b), vh, hs);
        weighted_sum_body::<F>(o1, c1, vh, hs);
    }
}

/// Block `j` of `p0`'s weights (shorter, or empty, where `p0` ends).
#[inline(always)]
pub(crate) fn pair_chunk(p0: &[f32], j: usize, b: usize) -> &[f32] {
    &p0[(j * b).min(p0.len())..((j + 1) * b).min(p0.len())]
}

/// The pre-softmax scores of [`attention`] for the same inputs, with the causal mask as −∞:
/// `out` (`[NH, T, P+T]`) gets `dot(q_i, k_j) * scale` for `j <= P + i` and `-inf` above. The
/// same kernel as [`attention`]'s, so `softmax` of a row is the weights it used, bit for bit.
/// For views; allocates nothing and runs on the calling thread.
pub fn attention_scores(isa: Isa, out: &mut [f32], q: &[f32], q_stride: usize, k_cache: &[f32], d: AttnDims) {
    assert!(k_cache.len() >= d.nh * d.t_max * d.hs);
    let kv = Contiguous { k: k_cache, v: k_cache, t_max: d.t_max, hs: d.hs };
    attention_scores_blocks(isa, out, q, q_stride, &kv, d)
}

/// [`attention_scores`] over K/V in blocks.
pub fn attention_scores_blocks<K: KvBlocks>(
    isa: Isa,
    out: &mut [f32],
    q: &[f32],
    q_stride: usize,
    kv: &K,
    d: AttnDims,
) {
    let AttnDims { t, p, nh, hs, t_max, scale } = d;
    let n_kv = p + t;
    assert!(n_kv <= t_max && out.len() >= nh * t * n_kv);
    assert!(t == 0 || q.len() >= (t - 1) * q_stride + nh * hs);
    for h in 0..nh {
        for i in 0..t {
            let row = &mut out[(h * t + i) * n_kv..(h * t + i + 1) * n_kv];
            let (seen, masked) = row.split_at_mut(p + i + 1);
            block_scores(isa, seen, &q[i * q_stride + h * hs..i * q_stride + (h + 1) * hs], kv, h, hs, scale);
            masked.fill(f32::NEG_INFINITY);
        }
    }
}

/// Scores of one query against the rows of `kh` (`[n, W]` words of format `F`).
#[inline(always)]
pub(crate) fn scores_body<F: RowFormat>(scores: &mut [f32], q: &[f32], kh: &[f32], hs: usize, scale: f32) {
    let w = F::words(hs);
    for (j, s) in scores.iter_mut().enumerate() {
        *s = dot_row::<F>(q, &kh[j * w..(j + 1) * w], hs) * scale;
    }
}

/// `q · k` of one row of format `F`: value `i` goes to lane `i mod 16` in order, then the lanes
/// are reduced as every sum is (`reduce_lanes`).
#[inline(always)]
fn dot_row<F: RowFormat>(q: &[f32], k: &[f32], hs: usize) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (i, &x) in q[..hs].iter().enumerate() {
        acc[i % LANES] = x.mul_add(F::get(k, i), acc[i % LANES]);
    }
    reduce_lanes(acc)
}

/// `out += Σ_j probs[j] · v_j`, one fused multiply-add chain per output in `j` order.
#[inline(always)]
pub(crate) fn weighted_sum_body<F: RowFormat>(out: &mut [f32], probs: &[f32], vh: &[f32], hs: usize) {
    let w = F::words(hs);
    for (j, &a) in probs.iter().enumerate() {
        let vj = &vh[j * w..(j + 1) * w];
        for (d, o) in out[..hs].iter_mut().enumerate() {
            *o = a.mul_add(F::get(vj, d), *o);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;
