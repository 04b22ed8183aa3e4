//! The storage formats: the f16/bf16 bit conversions, a [`Format`] per storage type (element type
//! and how it widens to f32), and [`Panels`], one matrix's panels seen in their format.

use super::layout::{panel_index, scale_index, NR};

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
