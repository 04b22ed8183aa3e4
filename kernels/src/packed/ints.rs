//! Integer weights, multiplied with activations quantized per token and block of 32 (see the
//! `int8` module): W8A8 and llama.cpp's block types, held as [`ggml`](super::ggml) decodes them.
//!
//! Per output column and sub-block of `sub` reduction rows (32, or 16 for Q6_K): integers `q`,
//! an f32 `scale` and, for the types that have one, an f32 `min`; the weight is `scale · q + min`.
//! The integers are held in 8 bits (offset by 128, [`w8_index`]) or, for the 4-bit types, in
//! nibbles ([`w4_index`]); 5- and 6-bit values are held in 8 bits.

use super::ggml::{self, Sub};
use super::layout::Q8_BLOCK;
use super::layout::{panel_index, sub_block_index, w4_index, w8_index, w8_value, NR, W8_BLOCK};
use super::quant;
use super::types::WeightType;
use crate::aligned::Aligned;

/// How a type's integers are held.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    /// 4-bit nibbles rather than bytes.
    pub(crate) four: bool,
    /// Rows per scale.
    pub(crate) sub: usize,
    /// Whether each sub-block has a minimum.
    pub(crate) mins: bool,
    /// Rows quantized together: one ggml block (32, or 256 for the k-quants).
    pub(crate) unit: usize,
    /// What a stored nibble is above its value (Q4_0's 8; 0 for the types with minimums).
    pub(crate) offset: i32,
}

impl WeightType {
    /// How the integer types are held; None for the float types and `q8`.
    pub(crate) fn int_shape(self) -> Option<Shape> {
        let s = |four, sub, mins, unit| Some(Shape { four, sub, mins, unit, offset: 0 });
        match self {
            WeightType::W8A8 | WeightType::Q8_0 | WeightType::Q5_0 => s(false, 32, false, 32),
            WeightType::Q4_0 => Some(Shape { offset: 8, ..s(true, 32, false, 32)? }),
            WeightType::Q4_1 => s(true, 32, true, 32),
            WeightType::Q5_1 => s(false, 32, true, 32),
            WeightType::Q4K => s(true, 32, true, ggml::QK_K),
            WeightType::Q5K => s(false, 32, true, ggml::QK_K),
            WeightType::Q6K => s(false, 16, false, ggml::QK_K),
            WeightType::F32 | WeightType::F16 | WeightType::Bf16 | WeightType::Q8 => None,
        }
    }

    /// Bytes of a `[K, N]` matrix held as this type, without the panels' padding: what one pass
    /// over it streams.
    pub fn unpadded_bytes(self, k: usize, n: usize) -> u64 {
        let kn = (k * n) as u64;
        match self {
            WeightType::F32 => 4 * kn,
            WeightType::F16 | WeightType::Bf16 => 2 * kn,
            WeightType::Q8 => kn + 4 * (k * n.div_ceil(Q8_BLOCK)) as u64,
            ty => {
                let sh = ty.int_shape().expect("an integer type");
                let subs = (n * k.div_ceil(sh.sub)) as u64;
                kn / if sh.four { 2 } else { 1 } + 4 * subs * if sh.mins { 2 } else { 1 }
            }
        }
    }
}

/// A `[K, N]` matrix of integer weights in panels of [`NR`] columns, the reduction padded with
/// zero rows to `kp`, a multiple of [`W8_BLOCK`].
pub(crate) struct Ints {
    pub(crate) ty: WeightType,
    /// How `ty`'s integers are held (`ty.int_shape()`).
    pub(crate) sh: Shape,
    pub(crate) kp: usize,
    /// Bytes (int8 offset by 128: the operand order of VNNI's unsigned × signed dot product) or
    /// nibble pairs (unsigned 0..15, [`Shape::offset`] above their values).
    pub(crate) q: Aligned<u8>,
    /// Per panel, sub-block and lane ([`sub_block_index`]).
    pub(crate) scales: Vec<f32>,
    /// As `scales`; empty for the types without minimums.
    pub(crate) mins: Vec<f32>,
    /// Rows streamed in by `set_row` until a unit is whole.
    stage: Vec<f32>,
    next_row: usize,
}

/// A `[K, N]` matrix's sizes held as shape `sh`: the padded reduction, the bytes of its integers,
/// and how many scales (and as many minimums, if any) it has.
fn sizes(sh: Shape, k: usize, n: usize) -> (usize, usize, usize) {
    let (kp, panels) = (k.div_ceil(W8_BLOCK) * W8_BLOCK, n.div_ceil(NR));
    (kp, panels * kp * NR / if sh.four { 2 } else { 1 }, panels * (kp / sh.sub) * NR)
}

impl Ints {
    pub(crate) fn zeros(ty: WeightType, k: usize, n: usize) -> Ints {
        let sh = ty.int_shape().expect("an integer type");
        let (kp, q_bytes, per_sub) = sizes(sh, k, n);
        Ints {
            ty,
            sh,
            kp,
            q: Aligned::zeroed(q_bytes),
            scales: vec![0.0; per_sub],
            mins: if sh.mins { vec![0.0; per_sub] } else { Vec::new() },
            stage: Vec::new(),
            next_row: 0,
        }
    }

    /// Bytes held, padding included.
    pub(crate) fn bytes(&self) -> usize {
        self.q.len() + 4 * (self.scales.len() + self.mins.len())
    }

    /// The bytes a `[K, N]` matrix of integer type `ty` holds.
    pub(crate) fn bytes_of(ty: WeightType, k: usize, n: usize) -> usize {
        let sh = ty.int_shape().expect("an integer type");
        let (_, q_bytes, per_sub) = sizes(sh, k, n);
        q_bytes + 4 * per_sub * if sh.mins { 2 } else { 1 }
    }

    #[inline(always)]
    pub(crate) fn value(&self, p: usize, i: usize, j: usize) -> i32 {
        if self.sh.four {
            let (at, shift) = w4_index(self.kp, p, i, j);
            ((self.q[at] >> shift) & 0xF) as i32 - self.sh.offset
        } else {
            w8_value(self.q[w8_index(self.kp, p, i, j)]) as i32
        }
    }

    /// Element (row `i`, lane `j`) of panel `p` widened: `scale · q (+ min)`.
    #[inline(always)]
    pub(crate) fn widened(&self, p: usize, i: usize, j: usize) -> f32 {
        let at = sub_block_index(self.kp, self.sh.sub, p, i / self.sh.sub) + j;
        let v = self.scales[at] * self.value(p, i, j) as f32;
        if self.mins.is_empty() {
            v
        } else {
            v + self.mins[at]
        }
    }

    /// Panel `p`'s row `i` widened.
    pub(crate) fn row(&self, p: usize, i: usize) -> [f32; NR] {
        let mut out = [0.0f32; NR];
        for (j, o) in out.iter_mut().enumerate() {
            *o = self.widened(p, i, j);
        }
        out
    }

    /// Stores column `c`'s sub-blocks from sub-block `s0` on (those past the padded reduction
    /// are dropped: a unit's padding).
    fn store(&mut self, c: usize, s0: usize, subs: &[Sub]) {
        let (p, j) = (c / NR, c % NR);
        for (s, sb) in
            subs.iter().enumerate().map(|(s, sb)| (s0 + s, sb)).take_while(|(s, _)| s * self.sh.sub < self.kp)
        {
            for (ii, &q) in sb.q[..self.sh.sub].iter().enumerate() {
                let i = s * self.sh.sub + ii;
                if self.sh.four {
                    let (at, shift) = w4_index(self.kp, p, i, j);
                    let u = (q as i32 + self.sh.offset) as u8 & 0xF;
                    self.q[at] = (self.q[at] & !(0xF << shift)) | (u << shift);
                } else {
                    self.q[w8_index(self.kp, p, i, j)] = q as u8 ^ 0x80;
                }
            }
            let at = sub_block_index(self.kp, self.sh.sub, p, s) + j;
            self.scales[at] = sb.scale;
            if !self.mins.is_empty() {
                self.mins[at] = sb.min;
            }
        }
    }

    /// Quantizes column `c`'s rows `u0..u0 + len` (`w(ii)` for `ii < len`), one unit, zero-padded.
    fn quantize_unit(&mut self, c: usize, u0: usize, len: usize, w: impl Fn(usize) -> f32) {
        let (mut x, mut subs) = ([0.0f32; ggml::QK_K], ggml::NO_SUBS);
        let (x, subs) = (&mut x[..self.sh.unit], &mut subs[..self.sh.unit / self.sh.sub]);
        x[..len].iter_mut().enumerate().for_each(|(ii, v)| *v = w(ii));
        ggml::quantize(self.ty, x, subs);
        self.store(c, u0 / self.sh.sub, subs);
    }

    /// Row `i` of `k` (`n` values), rows in order: staged until a unit is whole, then quantized.
    pub(crate) fn set_row(&mut self, i: usize, k: usize, row: &[f32]) {
        assert!(i == self.next_row, "set_row: integer rows arrive in order (row {i} after {})", self.next_row);
        self.next_row += 1;
        self.stage.extend_from_slice(row);
        let u0 = i / self.sh.unit * self.sh.unit;
        let rows = self.sh.unit.min(k - u0);
        let n = row.len();
        if self.stage.len() == rows * n {
            let stage = std::mem::take(&mut self.stage);
            for c in 0..n {
                self.quantize_unit(c, u0, rows, |ii| stage[ii * n + c]);
            }
        }
    }

    /// W8A8 from an f32 matrix's panels `d` (`k` rows, `n` columns, laid out as [`panel_index`]
    /// spells): what streaming its rows through [`Ints::set_row`] stores, byte for byte, a
    /// panel's block of 32 rows at a time (2 KiB, in L1) instead of a whole row block's stage.
    pub(crate) fn set_w8a8_panels(&mut self, d: &[f32], k: usize, n: usize) {
        assert!(self.ty == WeightType::W8A8 && self.next_row == 0, "set_w8a8_panels: a fresh W8A8 matrix");
        for p in 0..n.div_ceil(NR) {
            for s in 0..self.kp / W8_BLOCK {
                let i0 = s * W8_BLOCK;
                let rows = W8_BLOCK.min(k.saturating_sub(i0));
                let lanes = NR.min(n - p * NR);
                let row = |ii: usize| -> [f32; NR] {
                    if ii < rows {
                        d[panel_index(k, p, i0 + ii)..][..NR].try_into().expect("a panel row")
                    } else {
                        [0.0; NR]
                    }
                };
                // quant::quantize_block's rule, the block's 16 columns at once.
                let mut amax = [0.0f32; NR];
                for ii in 0..rows {
                    amax.iter_mut().zip(row(ii)).for_each(|(m, v)| *m = quant::larger_magnitude(*m, v));
                }
                let sc = amax.map(quant::scale_of);
                let inv = quant::inverses(sc);
                for g in (0..W8_BLOCK).step_by(4) {
                    // Rows g..g+4 of the 16 columns: one 64-byte line, column-major ([`w8_index`]).
                    let line = &mut self.q[w8_index(self.kp, p, i0 + g, 0)..][..4 * NR];
                    for m in 0..4 {
                        let q = quant::quantize_each(row(g + m), sc, inv);
                        for j in 0..lanes {
                            line[4 * j + m] = q[j] as u8 ^ 0x80;
                        }
                    }
                }
                let at = sub_block_index(self.kp, self.sh.sub, p, s);
                self.scales[at..at + lanes].copy_from_slice(&sc[..lanes]);
            }
        }
        self.next_row = k;
    }

    /// Column `c` whole (`k` values), quantized unit by unit.
    pub(crate) fn set_col(&mut self, c: usize, k: usize, col: &[f32]) {
        for u0 in (0..k).step_by(self.sh.unit) {
            self.quantize_unit(c, u0, self.sh.unit.min(k - u0), |ii| col[u0 + ii]);
        }
    }

    /// Column `c` from its blocks as a GGUF row holds them (the file's own weights, decoded).
    pub(crate) fn set_col_blocks(&mut self, c: usize, k: usize, raw: &[u8]) -> Result<(), String> {
        let (elems, bytes) = self.ty.ggml_block().expect("a ggml block type");
        if !k.is_multiple_of(elems) || raw.len() != k / elems * bytes {
            return Err(format!("{} bytes of {} blocks for a row of {k}", raw.len(), self.ty.name()));
        }
        let mut subs = ggml::NO_SUBS;
        let subs = &mut subs[..elems / self.sh.sub];
        for (b, blk) in raw.chunks_exact(bytes).enumerate() {
            ggml::decode(self.ty, blk, subs)?;
            // Held, the integers meet AVX2's sign trick, which cannot negate -128; widened to
            // f32 (`widen_blocks`) they are fine.
            if subs.iter().any(|s| s.q.contains(&i8::MIN)) {
                return Err(format!(
                    "a {} block holds -128, which no ggml quantizer writes (it rounds within ±127); \
                     --dtype f32 holds this file widened",
                    self.ty.name()
                ));
            }
            self.store(c, b * elems / self.sh.sub, subs);
        }
        Ok(())
    }
}

/// One GGUF row of type `ty` (`k` weights in `raw`) widened to f32 as ggml widens it.
pub fn widen_blocks(ty: WeightType, raw: &[u8], out: &mut [f32]) -> Result<(), String> {
    let (elems, bytes) = ty.ggml_block().ok_or_else(|| format!("{} is not a ggml block type", ty.name()))?;
    let sh = ty.int_shape().expect("block types are integer types");
    if !raw.len().is_multiple_of(bytes) || out.len() != raw.len() / bytes * elems {
        return Err(format!("{} bytes of {} blocks for {} weights", raw.len(), ty.name(), out.len()));
    }
    let mut subs = ggml::NO_SUBS;
    let subs = &mut subs[..elems / sh.sub];
    for (blk, o) in raw.chunks_exact(bytes).zip(out.chunks_mut(elems)) {
        ggml::decode(ty, blk, subs)?;
        ggml::widen(subs, sh.sub, sh.mins, o);
    }
    Ok(())
}
