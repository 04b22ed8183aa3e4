//! Weight matrices packed for the matmul kernel, in f32, f16, bf16 or int8.
//!
//! A `[K, N]` matrix (GPT-2's Conv1D `[in, out]`) is stored as column panels of [`NR`] = 16:
//! panel `p` holds columns `p*16..p*16+16` of every row `i` contiguously,
//! `panel[p][i][j] = W[i, p*16 + j]`, zero-padded past `N`. The kernel then streams each panel
//! front to back: one 64-byte line (f32) per row, for one token (decode) or a tile of six (prefill).
//!
//! Arithmetic: an output element is `fma(x[K-1], w[K-1], … fma(x[0], w[0], 0)) + bias`, where
//! `w` is the stored weight widened to f32 (int8: `q as f32 * scale`). That is exactly what the
//! reference [`crate::matmul`] computes on the widened matrix, whatever the tile, thread or ISA.
//!
//! Split by concern: `layout` spells where elements live (the one `panel_index`, `w8_index`, …),
//! `formats` how each storage type widens (and `Panels`, a matrix seen in its format); this module
//! holds the storage itself and fills it. It imports no kernel.

mod formats;
mod ggml;
mod ints;
mod layout;
mod quant;
mod types;

pub use formats::{bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits};
pub(crate) use ggml::ggml_q8_0;
pub use ggml::quantize_blocks;
pub use ints::widen_blocks;
pub use layout::{NR, Q8_BLOCK, W8_BLOCK};

pub(crate) use formats::{Bf16s, F16s, F32s, Format, Panels, Q8s};
pub(crate) use ints::Ints;
pub(crate) use layout::{panel_index, scale_index, sub_block_index, w4_index, w8_index};
pub(crate) use quant::{quantize, quantize_by, scale_of};
pub use types::WeightType;

use crate::aligned::{bytes_of_plain, Aligned};

/// Stored weights.
pub(crate) enum Storage {
    F32(Aligned<f32>),
    F16(Aligned<u16>),
    Bf16(Aligned<u16>),
    Q8 { q: Aligned<i8>, scales: Vec<f32> },
    Ints(Ints),
}

impl Storage {
    pub(crate) fn weight_type(&self) -> WeightType {
        match self {
            Storage::F32(_) => WeightType::F32,
            Storage::F16(_) => WeightType::F16,
            Storage::Bf16(_) => WeightType::Bf16,
            Storage::Q8 { .. } => WeightType::Q8,
            Storage::Ints(w) => w.ty,
        }
    }

    /// Every byte held, buffer by buffer (values, then scales and minimums), to `f`.
    pub(crate) fn each_byte_run(&self, f: &mut dyn FnMut(&[u8])) {
        match self {
            Storage::F32(v) => f(bytes_of_plain(v)),
            Storage::F16(v) | Storage::Bf16(v) => f(bytes_of_plain(v)),
            Storage::Q8 { q, scales } => {
                f(bytes_of_plain(q));
                f(bytes_of_plain(scales));
            }
            Storage::Ints(w) => {
                f(bytes_of_plain(&w.q));
                f(bytes_of_plain(&w.scales));
                f(bytes_of_plain(&w.mins));
            }
        }
    }

    /// Bytes held (padding and scales included).
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Storage::F32(v) => v.len() * 4,
            Storage::F16(v) | Storage::Bf16(v) => v.len() * 2,
            Storage::Q8 { q, scales } => q.len() + scales.len() * 4,
            Storage::Ints(w) => w.bytes(),
        }
    }
}

/// A `[K, N]` weight matrix in panels.
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: usize,
    pub(crate) data: Storage,
}

impl PackedMatrix {
    /// Packs `w` (`[K, N]` row-major f32) into panels of type `ty`.
    pub fn pack(w: &[f32], k: usize, n: usize, ty: WeightType) -> PackedMatrix {
        assert!(w.len() >= k * n, "pack: {} values for a {k}x{n} matrix", w.len());
        let mut m = PackedMatrix::zeros(k, n, ty);
        for i in 0..k {
            m.set_row(i, &w[i * n..(i + 1) * n]);
        }
        m
    }

    /// The same `[K, N]` matrix held as `ty`: its values widened (this matrix's bits, so from an f32
    /// matrix exactly what packing the original values as `ty` gives), row by row: the widened
    /// matrix never exists whole.
    pub fn converted(&self, ty: WeightType) -> PackedMatrix {
        let mut m = PackedMatrix::zeros(self.k, self.n, ty);
        if let (Storage::F32(d), Storage::Ints(w)) = (&self.data, &mut m.data) {
            if ty == WeightType::W8A8 {
                w.set_w8a8_panels(d, self.k, self.n);
                return m;
            }
        }
        let mut row = vec![0.0f32; self.n];
        for i in 0..self.k {
            for (p, dst) in row.chunks_mut(NR).enumerate() {
                dst.copy_from_slice(&self.panel_row(p, i)[..dst.len()]);
            }
            m.set_row(i, &row);
        }
        m
    }

    /// The bytes a `[K, N]` matrix of type `ty` holds (what [`PackedMatrix::bytes`] reports once
    /// it exists), without making it.
    pub fn bytes_of(k: usize, n: usize, ty: WeightType) -> usize {
        let panels = n.div_ceil(NR);
        let len = panels * k * NR;
        match ty {
            WeightType::F32 => len * 4,
            WeightType::F16 | WeightType::Bf16 => len * 2,
            WeightType::Q8 => len + n.div_ceil(Q8_BLOCK) * k * 4,
            ty => Ints::bytes_of(ty, k, n),
        }
    }

    /// An all-zero `[K, N]` matrix of type `ty`, to be filled with [`PackedMatrix::set_row`] or
    /// [`PackedMatrix::set_cols`].
    pub fn zeros(k: usize, n: usize, ty: WeightType) -> PackedMatrix {
        let panels = n.div_ceil(NR);
        let len = panels * k * NR;
        let data = match ty {
            WeightType::F32 => Storage::F32(Aligned::zeroed(len)),
            WeightType::F16 => Storage::F16(Aligned::zeroed(len)),
            WeightType::Bf16 => Storage::Bf16(Aligned::zeroed(len)),
            WeightType::Q8 => Storage::Q8 { q: Aligned::zeroed(len), scales: vec![1.0; n.div_ceil(Q8_BLOCK) * k] },
            ty => Storage::Ints(Ints::zeros(ty, k, n)),
        };
        PackedMatrix { k, n, panels, data }
    }

    /// Stores row `i` (`N` values): converted, or quantized with one scale per block of
    /// [`Q8_BLOCK`] columns. Rows can arrive one at a time, as a checkpoint is streamed.
    pub fn set_row(&mut self, i: usize, row: &[f32]) {
        assert!(
            i < self.k && row.len() == self.n,
            "set_row: {} values for row {i} of a {}x{} matrix",
            row.len(),
            self.k,
            self.n
        );
        if let Storage::Ints(w) = &mut self.data {
            // An integer scale spans a block of rows: they are staged until it is whole.
            return w.set_row(i, self.k, row);
        }
        for c0 in (0..self.n).step_by(Q8_BLOCK) {
            self.store(i, c0, Q8_BLOCK.min(self.n - c0), |j| row[c0 + j]);
        }
    }

    /// Stores columns `c0..c0 + m` from `cols`, `m` columns of `K` values each (column `c0 + j` is
    /// `cols[j*K..(j+1)*K]`, i.e. rows of `Wᵀ`), as [`PackedMatrix::set_row`] would. `c0` starts
    /// a [`Q8_BLOCK`] and `m` fills it (or ends the matrix).
    pub fn set_cols(&mut self, c0: usize, cols: &[f32]) {
        let k = self.k;
        let m = cols.len().checked_div(k).unwrap_or_else(|| Q8_BLOCK.min(self.n - c0));
        assert!(
            c0.is_multiple_of(Q8_BLOCK)
                && cols.len() == m * k
                && (m == Q8_BLOCK || c0 + m == self.n)
                && c0 + m <= self.n,
            "set_cols: {} values at column {c0} of a {k}x{} matrix",
            cols.len(),
            self.n
        );
        if let Storage::Ints(w) = &mut self.data {
            for j in 0..m {
                w.set_col(c0 + j, k, &cols[j * k..(j + 1) * k]);
            }
            return;
        }
        for i in 0..k {
            self.store(i, c0, m, |j| cols[j * k + i]);
        }
    }

    /// Stores column `c` from one row of a GGUF tensor of this matrix's block type (`raw`, the
    /// `K` weights' blocks): the file's integers and scales as they are. An error says what in the
    /// blocks no ggml quantizer writes.
    pub fn set_col_blocks(&mut self, c: usize, raw: &[u8]) -> Result<(), String> {
        assert!(c < self.n, "set_col_blocks: column {c} of a {}x{} matrix", self.k, self.n);
        match &mut self.data {
            Storage::Ints(w) if w.ty.ggml_block().is_some() => w.set_col_blocks(c, self.k, raw),
            d => panic!("set_col_blocks on a {} matrix", d.weight_type().name()),
        }
    }

    /// Stores elements `(i, c0 + j)` = `w(j)` for `j < m` (one [`Q8_BLOCK`], or the matrix's
    /// last): converted to the storage type, or quantized symmetric with the block's max-abs
    /// scale, rounding half to even.
    #[inline(always)]
    fn store(&mut self, i: usize, c0: usize, m: usize, w: impl Fn(usize) -> f32) {
        let k = self.k;
        // Element (i, c0 + j) lives in panel (c0 + j) / NR, row i, lane (c0 + j) % NR.
        let at = |j: usize| panel_index(k, (c0 + j) / NR, i) + (c0 + j) % NR;
        match &mut self.data {
            Storage::F32(d) => (0..m).for_each(|j| d[at(j)] = w(j)),
            Storage::F16(d) => (0..m).for_each(|j| d[at(j)] = f32_to_f16_bits(w(j))),
            Storage::Bf16(d) => (0..m).for_each(|j| d[at(j)] = f32_to_bf16_bits(w(j))),
            Storage::Ints(_) => unreachable!("set_row and set_cols store integers by blocks of rows"),
            Storage::Q8 { q, scales } => {
                let amax = (0..m).map(|j| w(j).abs()).fold(0.0f32, f32::max);
                let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
                scales[scale_index(k, c0, i)] = s;
                (0..m).for_each(|j| q[at(j)] = round_even(w(j) / s).clamp(-127.0, 127.0) as i8);
            }
        }
    }

    /// Element `(i, c)` widened to f32 (the value the kernels multiply with).
    pub fn get(&self, i: usize, c: usize) -> f32 {
        assert!(i < self.k && c < self.n, "get: ({i}, {c}) outside a {}x{} matrix", self.k, self.n);
        match &self.data {
            // One element, not its panel row: a token's embedding reads a column of these.
            Storage::Ints(w) => w.widened(c / NR, i, c % NR),
            _ => self.panel_row(c / NR, i)[c % NR],
        }
    }

    /// Panel `p`'s row `i` widened to f32 (the values the kernels multiply with).
    pub(crate) fn panel_row(&self, p: usize, i: usize) -> [f32; NR] {
        let k = self.k;
        match &self.data {
            Storage::F32(d) => Panels::<F32s>::new(d, &[], k).row(p, i),
            Storage::F16(d) => Panels::<F16s>::new(d, &[], k).row(p, i),
            Storage::Bf16(d) => Panels::<Bf16s>::new(d, &[], k).row(p, i),
            Storage::Q8 { q, scales } => Panels::<Q8s>::new(q, scales, k).row(p, i),
            Storage::Ints(w) => w.row(p, i),
        }
    }

    /// Column `c` (`K` values) widened into `out`: a token's embedding when the matrix is `wteᵀ`.
    pub fn column_into(&self, c: usize, out: &mut [f32]) {
        for (i, o) in out[..self.k].iter_mut().enumerate() {
            *o = self.get(i, c);
        }
    }

    /// Column `c` widened.
    pub fn column(&self, c: usize) -> Vec<f32> {
        let mut v = vec![0.0; self.k];
        self.column_into(c, &mut v);
        v
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn panels(&self) -> usize {
        self.panels
    }

    pub fn weight_type(&self) -> WeightType {
        self.data.weight_type()
    }

    /// Bytes held (padding and scales included).
    pub fn bytes(&self) -> usize {
        self.data.bytes()
    }

    /// Every byte the matrix holds, as it holds them (its type's values in panels, then scales
    /// and minimums), handed to `f` buffer by buffer: what a fingerprint of the weights reads.
    pub fn each_byte_run(&self, f: &mut dyn FnMut(&[u8])) {
        f(self.data.weight_type().name().as_bytes());
        f(&(self.k as u64).to_le_bytes());
        f(&(self.n as u64).to_le_bytes());
        self.data.each_byte_run(f);
    }

    /// The matrix as the kernel sees it: `[K, N]` f32, every weight widened (dequantized).
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0.0f32; self.k * self.n];
        for p in 0..self.panels {
            for i in 0..self.k {
                let row = self.panel_row(p, i);
                for (j, &x) in row.iter().enumerate() {
                    let c = p * NR + j;
                    if c < self.n {
                        w[i * self.n + c] = x;
                    }
                }
            }
        }
        w
    }
}

/// `x` rounded to the nearest integer, halves to even, for |x| < 2^22 (quantized values are within
/// ±127.5): adding and removing 1.5·2^23 leaves no fraction bits. Plain adds, so it vectorizes
/// without SSE4.1's `roundps` (`f32::round` is a libm call on baseline x86-64).
#[inline(always)]
fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (x + MAGIC) - MAGIC
}
