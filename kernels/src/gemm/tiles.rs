//! GEMM tiles: the register tiles of the packed matmul, written once over [`TileKernel`]. The
//! portable tile (plain Rust, the reference) and the SIMD tiles over the lanes of an ISA
//! ([`Simd`]) spell the same FMA chains; the few-rows passes are shapes of tiles, shared by both.

use super::sources::Source;
use crate::int8;
use crate::lanes::Lanes;
use crate::packed::NR;

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

/// Which weight rows a pass asks to be brought into cache ahead of its own (a hint, where the lanes
/// take it): each panel's row `i + rows` at the pass's step `i`, on the steps `i % every == phase`
/// (so `every` passes over the same panels share the work); past the reduction's end, with
/// `wrap`, the next panel group's first rows (when that group is the same task's). `rows == 0`:
/// none.
#[derive(Clone, Copy)]
pub(crate) struct Ahead {
    pub(crate) rows: usize,
    pub(crate) every: usize,
    pub(crate) phase: usize,
    pub(crate) wrap: bool,
}

impl Ahead {
    pub(crate) const NONE: Ahead = Ahead { rows: 0, every: 1, phase: 0, wrap: false };

    /// A chunked pass's (AVX2's few-row pairs): the chunk [`CHUNKS_AHEAD`] on, pass `phase` of
    /// `every` taking its share; `wrap` when the next panel group is the same task's.
    fn chunk(every: usize, phase: usize, wrap: bool) -> Ahead {
        Ahead { rows: CHUNKS_AHEAD * CHUNK, every, phase, wrap }
    }
}

/// A register tile: rows `r0..r0+R` of the activations against panel `p`, reduction rows
/// `kc0..kc1`. Implementations differ only in how they spell the same FMA chains.
pub(crate) trait TileKernel {
    /// Up to this many rows take the few-rows path ([`TileKernel::few`], passes over groups of
    /// panels, by chunks of the reduction where several passes share them); more take `MR`-row
    /// tiles over `KC` blocks.
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
        Self::span::<S, R, G>(j, p, r0, (0, k), Ahead::NONE)
    }

    /// As [`TileKernel::wide`] over reduction rows `kc.0..kc.1` only (continuing the FMA chains
    /// stored in `out` unless `kc.0 == 0`, adding the bias after the last), asking for the weight
    /// rows [`Ahead`] names to be brought into cache (a hint, where the lanes take it).
    ///
    /// # Safety
    /// As [`TileKernel::wide`], with `kc.0 <= kc.1 <= k`; when `kc.0 > 0`, rows `r0..r0+R` of
    /// `out` in these panels hold this pass's sums over reduction rows `0..kc.0`.
    #[inline(always)]
    unsafe fn span<S: Source, const R: usize, const G: usize>(
        j: &Job<S>,
        p: usize,
        r0: usize,
        kc: (usize, usize),
        _ahead: Ahead,
    ) {
        for q in p..p + G {
            Self::tile::<S, R>(j, q, r0, kc.0, kc.1);
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

/// Reduction rows per chunk of the few-rows path's two-row passes (three panels' chunk: 12 KiB).
/// Every pass over a chunk asks for its share of a chunk further on, so the weights' stream from
/// memory runs under all the passes' arithmetic, not only under the first pass's.
const CHUNK: usize = 64;

/// How many chunks on the passes ask for: two, so that a chunk's lines have all the passes over
/// the chunk between (one chunk's passes did not cover the memory's latency: DESIGN.md, "Few rows
/// against the roof").
const CHUNKS_AHEAD: usize = 2;

/// The reduction's chunks `(kc0, kc1)`: at least one, `(0, 0)`, for an empty reduction (whose
/// outputs are the bias).
fn chunks(k: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..k.max(1)).step_by(CHUNK).map(move |c| (c, (c + CHUNK).min(k)))
}

/// Whether panels `p+g..p+2g` are a whole group of the same task (`..p1`): where a chunked pass's
/// prefetches may run on past its own group's end.
fn whole_group_after<S>(j: &Job<S>, p: usize, g: usize, p1: usize) -> bool {
    p + 2 * g <= p1 && (p + 2 * g) * NR <= j.n
}

/// The few-rows path two rows at a time: three panels per pass over each chunk of the reduction,
/// so three weight streams are in flight; the other rows find the chunk in cache.
#[inline(always)]
unsafe fn few_pairs<T: TileKernel + ?Sized, S: Source>(j: &Job<S>, p0: usize, p1: usize) {
    let Job { t, k, n, .. } = *j;
    let mut p = p0;
    while p + 3 <= p1 && (p + 3) * NR <= n {
        let (passes, wrap) = (t.div_ceil(2), whole_group_after(j, p, 3, p1));
        for kc in chunks(k) {
            let mut r = 0;
            while r + 2 <= t {
                T::span::<S, 2, 3>(j, p, r, kc, Ahead::chunk(passes, r / 2, wrap));
                r += 2;
            }
            if r < t {
                T::span::<S, 1, 3>(j, p, r, kc, Ahead::chunk(passes, r / 2, wrap));
            }
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
        let Job { k, .. } = *j;
        let rows = if L::PREFETCH { PREFETCH } else { 0 };
        Self::span::<S, R, G>(j, p, r0, (0, k), Ahead { rows, ..Ahead::NONE })
    }

    #[inline(always)]
    unsafe fn span<S: Source, const R: usize, const G: usize>(
        j: &Job<S>,
        p: usize,
        r0: usize,
        (kc0, kc1): (usize, usize),
        ahead: Ahead,
    ) {
        let Job { src, out, inp, bias, k, n, .. } = *j;
        let mut acc = [[L::zero(); R]; G]; // [panel][row]
        if kc0 > 0 {
            for (q, accq) in acc.iter_mut().enumerate() {
                for (r, a) in accq.iter_mut().enumerate() {
                    *a = L::load(out.add((r0 + r) * n + (p + q) * NR));
                }
            }
        }
        let a_ptr: [*const f32; R] = std::array::from_fn(|r| inp[(r0 + r) * k..(r0 + r + 1) * k].as_ptr());
        for i in kc0..kc1 {
            if ahead.rows > 0 && i % ahead.every == ahead.phase {
                let at = if i + ahead.rows < k {
                    Some((p, i + ahead.rows))
                } else {
                    ahead.wrap.then(|| (p + G, i + ahead.rows - k))
                };
                if let Some((next, row)) = at {
                    for q in 0..G {
                        src.prefetch(next + q, row);
                    }
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
        let last = kc1 == k;
        for (q, accq) in acc.iter().enumerate() {
            let c0 = (p + q) * NR;
            let b = if last { L::load(bias.as_ptr().add(c0)) } else { L::zero() };
            for (r, c) in accq.iter().enumerate() {
                let v = if last { L::add(*c, b) } else { *c };
                v.store(out.add((r0 + r) * n + c0));
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
