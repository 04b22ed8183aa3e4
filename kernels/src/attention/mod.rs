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
    [] fn block_scores_tile<K: KvBlocks>(s: &mut [f32], q: &[f32], kv: &K, t: Tile)
        = x86::block_scores_tile_lanes::<L, K>, block_scores_tile_body;
    [] fn block_sums_tile<K: KvBlocks>(out: &mut [f32], probs: &[f32], kv: &K, t: Tile)
        = x86::block_sums_tile_lanes::<L, K>, block_sums_tile_body;
}

/// Queries per tile of a long prefill: each block's rows are read (and widened) once for all of
/// them, not once per pair. A scratch of `ATTENTION_TILE × NH × (P + T)` floats enables tiles.
pub const ATTENTION_TILE: usize = 16;
use ATTENTION_TILE as TILE;

/// A tile of `m` consecutive queries of head `h`: query `r` sees keys `0..n0 + r`; its scores are
/// row `r` of `s` (rows `stride` apart), its query `q[r * q_stride..][..HS]`, its output row `r`
/// of `out` (`[m, HS]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tile {
    pub m: usize,
    pub n0: usize,
    pub stride: usize,
    pub q_stride: usize,
    pub h: usize,
    pub hs: usize,
    pub scale: f32,
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

/// Calls `$f::<…, F>($args)` with `$ty`'s row format: one loop per type, matched once per call.
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
/// - `scratch`: at least `2 * NH * (P + T)` floats (two score rows per head); with
///   `TILE * NH * (P + T)` a long prefill reads each block once per tile of queries.
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
    let AttnDims { t, p, nh, hs, t_max, .. } = d;
    if t == 0 {
        return;
    }
    let c = nh * hs;
    let n_kv = p + t;
    assert!(n_kv <= t_max, "attention: {n_kv} positions exceed the cache's {t_max}");
    assert!(kv.block() > 0, "attention: blocks of no positions");
    assert!(out.len() >= t * c && q.len() >= (t - 1) * q_stride + c);
    assert!(scratch.len() >= 2 * nh * n_kv, "attention: scratch needs 2 × NH × (P + T) floats");
    // With TILE × NH × (P + T) floats (and T ≥ TILE), queries go in tiles of TILE: the same bits.
    if let Some(pr) = probs.as_deref() {
        assert!(pr.len() >= nh * t * n_kv);
    }
    let rows = if t >= TILE && hs <= TILE_HS && scratch.len() >= TILE * nh * n_kv { TILE } else { 2 };
    let sink = Sink {
        out: SendPtr(out.as_mut_ptr()),
        probs: SendPtr(probs.as_deref_mut().map_or(std::ptr::null_mut(), |p| p.as_mut_ptr())),
        want_probs: probs.is_some(),
        d,
    };
    let head = |h: usize, scores: &mut [f32]| {
        let sink = &sink;
        if rows == TILE {
            head_tiles(isa, sink, h, scores, q, q_stride, kv);
        } else {
            head_pairs(isa, sink, h, scores, q, q_stride, kv);
        }
    };
    let scratch = &mut scratch[..rows * nh * n_kv];
    if rayon::current_num_threads() > 1 && t * n_kv * hs * nh >= PAR_MIN_WORK / 4 {
        scratch.par_chunks_mut(rows * n_kv).enumerate().for_each(|(h, s)| head(h, s));
    } else {
        scratch.chunks_mut(rows * n_kv).enumerate().for_each(|(h, s)| head(h, s));
    }
}

/// The largest head a tile's outputs fit (on the stack).
const TILE_HS: usize = 128;

/// Where the heads write: `out` `[T, C]` and, when asked, `probs` `[NH, T, P+T]`; each head only
/// its own columns and slab.
struct Sink {
    out: SendPtr,
    probs: SendPtr,
    want_probs: bool,
    d: AttnDims,
}

impl Sink {
    /// Head `h`'s columns of output row `i`.
    ///
    /// # Safety
    /// Only head `h`'s task calls it for head `h`, and never while an earlier slice of the same
    /// row is alive (each call site takes a row once).
    #[allow(clippy::mut_from_ref)] // disjoint columns per head, one slice per row (the contract)
    unsafe fn row(&self, h: usize, i: usize) -> &mut [f32] {
        let (c, hs) = (self.d.nh * self.d.hs, self.d.hs);
        assert!(i < self.d.t && h < self.d.nh, "row {i} of head {h} is outside the output");
        // SAFETY: columns h*HS..(h+1)*HS of row i < T lie inside `out` (T*C floats, asserted by
        // `attention_blocks`); the caller guarantees no other live slice of them.
        unsafe { std::slice::from_raw_parts_mut(self.out.0.add(i * c + h * hs), hs) }
    }

    /// Query `i`'s weights `w` (its `P + i + 1` keys) into head `h`'s slab of `probs`, zeros after.
    ///
    /// # Safety
    /// Only head `h`'s task calls it for head `h`.
    unsafe fn weights(&self, h: usize, i: usize, w: &[f32]) {
        if !self.want_probs {
            return;
        }
        let (t, n_kv, m) = (self.d.t, self.d.p + self.d.t, self.d.p + i + 1);
        assert!(i < t && h < self.d.nh, "query {i} of head {h} is outside the weights");
        // SAFETY: head h's task alone writes its own [T, P+T] slab of `probs` (NH*T*(P+T) floats,
        // asserted by `attention_blocks`), row i of it here.
        let prow = unsafe { std::slice::from_raw_parts_mut(self.probs.0.add((h * t + i) * n_kv), n_kv) };
        prow[..m].copy_from_slice(&w[..m]);
        prow[m..].fill(0.0);
    }
}

/// Head `h`'s queries two at a time where there are two: their weighted sums share the value rows.
fn head_pairs<K: KvBlocks>(isa: Isa, sink: &Sink, h: usize, rows: &mut [f32], q: &[f32], q_stride: usize, kv: &K) {
    let AttnDims { t, p, hs, scale, .. } = sink.d;
    let (row0, row1) = rows.split_at_mut(p + t);
    let qrow = |i: usize| &q[i * q_stride + h * hs..i * q_stride + (h + 1) * hs];
    let mut i = 0;
    while i < t {
        let n = p + i + 1; // keys of query i: positions 0..=p+i
        let s0 = &mut row0[..n];
        block_scores(isa, s0, qrow(i), kv, h, hs, scale);
        softmax(isa, s0);
        // SAFETY: head h's task.
        unsafe { sink.weights(h, i, s0) };
        if i + 1 < t {
            let s1 = &mut row1[..n + 1];
            block_scores(isa, s1, qrow(i + 1), kv, h, hs, scale);
            softmax(isa, s1);
            // SAFETY: head h's task.
            unsafe { sink.weights(h, i + 1, s1) };
            // SAFETY: head h's task, rows i and i + 1 (distinct), each taken once.
            let (o0, o1) = unsafe { (sink.row(h, i), sink.row(h, i + 1)) };
            block_sums_pair(isa, o0, o1, s0, s1, kv, h, hs);
        } else {
            // SAFETY: head h's task, row i, taken once.
            block_sums(isa, unsafe { sink.row(h, i) }, s0, kv, h, hs);
        }
        i += 2;
    }
}

/// Head `h`'s queries in tiles of [`TILE`]: the scores of the whole tile block by block, each
/// row's softmax, then the weighted sums block by block (the same chains as one at a time).
fn head_tiles<K: KvBlocks>(isa: Isa, sink: &Sink, h: usize, rows: &mut [f32], q: &[f32], q_stride: usize, kv: &K) {
    let AttnDims { t, p, hs, scale, .. } = sink.d;
    let n_kv = p + t;
    let mut outs = [0.0f32; TILE * TILE_HS];
    for i in (0..t).step_by(TILE) {
        let tile = Tile { m: TILE.min(t - i), n0: p + i + 1, stride: n_kv, q_stride, h, hs, scale };
        block_scores_tile(isa, rows, &q[i * q_stride + h * hs..], kv, tile);
        for r in 0..tile.m {
            let w = &mut rows[r * n_kv..r * n_kv + tile.n0 + r];
            softmax(isa, w);
            // SAFETY: head h's task.
            unsafe { sink.weights(h, i + r, w) };
        }
        block_sums_tile(isa, &mut outs[..tile.m * hs], rows, kv, tile);
        for r in 0..tile.m {
            // SAFETY: head h's task, row i + r, taken once.
            unsafe { sink.row(h, i + r) }.copy_from_slice(&outs[r * hs..(r + 1) * hs]);
        }
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

/// The scores of a tile of queries, block by block and, within a block, query by query: each key's
/// score is its own dot product, so the same bits as [`block_scores_body`] query by query.
#[inline(always)]
pub(crate) fn block_scores_tile_body(s: &mut [f32], q: &[f32], kv: &impl KvBlocks, t: Tile) {
    for r in 0..t.m {
        let row = &mut s[r * t.stride..r * t.stride + t.n0 + r];
        block_scores_body(row, &q[r * t.q_stride..], kv, t.h, t.hs, t.scale);
    }
}

/// The weighted sums of a tile of queries (`probs` rows `stride` apart, row `r` of `n0 + r`
/// weights): [`block_sums_body`] of each.
#[inline(always)]
pub(crate) fn block_sums_tile_body(out: &mut [f32], probs: &[f32], kv: &impl KvBlocks, t: Tile) {
    for r in 0..t.m {
        let p = &probs[r * t.stride..r * t.stride + t.n0 + r];
        block_sums_body(&mut out[r * t.hs..(r + 1) * t.hs], p, kv, t.h, t.hs);
    }
}

/// Block `j` of `p0`'s weights (shorter, or empty, where `p0` ends).
#[inline(always)]
fn pair_chunk(p0: &[f32], j: usize, b: usize) -> &[f32] {
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
