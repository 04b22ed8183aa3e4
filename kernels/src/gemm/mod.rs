//! GEMM: `out[T, N] = inp[T, K] @ W + bias`, GPT-2's Conv1D with weights stored `[in, out]`.
//!
//! [`matmul`] is the definition of the bits, over a plain `[K, N]` matrix; [`matmul_packed`] is
//! the engine's, over a [`PackedMatrix`], in three layers: `sources` (a panel row widened, as
//! values or in registers), `tiles` (the register tiles) and `drivers` (how the tiles cover a
//! task's panels, and the dispatch). It splits the panels between threads; W8A8 goes to
//! [`crate::int8`].

mod drivers;
mod sources;
mod tiles;

use crate::int8::QuantizedActs;
use crate::isa::Isa;
use crate::packed::{PackedMatrix, Storage};
use crate::par::{SendPtr, PAR_MIN_WORK};
use drivers::{packed_cols, Call};
use rayon::prelude::*;

/// `out[T, N] = inp[T, K] @ w[K, N] + bias[N]` — GPT-2's Conv1D, weights stored `[in, out]`.
///
/// Each element: `acc = 0; for i in 0..K { acc = fma(inp[t, i], w[i, n], acc) }; out = acc + bias`.
/// This is that definition and nothing more, the reference the packed matmul is tested against bit
/// for bit: `f32::mul_add` rounds once, as the FMA instruction does, so it is every instruction
/// set's result, and `isa` (kept for the signature) changes nothing.
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
pub fn matmul(_isa: Isa, out: &mut [f32], inp: &[f32], w: &[f32], bias: &[f32], t: usize, k: usize, n: usize) {
    assert!(out.len() >= t * n && inp.len() >= t * k && w.len() >= k * n && bias.len() >= n);
    for r in 0..t {
        for c in 0..n {
            let mut acc = 0.0f32;
            for i in 0..k {
                acc = inp[r * k + i].mul_add(w[i * n + c], acc);
            }
            out[r * n + c] = acc + bias[c];
        }
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
    if let Storage::Ints(w8) = &w.data {
        acts.fill(isa, inp, t, k, w8);
    }
    let call = Call { out: SendPtr(out.as_mut_ptr()), inp, acts, w, bias, t };
    let run = |p0: usize, p1: usize| {
        // SAFETY: tasks get disjoint panel ranges, i.e. disjoint column ranges of `out`, which
        // holds t*n floats (asserted above) and outlives every task.
        unsafe { packed_cols(isa, &call, p0, p1) }
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
