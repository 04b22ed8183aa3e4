//! A matrix used row by row: the token embedding `wte` `[V, C]`, which is both looked up by row
//! and, tied, the vocabulary projection `logits = x @ wteᵀ` (one dot product per row).
//! Stored as f32, f16, bf16, or int8 with one scale per row and block of [`Q8_BLOCK`] columns.

use crate::aligned::Aligned;
use crate::packed::{f32_to_bf16_bits, f32_to_f16_bits, Storage, WeightType, Q8_BLOCK};
use crate::simd::{dot_rows, widen_into};
use crate::{Isa, SendPtr, PAR_MIN_WORK};
use rayon::prelude::*;

/// `[N, K]` rows.
pub struct RowMatrix {
    n: usize,
    k: usize,
    pub(crate) data: Storage,
}

impl RowMatrix {
    /// Stores `w` (`[N, K]` row-major) as `ty`.
    pub fn new(w: Vec<f32>, n: usize, k: usize, ty: WeightType) -> RowMatrix {
        assert_eq!(w.len(), n * k, "RowMatrix: {} values for {n}x{k}", w.len());
        if ty == WeightType::F32 {
            return RowMatrix { n, k, data: Storage::F32(Aligned::from_slice(&w)) };
        }
        let mut m = RowMatrix::zeros(n, k, ty);
        for (r, row) in w.chunks(k.max(1)).enumerate().take(n) {
            m.set_row(r, row);
        }
        m
    }

    /// An all-zero `[N, K]` matrix of type `ty`, to be filled with [`RowMatrix::set_row`].
    pub fn zeros(n: usize, k: usize, ty: WeightType) -> RowMatrix {
        let data = match ty {
            WeightType::F32 => Storage::F32(Aligned::zeroed(n * k)),
            WeightType::F16 => Storage::F16(Aligned::zeroed(n * k)),
            WeightType::Bf16 => Storage::Bf16(Aligned::zeroed(n * k)),
            WeightType::Q8 => Storage::Q8 { q: Aligned::zeroed(n * k), scales: vec![1.0; n * k.div_ceil(Q8_BLOCK)] },
        };
        RowMatrix { n, k, data }
    }

    /// Stores row `r` from f32 values (converted or quantized as [`RowMatrix::new`] does).
    pub fn set_row(&mut self, r: usize, row: &[f32]) {
        let k = self.k;
        assert_eq!(row.len(), k, "set_row: {} values for a row of {k}", row.len());
        match &mut self.data {
            Storage::F32(d) => d[r * k..(r + 1) * k].copy_from_slice(row),
            Storage::F16(d) => d[r * k..(r + 1) * k].iter_mut().zip(row).for_each(|(o, &x)| *o = f32_to_f16_bits(x)),
            Storage::Bf16(d) => d[r * k..(r + 1) * k].iter_mut().zip(row).for_each(|(o, &x)| *o = f32_to_bf16_bits(x)),
            Storage::Q8 { q, scales } => {
                let blocks = k.div_ceil(Q8_BLOCK);
                for b in 0..blocks {
                    let cols = b * Q8_BLOCK..((b + 1) * Q8_BLOCK).min(k);
                    let amax = row[cols.clone()].iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
                    scales[r * blocks + b] = s;
                    for c in cols {
                        q[r * k + c] = (row[c] / s).round().clamp(-127.0, 127.0) as i8;
                    }
                }
            }
        }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    pub fn weight_type(&self) -> WeightType {
        self.data.weight_type()
    }

    /// Bytes held (scales included).
    pub fn bytes(&self) -> usize {
        self.data.bytes()
    }

    /// Row `r` widened to f32 into `out` (`K` floats).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        widen_into(self, r, &mut out[..self.k]);
    }

    /// Row `r` widened to f32.
    pub fn row(&self, r: usize) -> Vec<f32> {
        let mut v = vec![0.0; self.k];
        self.row_into(r, &mut v);
        v
    }

    /// Every row widened: `[N, K]` f32.
    pub fn unpack(&self) -> Vec<f32> {
        let mut v = vec![0.0; self.n * self.k];
        for (r, row) in v.chunks_mut(self.k.max(1)).enumerate().take(self.n) {
            self.row_into(r, row);
        }
        v
    }
}

/// `out[T, N] = inp[T, K] @ Wᵀ` for `W` = `[N, K]` rows: each element is the engine's fixed-order dot product of an
/// input row and a widened weight row (the same bits as [`crate::matmul_t`] on `W.unpack()`).
pub fn matmul_t_rows(isa: Isa, out: &mut [f32], inp: &[f32], w: &RowMatrix, t: usize) {
    let (n, k) = (w.n, w.k);
    assert!(out.len() >= t * n && inp.len() >= t * k);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let run = |r0: usize, r1: usize| {
        let o = out_ptr;
        // SAFETY: tasks get disjoint weight-row ranges, i.e. disjoint columns of `out` (t*n
        // floats, asserted above), which outlives every task.
        unsafe { dot_rows(isa, o.0, inp, w, t, r0, r1) }
    };
    if t * k * n < PAR_MIN_WORK || rayon::current_num_threads() == 1 {
        run(0, n);
    } else {
        let per = 512;
        (0..n.div_ceil(per)).into_par_iter().for_each(|c| run(c * per, ((c + 1) * per).min(n)));
    }
}
