//! GEMM drivers: how the tiles cover one task's panels of the output (decode, the few-rows
//! passes, or `MR`-row tiles over `KC` blocks of the reduction, rows grouped by `MC`), per storage
//! type, and the packed matmul's one dispatched kernel.

use super::sources::Source;
use super::tiles::{Job, Portable, Simd, TileKernel};
use crate::dispatch::kernels;
use crate::int8::{self, QuantizedActs};
use crate::packed::{Bf16s, F16s, F32s, PackedMatrix, Panels, Q8s, Storage};
use crate::par::SendPtr;

kernels! {
    // # Safety: `c.out` must point to `c.t * c.w.n()` writable floats, and no other thread may
    // touch the columns of panels `p0..p1`.
    [unsafe] fn packed_cols(c: &Call, p0: usize, p1: usize) = packed_cols_body::<Simd<L>>, packed_cols_body::<Portable>;
}

/// Reduction rows per cache block (GPT-2's C: c_attn and c_fc in one pass, mlp.c_proj in four).
/// Chosen by measurement (256, 512, 768, 1024, 4096 tried with `kvgpt bench`); the result's bits
/// do not depend on it.
const KC: usize = 768;
/// Rows per register tile: 6 x 16 accumulators fill 12 of the 16 AVX2 registers.
const MR: usize = 6;
/// Rows per cache group (a multiple of MR): the group's KC-slice of activations, 96 x 768 floats =
/// 288 KiB, stays in L2 while the task's panels pass over it.
const MC: usize = 96;

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
        Storage::Ints(w) => T::int8(&int8::Job { w, a: acts, out, bias, t, n }, p0, p1),
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
