//! A tile of queries over these lanes: each block's rows read once for the whole tile. q8_0 rows
//! (`RowFormat::WIDEN_PER_TILE`) are widened once per tile, `WIDE` rows at a time into a buffer
//! on the stack, and the tile runs the f32 loops over them: widening is exact and those loops are
//! the typed ones' chains (a row format only changes how lanes are loaded), so the same bits, with
//! each row converted once per tile instead of once per query.

use super::super::{KvBlocks, Tile, TILE_HS};
use super::{scores_lanes, Halves};
use crate::kv::{Bf16s, F16s, F32s, KvType, Q8s, RowFormat};
use crate::lanes::Lanes;
use crate::packed::NR;

/// Rows a tile widens at once: `[WIDE, HS ≤ 128]` floats, 16 KiB on the stack.
const WIDE: usize = 32;

/// [`super::super::block_scores_tile_body`] over these lanes: block by block, each block's key
/// rows read (and widened, for q8_0) once for the whole tile.
#[inline(always)]
pub(crate) unsafe fn block_scores_tile_lanes<L: Halves, K: KvBlocks>(s: &mut [f32], q: &[f32], kv: &K, t: Tile) {
    by_format!(kv.kv_type(), block_scores_tile_as::<L, K>, (s, q, kv, t))
}

#[inline(always)]
unsafe fn block_scores_tile_as<L: Halves, K: KvBlocks, F: RowFormat>(s: &mut [f32], q: &[f32], kv: &K, t: Tile) {
    let (b, keys) = (kv.block(), t.n0 + t.m - 1);
    for j in 0..keys.div_ceil(b) {
        let (lo, end) = (j * b, ((j + 1) * b).min(keys));
        if !F::WIDEN_PER_TILE {
            scores_span::<L, F>(s, q, t, kv.k(j, t.h), lo, end);
        } else {
            // SAFETY: as the f32 rows: the loops check their rows' lengths.
            widened::<L, F>(kv.k(j, t.h), lo, end, t.hs, |rows, c0, c1| unsafe {
                scores_span::<L, F32s>(s, q, t, rows, c0, c1)
            });
        }
    }
}

/// The scores of each query of the tile against keys `lo..end` (those it sees), whose rows
/// `rows` holds from position `lo` on.
#[inline(always)]
unsafe fn scores_span<L: Halves, F: RowFormat>(s: &mut [f32], q: &[f32], t: Tile, rows: &[f32], lo: usize, end: usize) {
    for r in 0..t.m {
        let hi = end.min(t.n0 + r);
        if lo < hi {
            let row = &mut s[r * t.stride + lo..r * t.stride + hi];
            scores_lanes::<L, F>(row, &q[r * t.q_stride..], rows, t.hs, t.scale);
        }
    }
}

/// [`super::super::block_sums_tile_body`] over these lanes: block by block, each query's 64
/// accumulators (AVX2: in two halves of columns) loaded from `out`, run over the block's rows (in
/// L1 after the first query) and stored back exactly, so every output keeps its one chain in
/// position order.
#[inline(always)]
pub(crate) unsafe fn block_sums_tile_lanes<L: Lanes, K: KvBlocks>(out: &mut [f32], probs: &[f32], kv: &K, t: Tile) {
    if t.hs != 64 || out.len() < t.m * 64 {
        return super::super::block_sums_tile_body(out, probs, kv, t);
    }
    by_format!(kv.kv_type(), block_sums_tile_as::<L, K>, (out, probs, kv, t))
}

#[inline(always)]
unsafe fn block_sums_tile_as<L: Lanes, K: KvBlocks, F: RowFormat>(out: &mut [f32], probs: &[f32], kv: &K, t: Tile) {
    let (b, keys) = (kv.block(), t.n0 + t.m - 1);
    out[..t.m * 64].fill(0.0);
    for j in 0..keys.div_ceil(b) {
        let (lo, end) = (j * b, ((j + 1) * b).min(keys));
        if !F::WIDEN_PER_TILE {
            sums_span::<L, F>(out, probs, t, kv.v(j, t.h), lo, end);
        } else {
            // SAFETY: as the f32 rows: the loop checks its rows' length.
            widened::<L, F>(kv.v(j, t.h), lo, end, 64, |rows, c0, c1| unsafe {
                sums_span::<L, F32s>(out, probs, t, rows, c0, c1)
            });
        }
    }
}

/// Adds each query's weighted value rows of positions `lo..end` (those it sees; `rows` holds them
/// from `lo` on) to its output row, queries two at a time as `block_sums_pair_as`: each value
/// row loaded once for both. Two queries' 64 outputs are 8 registers of AVX-512's 32 but 16 of
/// AVX2's 16 (the loop spilled them to the stack): AVX2 takes the columns in two halves, each
/// output's chain the same.
#[inline(always)]
unsafe fn sums_span<L: Lanes, F: RowFormat>(
    out: &mut [f32],
    probs: &[f32],
    t: Tile,
    vh: &[f32],
    lo: usize,
    end: usize,
) {
    for r in (0..t.m).step_by(2) {
        let hi0 = end.min(t.n0 + r);
        let hi1 = if r + 1 < t.m { end.min(t.n0 + r + 1) } else { lo };
        if lo >= hi0.max(hi1) {
            continue;
        }
        assert!(vh.len() >= (hi0.max(hi1) - lo) * F::words(64), "a block holds its rows");
        let p0 = &probs[r * t.stride..][lo..hi0.max(lo)];
        let p1 = if r + 1 < t.m { &probs[(r + 1) * t.stride..][lo..hi1.max(lo)] } else { &[][..] };
        // SAFETY: rows r and r + 1 < m of `out` hold 64 floats each (checked by the caller).
        let (o0, o1) = (out.as_mut_ptr().add(r * 64), out.as_mut_ptr().add((r + 1).min(t.m - 1) * 64));
        let outs = Pair { o0, o1, both: r + 1 < t.m };
        // SAFETY: the rows hold 64 floats, `vh` the spans' rows (asserted above); d0 + D <= 4; a
        // lone last query passes o1 = o0 with no second query (`both` false, `p1` empty).
        if L::REGISTERS == 1 {
            pair_cols::<L, F, 4>(outs, p0, p1, vh, 0);
        } else {
            pair_cols::<L, F, 2>(outs, p0, p1, vh, 0);
            pair_cols::<L, F, 2>(outs, p0, p1, vh, 2);
        }
    }
}

/// Two queries' output rows (`o1` is `o0` when there is one query: `both` false).
#[derive(Clone, Copy)]
struct Pair {
    o0: *mut f32,
    o1: *mut f32,
    both: bool,
}

/// Columns `NR·d0..NR·(d0 + D)` of [`sums_span`]'s two output rows: loaded, each weighted value
/// row of `p0` and `p1` added in position order, stored back.
///
/// # Safety
/// `o.o0` and `o.o1` hold 64 floats, `d0 + D <= 4`, and `o.o1` is `o.o0` only without a second
/// query (`!o.both`, `p1` empty: `a1` is then never stored); `vh` holds `max(p0.len(), p1.len())`
/// rows of 64 values.
#[inline(always)]
unsafe fn pair_cols<L: Lanes, F: RowFormat, const D: usize>(o: Pair, p0: &[f32], p1: &[f32], vh: &[f32], d0: usize) {
    debug_assert!(d0 + D <= 4 && (o.both || (o.o0 == o.o1 && p1.is_empty())), "a pair's columns and rows");
    let w = F::words(64);
    let mut a0 = [L::zero(); D];
    let mut a1 = [L::zero(); D];
    for d in 0..D {
        // SAFETY (caller): columns NR·(d0 + d) + 16 <= 64 of both rows.
        a0[d] = L::load(o.o0.add(NR * (d0 + d)));
        a1[d] = L::load(o.o1.add(NR * (d0 + d)));
    }
    let both = p0.len().min(p1.len());
    for x in 0..both {
        let (x0, x1) = (L::splat(p0[x]), L::splat(p1[x]));
        // SAFETY (caller): row x of the rows holds 64 values.
        let v = vh.as_ptr().add(x * w);
        for d in 0..D {
            let vd = F::lanes::<L>(v, NR * (d0 + d));
            a0[d] = L::fma(x0, vd, a0[d]);
            a1[d] = L::fma(x1, vd, a1[d]);
        }
    }
    // The rows only one of them sees: the last query's own key, or a lone last query's.
    for (acc, ps) in [(&mut a0, p0), (&mut a1, p1)] {
        for (x, &pr) in ps.iter().enumerate().skip(both) {
            let a = L::splat(pr);
            // SAFETY (caller): as above.
            let v = vh.as_ptr().add(x * w);
            for (d, accd) in acc.iter_mut().enumerate() {
                *accd = L::fma(a, F::lanes::<L>(v, NR * (d0 + d)), *accd);
            }
        }
    }
    for d in 0..D {
        // SAFETY (caller): as the loads.
        a0[d].store(o.o0.add(NR * (d0 + d)));
        if o.both {
            a1[d].store(o.o1.add(NR * (d0 + d)));
        }
    }
}

/// Rows of positions `lo..end` (`rows` holds them from `lo` on, as format `F`, `hs` values each),
/// widened to f32 `WIDE` rows at a time: `each(widened, c0, c1)` for positions `c0..c1` in order.
#[inline(always)]
unsafe fn widened<L: Lanes, F: RowFormat>(
    rows: &[f32],
    lo: usize,
    end: usize,
    hs: usize,
    mut each: impl FnMut(&[f32], usize, usize),
) {
    assert!(hs <= TILE_HS && rows.len() >= (end - lo) * F::words(hs), "a block holds its rows");
    let mut buf = [0.0f32; WIDE * TILE_HS];
    let w = F::words(hs);
    for c0 in (lo..end).step_by(WIDE) {
        let c1 = (c0 + WIDE).min(end);
        for x in 0..c1 - c0 {
            let (row, dst) = (&rows[(c0 - lo + x) * w..][..w], &mut buf[x * hs..(x + 1) * hs]);
            if hs.is_multiple_of(NR) {
                for d in (0..hs).step_by(NR) {
                    // SAFETY: values d..d + 16 < hs lie in the row (w words of hs values), and
                    // dst holds hs floats.
                    F::lanes::<L>(row.as_ptr(), d).store(dst.as_mut_ptr().add(d));
                }
            } else {
                for (i, o) in dst.iter_mut().enumerate() {
                    *o = F::get(row, i);
                }
            }
        }
        each(&buf[..(c1 - c0) * hs], c0, c1);
    }
}
