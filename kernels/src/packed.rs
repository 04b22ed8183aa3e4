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

use crate::aligned::Aligned;

/// Columns per panel.
pub const NR: usize = 16;
/// Columns sharing one int8 scale (per row): two panels.
pub const Q8_BLOCK: usize = 32;
/// Reduction rows sharing one W8A8 scale: per output column for the weights, per token for the
/// activations (llama.cpp's Q8_0 block).
pub const W8_BLOCK: usize = 32;

/// How weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightType {
    F32,
    F16,
    Bf16,
    /// int8 weights with one f32 scale per row and block of [`Q8_BLOCK`] columns (symmetric,
    /// max-abs), widened to f32 and multiplied with f32 activations (weight-only int8).
    Q8,
    /// int8 weights with one f32 scale per output column and block of [`W8_BLOCK`] reduction rows,
    /// multiplied with activations quantized to int8 per token and block: exact integer block
    /// sums, combined in f32 in block order (integer dot products: VNNI, AVX2's `pmaddubsw`).
    W8A8,
}

impl WeightType {
    /// Every type, in the order the CLI lists them.
    pub const ALL: [WeightType; 5] =
        [WeightType::F32, WeightType::F16, WeightType::Bf16, WeightType::Q8, WeightType::W8A8];

    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::F16 => "f16",
            WeightType::Bf16 => "bf16",
            WeightType::Q8 => "q8",
            WeightType::W8A8 => "w8a8",
        }
    }
}

/// Stored weights.
pub(crate) enum Storage {
    F32(Aligned<f32>),
    F16(Aligned<u16>),
    Bf16(Aligned<u16>),
    Q8 { q: Aligned<i8>, scales: Vec<f32> },
    W8A8(W8),
}

/// W8A8 weights. The reduction is padded with zero rows to `kp`, a multiple of [`W8_BLOCK`];
/// [`w8_index`] spells the layout, [`w8_block_index`] where a block's scales and sums are.
pub(crate) struct W8 {
    pub(crate) kp: usize,
    /// The int8 values offset by 128 (`q ^ 0x80` as unsigned bytes): the operand order of
    /// VNNI's unsigned × signed dot product, with no conversion in the loop ([`w8_value`]).
    pub(crate) q: Aligned<u8>,
    /// Per panel, block and lane: the column's scale over the block.
    pub(crate) scales: Vec<f32>,
    /// Rows of the block being streamed in by [`PackedMatrix::set_row`], until it is whole.
    stage: Vec<f32>,
    /// The next row `set_row` expects.
    next_row: usize,
}

impl Storage {
    pub(crate) fn weight_type(&self) -> WeightType {
        match self {
            Storage::F32(_) => WeightType::F32,
            Storage::F16(_) => WeightType::F16,
            Storage::Bf16(_) => WeightType::Bf16,
            Storage::Q8 { .. } => WeightType::Q8,
            Storage::W8A8(_) => WeightType::W8A8,
        }
    }

    /// Bytes held (padding and scales included).
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Storage::F32(v) => v.len() * 4,
            Storage::F16(v) | Storage::Bf16(v) => v.len() * 2,
            Storage::Q8 { q, scales } => q.len() + scales.len() * 4,
            Storage::W8A8(w) => w.q.len() + w.scales.len() * 4,
        }
    }
}

/// Where panel `p`'s row `i` starts in a `K`-row matrix's storage: panel-major, then row, then
/// the panel's 16 lanes. The one place the layout is spelled.
#[inline(always)]
pub(crate) fn panel_index(k: usize, p: usize, i: usize) -> usize {
    (p * k + i) * NR
}

/// Which int8 scale covers row `i`, column `c` (one per row and [`Q8_BLOCK`] columns).
#[inline(always)]
pub(crate) fn scale_index(k: usize, c: usize, i: usize) -> usize {
    (c / Q8_BLOCK) * k + i
}

/// Where W8A8 element (row `i`, lane `j`) of panel `p` lives, in a matrix padded to `kp` rows:
/// panel-major, then groups of four rows, then the lane, then the row within its group, so that
/// one group of a panel is 64 bytes holding each column's four consecutive weights together (what
/// one 32-bit lane of an integer dot-product instruction takes).
#[inline(always)]
pub(crate) fn w8_index(kp: usize, p: usize, i: usize, j: usize) -> usize {
    (p * kp + (i & !3)) * NR + 4 * j + (i & 3)
}

/// A stored W8A8 weight's int8 value.
#[inline(always)]
pub(crate) fn w8_value(u: u8) -> i8 {
    (u ^ 0x80) as i8
}

/// Where the [`NR`] scales of panel `p`'s block `b` start.
#[inline(always)]
pub(crate) fn w8_block_index(kp: usize, p: usize, b: usize) -> usize {
    (p * (kp / W8_BLOCK) + b) * NR
}

/// `x · (1/s)` rounded half to even and clamped to ±127 (0 when `s` is 0): the one int8
/// quantizer, for W8A8 weights and activations alike. (A product by the reciprocal, as
/// llama.cpp's, rather than a division per element.)
#[inline(always)]
pub(crate) fn quantize(x: f32, s: f32) -> i8 {
    if s == 0.0 {
        0
    } else {
        quantize_by(x, 1.0 / s)
    }
}

/// [`quantize`] given `inv = 1/s` for a nonzero `s`, in integer steps that vectorize:
/// `x · inv + 1.5·2²³` rounds to an integer half to even, which then sits in the low mantissa bits.
#[inline(always)]
pub(crate) fn quantize_by(x: f32, inv: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let q = x * inv;
    let y = q + MAGIC;
    // |q| < 2^22 keeps y in [2^23, 2^24), where one ulp is 1; beyond that the clamp holds.
    let v = if (MAGIC * 0.5..MAGIC * 2.0).contains(&y) {
        y.to_bits() as i32 - MAGIC.to_bits() as i32
    } else if q > 0.0 {
        127
    } else {
        -127
    };
    v.clamp(-127, 127) as i8
}

/// The symmetric scale of values whose largest magnitude is `amax`.
#[inline(always)]
pub(crate) fn scale_of(amax: f32) -> f32 {
    amax / 127.0
}

/// A storage format: its element type and how one element widens to f32 (the value the kernels
/// multiply with; `scale` is the int8 block's, 1 for the others).
pub(crate) trait Format {
    type E: Copy;
    fn widen(e: Self::E, scale: f32) -> f32;
}

pub(crate) struct F32s;
pub(crate) struct F16s;
pub(crate) struct Bf16s;
pub(crate) struct Q8s;

impl Format for F32s {
    type E = f32;
    #[inline(always)]
    fn widen(e: f32, _: f32) -> f32 {
        e
    }
}
impl Format for F16s {
    type E = u16;
    #[inline(always)]
    fn widen(e: u16, _: f32) -> f32 {
        f16_bits_to_f32(e)
    }
}
impl Format for Bf16s {
    type E = u16;
    #[inline(always)]
    fn widen(e: u16, _: f32) -> f32 {
        bf16_bits_to_f32(e)
    }
}
impl Format for Q8s {
    type E = i8;
    #[inline(always)]
    fn widen(e: i8, scale: f32) -> f32 {
        e as f32 * scale
    }
}

/// One matrix's panels seen in their format `F` (with the int8 scales; empty for the others):
/// what the kernels read.
pub(crate) struct Panels<'a, F: Format> {
    pub(crate) d: &'a [F::E],
    pub(crate) scales: &'a [f32],
    pub(crate) k: usize,
    _format: std::marker::PhantomData<F>,
}

impl<'a, F: Format> Panels<'a, F> {
    pub(crate) fn new(d: &'a [F::E], scales: &'a [f32], k: usize) -> Self {
        Panels { d, scales, k, _format: std::marker::PhantomData }
    }

    /// Where panel `p`'s row `i` starts.
    #[inline(always)]
    pub(crate) fn base(&self, p: usize, i: usize) -> usize {
        panel_index(self.k, p, i)
    }

    /// The scale of panel `p`'s row `i` (1 unless int8).
    #[inline(always)]
    pub(crate) fn scale(&self, p: usize, i: usize) -> f32 {
        if self.scales.is_empty() {
            1.0
        } else {
            self.scales[scale_index(self.k, p * NR, i)]
        }
    }

    /// Panel `p`'s row `i` widened to f32.
    #[inline(always)]
    pub(crate) fn row(&self, p: usize, i: usize) -> [f32; NR] {
        let base = self.base(p, i);
        let e: &[F::E; NR] = self.d[base..base + NR].try_into().expect("a panel row");
        let s = self.scale(p, i);
        e.map(|x| F::widen(x, s))
    }
}

/// A `[K, N]` weight matrix in panels.
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: usize,
    pub(crate) data: Storage,
}

/// f32 → f16 bits, round to nearest even (as `half` and numpy do).
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && (h & 1) == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

/// f16 bits → f32, exact and branch-free (subnormals through a power-of-two multiply).
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let magic = f32::from_bits((254 - 15) << 23); // 2^112
    let mut v = f32::from_bits((h & 0x7fff) << 13) * magic;
    if h & 0x7c00 == 0x7c00 {
        v = f32::from_bits(v.to_bits() | 0x7f80_0000);
    }
    f32::from_bits(v.to_bits() | ((h & 0x8000) << 16))
}

/// f32 → bf16 bits, round to nearest even.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
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

    /// The bytes a `[K, N]` matrix of type `ty` holds (what [`PackedMatrix::bytes`] reports once
    /// it exists), without making it.
    pub fn bytes_of(k: usize, n: usize, ty: WeightType) -> usize {
        let panels = n.div_ceil(NR);
        let len = panels * k * NR;
        match ty {
            WeightType::F32 => len * 4,
            WeightType::F16 | WeightType::Bf16 => len * 2,
            WeightType::Q8 => len + n.div_ceil(Q8_BLOCK) * k * 4,
            WeightType::W8A8 => {
                let kp = k.div_ceil(W8_BLOCK) * W8_BLOCK;
                panels * kp * NR + panels * (kp / W8_BLOCK) * NR * 4
            }
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
            WeightType::W8A8 => {
                let kp = k.div_ceil(W8_BLOCK) * W8_BLOCK;
                let blocks = panels * (kp / W8_BLOCK) * NR;
                Storage::W8A8(W8 {
                    kp,
                    q: Aligned::zeroed(panels * kp * NR),
                    scales: vec![0.0; blocks],
                    stage: Vec::new(),
                    next_row: 0,
                })
            }
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
        if let Storage::W8A8(w8) = &mut self.data {
            // A W8A8 scale spans 32 rows: stage them until the block is whole.
            assert!(i == w8.next_row, "set_row: W8A8 rows arrive in order (row {i} after {})", w8.next_row);
            w8.next_row += 1;
            w8.stage.extend_from_slice(row);
            let b = i / W8_BLOCK;
            let rows = W8_BLOCK.min(self.k - b * W8_BLOCK);
            if w8.stage.len() == rows * self.n {
                let stage = std::mem::take(&mut w8.stage);
                let n = self.n;
                for c in 0..n {
                    self.store_w8(c, b, rows, |ii| stage[ii * n + c]);
                }
            }
            return;
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
        if let Storage::W8A8(_) = self.data {
            for j in 0..m {
                for b in 0..k.div_ceil(W8_BLOCK) {
                    let rows = W8_BLOCK.min(k - b * W8_BLOCK);
                    self.store_w8(c0 + j, b, rows, |ii| cols[j * k + b * W8_BLOCK + ii]);
                }
            }
            return;
        }
        for i in 0..k {
            self.store(i, c0, m, |j| cols[j * k + i]);
        }
    }

    /// Quantizes column `c` over block `b` (its first `rows` rows are `w(0..rows)`, the padding
    /// stays 0): the block's max-abs scale and the int8 values.
    fn store_w8(&mut self, c: usize, b: usize, rows: usize, w: impl Fn(usize) -> f32) {
        let Storage::W8A8(w8) = &mut self.data else { unreachable!("store_w8 on a W8A8 matrix only") };
        let (p, j) = (c / NR, c % NR);
        let amax = (0..rows).map(|ii| w(ii).abs()).fold(0.0f32, f32::max);
        let s = scale_of(amax);
        for ii in 0..rows {
            w8.q[w8_index(w8.kp, p, b * W8_BLOCK + ii, j)] = quantize(w(ii), s) as u8 ^ 0x80;
        }
        w8.scales[w8_block_index(w8.kp, p, b) + j] = s;
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
            Storage::W8A8(_) => unreachable!("set_row and set_cols store W8A8 by blocks of rows"),
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
        self.panel_row(c / NR, i)[c % NR]
    }

    /// Panel `p`'s row `i` widened to f32 (the values the kernels multiply with).
    pub(crate) fn panel_row(&self, p: usize, i: usize) -> [f32; NR] {
        let k = self.k;
        match &self.data {
            Storage::F32(d) => Panels::<F32s>::new(d, &[], k).row(p, i),
            Storage::F16(d) => Panels::<F16s>::new(d, &[], k).row(p, i),
            Storage::Bf16(d) => Panels::<Bf16s>::new(d, &[], k).row(p, i),
            Storage::Q8 { q, scales } => Panels::<Q8s>::new(q, scales, k).row(p, i),
            Storage::W8A8(w8) => {
                let s = &w8.scales[w8_block_index(w8.kp, p, i / W8_BLOCK)..];
                std::array::from_fn(|j| w8_value(w8.q[w8_index(w8.kp, p, i, j)]) as f32 * s[j])
            }
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
