//! How K/V rows are held (`--kv-dtype`): [`KvType`], storing a row of `HS` values into its words
//! ([`kv_store`]) and widening it back ([`kv_load`]), and the row formats attention reads them
//! through ([`RowFormat`]: one value for the scalar bodies, 16 lanes for the x86 ones).
//!
//! A row is held in 4-byte words (the pool's blocks are `f32` buffers; another type's bytes sit in
//! them little-endian, as a byte array would). f16 and bf16 are rounded to nearest even; q8_0 is
//! ggml's `block_q8_0` (an f16 scale `d`, then 32 signed bytes) quantized as ggml's reference
//! quantizer does. Widening is exact for every type (an f16 or bf16 is an f32; `d · q` has at most
//! 11 + 8 significant bits), so attention over a typed row computes the same chains, in the same
//! order, as over its widened f32 values: the same bits on every path.

use crate::lanes::Lanes;
use crate::packed::{bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, ggml_q8_0, NR};

/// The type K and V are held in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    #[default]
    F32,
    F16,
    Bf16,
    Q8_0,
}

/// Values per q8_0 block, and its bytes (an f16 scale and 32 bytes).
const QK: usize = 32;
const Q8_BYTES: usize = 34;

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Bf16, KvType::Q8_0];

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
        }
    }

    pub fn by_name(name: &str) -> Option<KvType> {
        KvType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Bytes of one row of `hs` values (q8_0: 34 per 32; a row whose last block is not full has
    /// it zero-padded, so any head size can be held).
    pub fn row_bytes(self, hs: usize) -> usize {
        match self {
            KvType::F32 => 4 * hs,
            KvType::F16 | KvType::Bf16 => 2 * hs,
            KvType::Q8_0 => hs.div_ceil(QK) * Q8_BYTES,
        }
    }

    /// Words one row of `hs` values takes in a block (its bytes, rounded up to whole words).
    pub fn row_words(self, hs: usize) -> usize {
        self.row_bytes(hs).div_ceil(4)
    }
}

/// The bytes of a row's words, little-endian (as the words lie in memory on x86 and ARM).
fn byte(row: &[f32], i: usize) -> u8 {
    (row[i / 4].to_bits() >> (8 * (i % 4))) as u8
}

fn set_byte(row: &mut [f32], i: usize, b: u8) {
    let (w, shift) = (row[i / 4].to_bits(), 8 * (i % 4));
    row[i / 4] = f32::from_bits((w & !(0xff << shift)) | (u32::from(b) << shift));
}

fn half(row: &[f32], i: usize) -> u16 {
    (row[i / 2].to_bits() >> (16 * (i % 2))) as u16
}

/// Stores `x` (`[HS]`) as `ty` into `row` (`ty.row_words(HS)` words; unused bytes zero).
pub fn kv_store(ty: KvType, row: &mut [f32], x: &[f32]) {
    let hs = x.len();
    assert!(row.len() >= ty.row_words(hs), "a row of {hs} values as {} needs {} words", ty.name(), ty.row_words(hs));
    let bits16 = |f: fn(f32) -> u16, row: &mut [f32]| {
        for (w, pair) in row.iter_mut().zip(x.chunks(2)) {
            let hi = pair.get(1).map_or(0, |&v| f(v));
            *w = f32::from_bits(u32::from(f(pair[0])) | (u32::from(hi) << 16));
        }
    };
    match ty {
        KvType::F32 => row[..hs].copy_from_slice(x),
        KvType::F16 => bits16(f32_to_f16_bits, row),
        KvType::Bf16 => bits16(f32_to_bf16_bits, row),
        KvType::Q8_0 => {
            row[..ty.row_words(hs)].fill(0.0);
            for (b, chunk) in x.chunks(QK).enumerate() {
                let (d, q) = ggml_q8_0(chunk);
                let at = b * Q8_BYTES;
                let [lo, hi] = f32_to_f16_bits(d).to_le_bytes();
                set_byte(row, at, lo);
                set_byte(row, at + 1, hi);
                for (i, &v) in q.iter().enumerate().take(chunk.len()) {
                    set_byte(row, at + 2 + i, v as u8);
                }
            }
        }
    }
}

/// Widens a row stored by [`kv_store`] back into `out` (`[HS]`): the values attention reads.
pub fn kv_load(ty: KvType, out: &mut [f32], row: &[f32]) {
    match ty {
        KvType::F32 => out.copy_from_slice(&row[..out.len()]),
        KvType::F16 => out.iter_mut().enumerate().for_each(|(i, o)| *o = F16s::get(row, i)),
        KvType::Bf16 => out.iter_mut().enumerate().for_each(|(i, o)| *o = Bf16s::get(row, i)),
        KvType::Q8_0 => out.iter_mut().enumerate().for_each(|(i, o)| *o = Q8s::get(row, i)),
    }
}

/// How attention reads a row of one type: value `i` (the scalar bodies) or 16 lanes from value
/// `c` (a multiple of 16; the x86 bodies), the same values either way.
pub(crate) trait RowFormat {
    /// Whether a tile of queries reads these rows faster widened to f32 once (q8_0: a scale, a
    /// sign extension and a convert per 16 lanes) than converted for each query (f16 and bf16:
    /// one instruction; measured, DESIGN.md "K/V types").
    const WIDEN_PER_TILE: bool = false;
    /// Words per row of `hs` values.
    fn words(hs: usize) -> usize;
    fn get(row: &[f32], i: usize) -> f32;
    /// # Safety
    /// `row` points at a row of at least `c + 16` values of this format.
    unsafe fn lanes<L: Lanes>(row: *const f32, c: usize) -> L;
}

pub(crate) struct F32s;
pub(crate) struct F16s;
pub(crate) struct Bf16s;
pub(crate) struct Q8s;

impl RowFormat for F32s {
    #[inline(always)]
    fn words(hs: usize) -> usize {
        hs
    }
    #[inline(always)]
    fn get(row: &[f32], i: usize) -> f32 {
        row[i]
    }
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(row: *const f32, c: usize) -> L {
        // SAFETY (caller): values c..c+16 lie in the row.
        L::load(row.add(c))
    }
}

impl RowFormat for F16s {
    #[inline(always)]
    fn words(hs: usize) -> usize {
        hs.div_ceil(2)
    }
    #[inline(always)]
    fn get(row: &[f32], i: usize) -> f32 {
        f16_bits_to_f32(half(row, i))
    }
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(row: *const f32, c: usize) -> L {
        // SAFETY (caller): the row's first c + 16 halves are its words' bytes (u16 needs less
        // alignment than f32, and any bytes are a valid u16).
        L::f16_row(std::slice::from_raw_parts(row as *const u16, c + NR), c)
    }
}

impl RowFormat for Bf16s {
    #[inline(always)]
    fn words(hs: usize) -> usize {
        hs.div_ceil(2)
    }
    #[inline(always)]
    fn get(row: &[f32], i: usize) -> f32 {
        bf16_bits_to_f32(half(row, i))
    }
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(row: *const f32, c: usize) -> L {
        // SAFETY: as for f16.
        L::bf16_row(std::slice::from_raw_parts(row as *const u16, c + NR), c)
    }
}

impl RowFormat for Q8s {
    const WIDEN_PER_TILE: bool = true;
    #[inline(always)]
    fn words(hs: usize) -> usize {
        KvType::Q8_0.row_words(hs)
    }
    #[inline(always)]
    fn get(row: &[f32], i: usize) -> f32 {
        let at = i / QK * Q8_BYTES;
        let d = f16_bits_to_f32(u16::from_le_bytes([byte(row, at), byte(row, at + 1)]));
        d * byte(row, at + 2 + i % QK) as i8 as f32
    }
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(row: *const f32, c: usize) -> L {
        // SAFETY (caller): block c / 32 of the row (34 bytes from `at`) lies in its words; bytes
        // are valid as u8 and i8 at any alignment.
        let (bytes, at) = (row as *const u8, c / QK * Q8_BYTES);
        let d = f16_bits_to_f32(u16::from_le_bytes([*bytes.add(at), *bytes.add(at + 1)]));
        L::q8_row(std::slice::from_raw_parts(bytes.add(at + 2 + c % QK) as *const i8, NR), 0, d)
    }
}
