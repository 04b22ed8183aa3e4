//! Integer weights times int8 activations, with exact integer block sums: W8A8 and llama.cpp's
//! block types (see `packed::ints`).
//!
//! Each activation row is quantized on its own, per block of [`W8_BLOCK`] reduction elements
//! (`sa[r, b]`, `qa[r, i]`); each weight column is held in sub-blocks `s` of 32 (or 16) rows as
//! integers `qw[i, c]`, a scale `sw[s, c]` and, for some types, a minimum `mw[s, c]`. An output is
//!
//! ```text
//! acc = 0
//! for s in sub-blocks, in order {            // b: the activation block holding s
//!     acc = fma(sa[r,b] * sw[s,c], Σ_{i in s} qa[r,i]·qw[i,c], acc)
//!     if mins { acc = fma(sa[r,b] * mw[s,c], Σ_{i in s} qa[r,i], acc) }
//! }
//! out = acc + bias[c]
//! ```
//!
//! The sums are integers (|Σ| ≤ 32·127·127 < 2²⁴, so their f32 is exact) and integer sums are
//! exact in any order: whatever the instruction (VNNI's `vpdpbusd`, AVX2's `pmaddubsw` +
//! `pmaddwd`, plain Rust) and however the work is split, the f32 chain over sub-blocks is the
//! same, so the bits are the same on every path, for any T, batch and thread count.
//!
//! `T` rows of `KP` (the reduction padded to whole blocks with zeros), `N` columns in panels of
//! [`NR`] as [`crate::packed::w8_index`] (bytes) or [`crate::packed::w4_index`] (nibbles) lay
//! them out.
//!
//! Layered on the lanes alone: the dot products are written over [`IntLanes`] (each ISA's
//! spelling lives in `crate::lanes`), and the GEMM drivers call them; nothing here imports GEMM.

use crate::dispatch::kernels;
use crate::isa::Isa;
use crate::lanes::{prefetch, IntLanes, Lanes};
use crate::packed::{quantize, quantize_by, scale_of, sub_block_index, w4_index, w8_index, Ints, NR, W8_BLOCK};
use crate::par::PAR_MIN_WORK;
use rayon::prelude::*;

kernels! {
    [] fn quantize_row(q: &mut [i8], s: &mut [f32], sums: &mut [i32], x: &[f32]) = quantize_row_body, quantize_row_body;
    [] fn takes_abs() -> bool = lanes_take_abs::<L>, no_abs;
}

fn lanes_take_abs<L: Lanes>() -> bool {
    L::Int::TAKES_ABS
}

fn no_abs() -> bool {
    false
}

/// Activation rows per sum: the smallest sub-block (Q6_K's).
const HALF: usize = 16;

/// Room for a matmul's activations quantized to int8 (integer weights only): kept by the caller
/// and reused, so the per-token path does not allocate once it has grown.
#[derive(Default)]
pub struct QuantizedActs {
    /// `[T, KP]` int8 values.
    pub(crate) q: Vec<i8>,
    /// `[T, KP]`: the int8 values' absolute values where the products take them (byte weights on
    /// lanes with [`IntLanes::TAKES_ABS`]: AVX2's), or `[T, 1]` zeros (a placeholder) otherwise.
    pub(crate) abs: Vec<i8>,
    /// `[T, KP / 32]` scales.
    pub(crate) s: Vec<f32>,
    /// `[T, KP / 16]`: the sum of each 16 int8 values (for the minimums, and what a dot product
    /// with weights offset by 128 into unsigned bytes must take off, 128 times).
    pub(crate) sums: Vec<i32>,
}

/// One row's index and its parts of [`QuantizedActs`]: values, |values|, scales and sums.
type RowParts<'a> = (usize, (((&'a mut [i8], &'a mut [i8]), &'a mut [f32]), &'a mut [i32]));

impl QuantizedActs {
    /// Quantizes `inp[T, K]` per row and block of 32 for the products with `w`, padding each row
    /// to `w.kp` with zeros; the rows on every thread where there are many (each row's values
    /// are its own, so the same).
    pub(crate) fn fill(&mut self, isa: Isa, inp: &[f32], t: usize, k: usize, w: &Ints) {
        let (kp, nb) = (w.kp, w.kp / W8_BLOCK);
        self.q.clear();
        self.q.resize(t * kp, 0);
        // |values| where the products take them (bytes, not nibbles, on lanes that take them);
        // otherwise a placeholder byte a row, so that the rows zip alike.
        let with_abs = takes_abs(isa) && !w.sh.four;
        let abs_row = if with_abs { kp } else { 1 };
        self.abs.clear();
        self.abs.resize(t * abs_row, 0);
        self.s.clear();
        self.s.resize(t * nb, 0.0);
        self.sums.clear();
        self.sums.resize(t * 2 * nb, 0);
        if kp == 0 {
            return;
        }
        let Self { q, abs, s, sums } = self;
        let one = |(r, (((q, abs), s), sums)): RowParts| {
            quantize_row(isa, q, s, sums, &inp[r * k..(r + 1) * k]);
            if with_abs {
                abs.iter_mut().zip(q.iter()).for_each(|(a, v)| *a = v.abs());
            }
        };
        if t * k >= PAR_MIN_WORK && rayon::current_num_threads() > 1 {
            let rows = q.par_chunks_mut(kp).zip(abs.par_chunks_mut(abs_row)).zip(s.par_chunks_mut(nb));
            rows.zip(sums.par_chunks_mut(2 * nb)).enumerate().for_each(one);
        } else {
            let rows = q.chunks_mut(kp).zip(abs.chunks_mut(abs_row)).zip(s.chunks_mut(nb));
            rows.zip(sums.chunks_mut(2 * nb)).enumerate().for_each(one);
        }
    }
}

/// One activation row `x` quantized per block of 32 (max-abs, symmetric) into `q` (padded with
/// zeros), its scales `s` and the sums of each 16 values. Plain IEEE operations (max,
/// reciprocal, product, round-half-even), so the same values whichever ISA compiles it.
#[inline(always)]
pub(crate) fn quantize_row_body(q: &mut [i8], s: &mut [f32], sums: &mut [i32], x: &[f32]) {
    for (b, ((qb, sb), cb)) in q.chunks_mut(W8_BLOCK).zip(s.iter_mut()).zip(sums.chunks_mut(2)).enumerate() {
        let blk = &x[(b * W8_BLOCK).min(x.len())..((b + 1) * W8_BLOCK).min(x.len())];
        if blk.len() == W8_BLOCK {
            // A whole block, in fixed-size arrays so that it vectorizes.
            let blk: &[f32; W8_BLOCK] = blk.try_into().expect("a whole block");
            // ([`larger`] rather than `f32::max`, whose NaN rule keeps it scalar; the values
            // are finite, so both give the same maximum. Over 8 lanes: over 16 the compiler
            // spelled per-lane tests and branches.)
            let mut m = [0.0f32; 8];
            for h in blk.chunks_exact(8) {
                for (ml, v) in m.iter_mut().zip(h) {
                    *ml = larger(*ml, v.abs());
                }
            }
            let m = [larger(m[0], m[4]), larger(m[1], m[5]), larger(m[2], m[6]), larger(m[3], m[7])];
            let sc = scale_of(larger(larger(m[0], m[2]), larger(m[1], m[3])));
            let mut qs = [0i8; W8_BLOCK];
            if sc != 0.0 {
                let inv = 1.0 / sc;
                for (qv, &v) in qs.iter_mut().zip(blk) {
                    *qv = quantize_by(v, inv);
                }
            }
            qb.copy_from_slice(&qs);
            *sb = sc;
            cb[0] = qs[..HALF].iter().map(|&v| v as i32).sum::<i32>();
            cb[1] = qs[HALF..].iter().map(|&v| v as i32).sum::<i32>();
        } else {
            let sc = scale_of(blk.iter().fold(0.0f32, |m, v| m.max(v.abs())));
            qb.fill(0);
            for (qv, &v) in qb.iter_mut().zip(blk) {
                *qv = quantize(v, sc);
            }
            *sb = sc;
            cb[0] = qb[..HALF].iter().map(|&v| v as i32).sum::<i32>();
            cb[1] = qb[HALF..].iter().map(|&v| v as i32).sum::<i32>();
        }
    }
}

/// The larger of `a` and `b`, `a` where `b` is not larger (a NaN `b` is passed over): a plain
/// compare and select, which vectorizes where `f32::max`'s NaN rule does not.
#[inline(always)]
fn larger(a: f32, b: f32) -> f32 {
    if b > a {
        b
    } else {
        a
    }
}

/// What every tile of one integer matmul call shares.
pub(crate) struct Job<'a> {
    pub(crate) w: &'a Ints,
    pub(crate) a: &'a QuantizedActs,
    /// `T * N` writable floats; each task writes only the columns of its own panels.
    pub(crate) out: *mut f32,
    pub(crate) bias: &'a [f32],
    pub(crate) t: usize,
    pub(crate) n: usize,
}

impl Job<'_> {
    /// Row `r`'s sum of activations over sub-block `s` (exact).
    #[inline(always)]
    fn act_sum(&self, r: usize, s: usize) -> i32 {
        let (sub, per_row) = (self.w.sh.sub, self.w.kp / HALF);
        let at = r * per_row + s * sub / HALF;
        self.a.sums[at..at + sub / HALF].iter().sum()
    }
}

/// Row `r` against panel `p`, in plain Rust: the reference the SIMD tiles are tested against.
#[inline(always)]
pub(crate) unsafe fn tile_portable(j: &Job, p: usize, r: usize) {
    let Job { w, a, out, bias, n, .. } = *j;
    let (kp, sub) = (w.kp, w.sh.sub);
    let c0 = p * NR;
    let mut acc = [0.0f32; NR];
    for s in 0..kp / sub {
        let mut isum = [0i32; NR];
        for i in s * sub..(s + 1) * sub {
            let x = a.q[r * kp + i] as i32;
            for (l, v) in isum.iter_mut().enumerate() {
                *v += x * w.value(p, i, l);
            }
        }
        let sa = a.s[r * (kp / W8_BLOCK) + s * sub / W8_BLOCK];
        let at = sub_block_index(kp, sub, p, s);
        let asum = j.act_sum(r, s) as f32;
        for l in 0..NR {
            acc[l] = (sa * w.scales[at + l]).mul_add(isum[l] as f32, acc[l]);
            if !w.mins.is_empty() {
                acc[l] = (sa * w.mins[at + l]).mul_add(asum, acc[l]);
            }
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

/// Rows `r0..r0+R` against the whole panels `p..p+G`; `FOUR`: the weights are nibbles.
#[inline(always)]
unsafe fn tile<L: IntLanes, const R: usize, const G: usize, const FOUR: bool>(j: &Job, p: usize, r0: usize) {
    let Job { w, a, out, bias, n, .. } = *j;
    let (kp, sub, nb) = (w.kp, w.sh.sub, w.kp / W8_BLOCK);
    let (wq, aq) = (w.q.as_ptr(), a.q.as_ptr());
    let mut acc = [[L::F::zero(); R]; G]; // [panel][row]
    for s in 0..kp / sub {
        let (i0, b) = (s * sub, s * sub / W8_BLOCK);
        if r0 == 0 {
            prefetch_ahead::<G, FOUR>(w, p, s);
        }
        let mut asum = [0i32; R];
        let mut start = [L::start(0); R];
        for r in 0..R {
            asum[r] = j.act_sum(r0 + r, s);
            // Bytes are offset by 128, nibbles by `w.sh.offset`: the sums take that off.
            start[r] = if FOUR { L::start_u(w.sh.offset * asum[r]) } else { L::start(128 * asum[r]) };
        }
        let mut isum = [start; G];
        if FOUR {
            for i in (i0..i0 + sub).step_by(8) {
                // SAFETY (caller): panels p..p+G are inside the matrix and i + 8 <= kp, so each
                // line's 64 bytes and each row's 8 activation bytes are in bounds.
                let mut lo = [L::load_w4(wq.add(w4_index(kp, p, i, 0).0)); G];
                for (q, l) in lo.iter_mut().enumerate().skip(1) {
                    *l = L::load_w4(wq.add(w4_index(kp, p + q, i, 0).0));
                }
                for r in 0..R {
                    let row = aq.add((r0 + r) * kp + i) as *const i32;
                    let (x0, x1) = (L::prep(row.read_unaligned()), L::prep(row.add(1).read_unaligned()));
                    for (sq, &(w0, w1)) in isum.iter_mut().zip(&lo) {
                        sq[r] = L::dot4u(L::dot4u(sq[r], x0, w0), x1, w1);
                    }
                }
            }
        } else {
            for i in (i0..i0 + sub).step_by(4) {
                // SAFETY (caller): as above, with groups of 4 rows.
                // A loop, not `array::from_fn`: its closure would not get the caller's target
                // features, and the intrinsics in it would become calls.
                let mut wg = [L::load_w(wq.add(w8_index(kp, p, i, 0))); G];
                for (q, wgq) in wg.iter_mut().enumerate().skip(1) {
                    *wgq = L::load_w(wq.add(w8_index(kp, p + q, i, 0)));
                }
                for r in 0..R {
                    let at = (r0 + r) * kp + i;
                    // SAFETY (as above): `a.abs` holds T × KP bytes where the lanes take it (`fill`
                    // got this ISA: `matmul_packed` passes one to both; `cols_of` checks it).
                    let abs4 = if L::TAKES_ABS { (a.abs.as_ptr().add(at) as *const i32).read_unaligned() } else { 0 };
                    let x = L::prep_abs((aq.add(at) as *const i32).read_unaligned(), abs4);
                    for (sq, &wgq) in isum.iter_mut().zip(&wg) {
                        sq[r] = L::dot4(sq[r], x, wgq);
                    }
                }
            }
        }
        for (q, (accq, sq)) in acc.iter_mut().zip(&isum).enumerate() {
            let at = sub_block_index(kp, sub, p + q, s);
            let sw = L::F::load(w.scales.as_ptr().add(at));
            for r in 0..R {
                let sa = L::F::splat(a.s[(r0 + r) * nb + b]);
                accq[r] = L::F::fma(L::F::mul(sw, sa), L::to_f32(sq[r]), accq[r]);
            }
            if !w.mins.is_empty() {
                let mw = L::F::load(w.mins.as_ptr().add(at));
                for r in 0..R {
                    let sa = L::F::splat(a.s[(r0 + r) * nb + b]);
                    accq[r] = L::F::fma(L::F::mul(mw, sa), L::F::splat(asum[r] as f32), accq[r]);
                }
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

/// How far ahead a group's first pass (the tile of rows from 0: a decode step, a draft's step, a
/// batch's first rows) asks for its panels' sub-blocks, counted over the group's `G` panels
/// together: `AHEAD / G` sub-blocks ahead in each, but at most a panel's blocks (so one-panel
/// groups over a short reduction, 24 blocks at K = 768, ask less than wider ones). It asks for the
/// integer lines and the scales (and minimums) of block `s + min(AHEAD / G, blocks)`, past the
/// panels' end the next group's; later passes over the group find it in cache. The hardware's
/// prefetchers do not keep up with a panel's short streams (12 KiB of integers and 1.5 KiB of
/// scales for K = 768). Measured: see DESIGN.md, "Few rows against the roof".
const AHEAD: usize = 48;

/// Asks for panels `p..p+G`'s sub-block `AHEAD / G` ahead of `s` (see [`AHEAD`]); a hint, any
/// address allowed.
#[inline(always)]
fn prefetch_ahead<const G: usize, const FOUR: bool>(w: &Ints, p: usize, s: usize) {
    let (kp, sub) = (w.kp, w.sh.sub);
    let blocks = kp / sub;
    let ahead = (AHEAD / G).min(blocks).max(1);
    let (pp, ss) = if s + ahead < blocks { (p, s + ahead) } else { (p + G, s + ahead - blocks) };
    let line = |q: usize, i: usize| if FOUR { w4_index(kp, pp + q, i, 0).0 } else { w8_index(kp, pp + q, i, 0) };
    for q in 0..G {
        for i in (ss * sub..(ss + 1) * sub).step_by(if FOUR { 8 } else { 4 }) {
            prefetch(w.q.as_ptr().wrapping_add(line(q, i)));
        }
        let at = sub_block_index(kp, sub, pp + q, ss);
        prefetch(w.scales.as_ptr().wrapping_add(at) as *const u8);
        if !w.mins.is_empty() {
            prefetch(w.mins.as_ptr().wrapping_add(at) as *const u8);
        }
    }
}

/// Every row against panels `p0..p1` in register tiles; the ragged last panel in plain Rust.
#[inline(always)]
pub(crate) unsafe fn cols<L: IntLanes>(j: &Job, p0: usize, p1: usize) {
    if j.w.sh.four {
        cols_of::<L, true>(j, p0, p1)
    } else {
        cols_of::<L, false>(j, p0, p1)
    }
}

#[inline(always)]
unsafe fn cols_of<L: IntLanes, const FOUR: bool>(j: &Job, p0: usize, p1: usize) {
    let Job { t, n, .. } = *j;
    debug_assert!(!L::TAKES_ABS || FOUR || j.a.abs.len() == j.a.q.len(), "activations quantized for another ISA");
    let whole = p1.min(n / NR).max(p0);
    let mut p = p0;
    if t == 1 {
        if L::WIDE {
            while p + 4 <= whole {
                tile::<L, 1, 4, FOUR>(j, p, 0);
                p += 4;
            }
        } else {
            while p + 2 <= whole {
                tile::<L, 1, 2, FOUR>(j, p, 0);
                p += 2;
            }
        }
    } else if L::WIDE {
        while p + 3 <= whole {
            rows::<L, 4, 3, FOUR>(j, p);
            p += 3;
        }
        while p < whole {
            rows::<L, 4, 1, FOUR>(j, p);
            p += 1;
        }
    } else {
        while p < whole {
            rows::<L, 2, 1, FOUR>(j, p);
            p += 1;
        }
    }
    for q in p..whole {
        tile::<L, 1, 1, FOUR>(j, q, 0); // decode's last few panels
    }
    cols_portable(j, whole, p1);
}

/// Every row against the whole panels `p..p+G`, `R` rows at a time, then one at a time.
#[inline(always)]
unsafe fn rows<L: IntLanes, const R: usize, const G: usize, const FOUR: bool>(j: &Job, p: usize) {
    let mut r = 0;
    while r + R <= j.t {
        tile::<L, R, G, FOUR>(j, p, r);
        r += R;
    }
    while r < j.t {
        tile::<L, 1, G, FOUR>(j, p, r);
        r += 1;
    }
}
