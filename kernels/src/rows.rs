//! Row kernels: the fixed-order sum and dot product (16 lanes, then a fixed pairwise sum), the
//! maximum, LayerNorm, softmax and GELU over one row, and their public entry points. One body
//! each, compiled plainly (the scalar reference) and once per ISA by [`kernels!`]; these bodies
//! are plain Rust that the target features vectorize, so they name no lanes.

use crate::dispatch::kernels;
use crate::isa::Isa;
use crate::math::{exp_approx, gelu_new_scalar};
use crate::par::PAR_MIN_WORK;
use rayon::prelude::*;

/// Lanes of the fixed-order reductions (two AVX2 registers).
pub(crate) const LANES: usize = 16;

kernels! {
    [] fn sum_row(a: &[f32]) -> f32 = sum_body, sum_body;
    [] fn layernorm_row(out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], eps: f32)
        = layernorm_row_body, layernorm_row_body;
    [] fn gelu(x: &mut [f32]) = gelu_body, gelu_body;
    [] fn softmax(x: &mut [f32]) = softmax_body, softmax_body;
    [] fn exp_weights_row(x: &mut [f32], max: f32) = exp_weights_body, exp_weights_body;
}

/// The sum of `a` in the engine's fixed order (16 lanes, then a fixed pairwise sum).
pub fn sum(isa: Isa, a: &[f32]) -> f32 {
    sum_row(isa, a)
}

/// `out[T, C] = (inp - mean) / sqrt(var + eps) * weight + bias`, per row, biased variance.
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
pub fn layernorm(isa: Isa, out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], t: usize, c: usize, eps: f32) {
    assert!(out.len() >= t * c && inp.len() >= t * c && weight.len() >= c && bias.len() >= c);
    for r in 0..t {
        layernorm_row(isa, &mut out[r * c..(r + 1) * c], &inp[r * c..(r + 1) * c], weight, bias, eps);
    }
}

/// In place: `x = 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` (GPT-2's `gelu_new`).
pub fn gelu_new(isa: Isa, x: &mut [f32]) {
    if x.len() >= PAR_MIN_WORK / 4 && rayon::current_num_threads() > 1 {
        x.par_chunks_mut(4096).for_each(|ch| gelu(isa, ch));
    } else {
        gelu(isa, x);
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
    softmax(isa, x);
}

/// In place: `x = e^(x - max)` by [`exp_approx`], or 0 where `x - max < -87` (below f32's
/// smallest normal, where `exp_approx` would give its clamped floor instead): the sampler's
/// weights, elementwise and so the same bits on every path (a NaN stays a NaN).
pub fn exp_weights(isa: Isa, x: &mut [f32], max: f32) {
    exp_weights_row(isa, x, max);
}

/// Sums 16 lane partials in a fixed pairwise order.
#[inline(always)]
pub(crate) fn reduce_lanes(mut acc: [f32; LANES]) -> f32 {
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
fn exp_weights_body(x: &mut [f32], max: f32) {
    for v in x.iter_mut() {
        let d = *v - max;
        *v = if d < -87.0 { 0.0 } else { exp_approx(d) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_weights_every_path_is_the_scalar_rule_bit_for_bit() {
        // Around the -87 cut, 0, both zeros, infinities, NaN, and a spread of ordinary values.
        let mut x: Vec<f32> =
            vec![-87.0, -87.000_01, -86.999_99, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        x.extend((0..4000).map(|i| (i as f32 * 0.037).sin() * 120.0 - 40.0));
        for max in [0.0f32, -0.0, 3.5, -20.0, 1e30, f32::INFINITY, f32::NAN] {
            let want: Vec<f32> = x
                .iter()
                .map(|&v| {
                    let d = v - max;
                    if d < -87.0 {
                        0.0
                    } else {
                        exp_approx(d)
                    }
                })
                .collect();
            for isa in Isa::available() {
                for len in [0, 1, 15, 17, x.len()] {
                    let mut got = x[..len].to_vec();
                    exp_weights(isa, &mut got, max);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                        assert!(same, "{} max={max} x={}: {g} vs {w}", isa.name(), x[i]);
                    }
                }
            }
        }
    }
}
