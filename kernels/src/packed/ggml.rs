//! llama.cpp's block formats (ggml's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) and kvgpt's
//! W8A8, seen one way: a run of weights along the reduction split into sub-blocks, each holding
//! small integers `q` with an f32 `scale` and `min`, the weight being `scale · q + min` exactly.
//!
//! Every ggml scale is an f16, or an f16 times a 6- or 8-bit integer: exact in f32, so the
//! integers and the two f32s are the file's weights with nothing rounded. The integers are the
//! signed values the weights are multiples of (Q4_0's `q - 8`, Q5_0's `q - 16`, Q6_K's `q - 32`);
//! the types with a minimum keep theirs unsigned. Decoding follows ggml's block structs byte for
//! byte. Quantizing follows ggml's reference quantizers (`quantize_row_*_ref`) for Q8_0, Q4_0,
//! Q4_1, Q5_0 and Q5_1, so a model quantized here holds the blocks `llama-quantize --pure` writes;
//! Q4_K is stored in its format but rounded to nearest, not by llama.cpp's search for scales.

use super::formats::{f16_bits_to_f32, f32_to_f16_bits};
use super::quant;
use super::types::WeightType;

/// One sub-block: `len` (32, or 16 for Q6_K) integers, its scale and its minimum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Sub {
    pub(crate) q: [i8; 32],
    pub(crate) scale: f32,
    pub(crate) min: f32,
}

impl Sub {
    const ZERO: Sub = Sub { q: [0; 32], scale: 0.0, min: 0.0 };
}

/// Elements per ggml super-block (the k-quants).
pub(crate) const QK_K: usize = 256;

impl WeightType {
    /// A ggml block type's elements and bytes per block; None for the others.
    pub fn ggml_block(self) -> Option<(usize, usize)> {
        Some(match self {
            WeightType::Q8_0 => (32, 34),
            WeightType::Q4_0 => (32, 18),
            WeightType::Q4_1 => (32, 20),
            WeightType::Q5_0 => (32, 22),
            WeightType::Q5_1 => (32, 24),
            WeightType::Q4K => (QK_K, 144),
            WeightType::Q5K => (QK_K, 176),
            WeightType::Q6K => (QK_K, 210),
            _ => return None,
        })
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Q4_K and Q5_K's 6-bit scale and minimum of sub-block `j` in their 12 packed bytes.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Decodes one block of type `ty` (`b` holds its bytes) into its sub-blocks `out` (32 / 32 = 1,
/// 256 / 32 = 8, or 256 / 16 = 16 of them). An error names what no ggml quantizer writes.
pub(crate) fn decode(ty: WeightType, b: &[u8], out: &mut [Sub]) -> Result<(), String> {
    let nibble = |qs: &[u8], i: usize, half: usize| (qs[i % half] >> if i < half { 0 } else { 4 }) & 0xF;
    match ty {
        WeightType::Q8_0 => {
            let d = f16_at(b, 0);
            let o = &mut out[0];
            for (q, &x) in o.q.iter_mut().zip(&b[2..34]) {
                *q = x as i8;
            }
            (o.scale, o.min) = (d, 0.0);
        }
        WeightType::Q4_0 | WeightType::Q4_1 => {
            let d = f16_at(b, 0);
            // Q4_0's weight is d · (q - 8); Q4_1's d · q + m.
            let (min, qs, off) =
                if ty == WeightType::Q4_0 { (0.0, &b[2..18], 8) } else { (f16_at(b, 2), &b[4..20], 0) };
            let o = &mut out[0];
            for (i, q) in o.q.iter_mut().enumerate() {
                *q = nibble(qs, i, 16) as i8 - off;
            }
            (o.scale, o.min) = (d, min);
        }
        WeightType::Q5_0 | WeightType::Q5_1 => {
            let d = f16_at(b, 0);
            let (min, at) = if ty == WeightType::Q5_0 { (0.0, 2) } else { (f16_at(b, 2), 4) };
            let qh = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
            let qs = &b[at + 4..at + 20];
            let o = &mut out[0];
            for (i, q) in o.q.iter_mut().enumerate() {
                let u = nibble(qs, i, 16) | (((qh >> i) & 1) as u8) << 4;
                *q = if ty == WeightType::Q5_0 { u as i8 - 16 } else { u as i8 };
            }
            (o.scale, o.min) = (d, min);
        }
        WeightType::Q4K | WeightType::Q5K => {
            let (d, dmin, sc) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
            let (qh, qs) = if ty == WeightType::Q4K { (None, &b[16..144]) } else { (Some(&b[16..48]), &b[48..176]) };
            for (j, o) in out.iter_mut().enumerate().take(8) {
                let (s, m) = scale_min_k4(j, sc);
                let chunk = &qs[32 * (j / 2)..][..32];
                for (l, q) in o.q.iter_mut().enumerate() {
                    let lo = (chunk[l] >> (4 * (j % 2))) & 0xF;
                    let hi = qh.map_or(0, |h| ((h[l] >> j) & 1) << 4);
                    *q = (lo | hi) as i8;
                }
                (o.scale, o.min) = (d * s as f32, -(dmin * m as f32));
            }
        }
        WeightType::Q6K => {
            let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], f16_at(b, 208));
            for (s, o) in out.iter_mut().enumerate().take(16) {
                for (l, q) in o.q.iter_mut().enumerate().take(16) {
                    let e = 16 * s + l;
                    let (half, w) = (e / 128, e % 128);
                    let lo = (ql[half * 64 + w % 64] >> if w < 64 { 0 } else { 4 }) & 0xF;
                    let hi = (qh[half * 32 + w % 32] >> (2 * (w / 32))) & 3;
                    *q = (lo | hi << 4) as i8 - 32;
                }
                (o.scale, o.min) = (d * sc[s] as i8 as f32, 0.0);
            }
        }
        _ => unreachable!("decode: {ty:?} is not a ggml block type"),
    }
    if let Some(o) = out.iter().find(|o| !(o.scale.is_finite() && o.min.is_finite())) {
        return Err(format!("a block's scale is {} (min {})", o.scale, o.min));
    }
    Ok(())
}

/// Encodes one block of a legacy type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) from its sub-block `s`
/// into `b`, byte for byte as ggml's block structs lay it out: [`decode`]'s inverse. The scale and
/// minimum are f16 values already (the quantizer rounds them), so nothing is rounded here.
fn encode(ty: WeightType, s: &Sub, b: &mut [u8]) {
    let put16 = |b: &mut [u8], at: usize, v: f32| b[at..at + 2].copy_from_slice(&f32_to_f16_bits(v).to_le_bytes());
    // The unsigned 4- or 5-bit value the block stores for element i.
    let stored = |i: usize| match ty {
        WeightType::Q4_0 => (s.q[i] + 8) as u8,
        WeightType::Q5_0 => (s.q[i] + 16) as u8,
        _ => s.q[i] as u8,
    };
    put16(b, 0, s.scale);
    let at = match ty {
        WeightType::Q8_0 => {
            for (x, &q) in b[2..34].iter_mut().zip(&s.q) {
                *x = q as u8;
            }
            return;
        }
        WeightType::Q4_0 | WeightType::Q5_0 => 2,
        WeightType::Q4_1 | WeightType::Q5_1 => {
            put16(b, 2, s.min);
            4
        }
        _ => unreachable!("encode: {ty:?} is not a legacy ggml block type"),
    };
    let at = if matches!(ty, WeightType::Q5_0 | WeightType::Q5_1) {
        let qh = (0..32).fold(0u32, |h, i| h | (((stored(i) >> 4) & 1) as u32) << i);
        b[at..at + 4].copy_from_slice(&qh.to_le_bytes());
        at + 4
    } else {
        at
    };
    for j in 0..16 {
        b[at + j] = (stored(j) & 0xF) | (stored(j + 16) & 0xF) << 4;
    }
}

/// Quantizes one GGUF row `x` of a legacy block type (a whole number of blocks of 32) into
/// `out`, as ggml's reference quantizer (`quantize_row_*_ref`) writes it: the bytes
/// `llama-quantize --pure` writes for the same f32 weights.
pub fn quantize_blocks(ty: WeightType, x: &[f32], out: &mut [u8]) -> Result<(), String> {
    let (elems, bytes) = match ty {
        WeightType::Q8_0 | WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q5_0 | WeightType::Q5_1 => {
            ty.ggml_block().expect("a ggml block type")
        }
        _ => return Err(format!("{} has no quantizer that writes ggml's blocks as llama.cpp's does", ty.name())),
    };
    if !x.len().is_multiple_of(elems) || out.len() != x.len() / elems * bytes {
        return Err(format!("{} weights into {} bytes of {} blocks", x.len(), out.len(), ty.name()));
    }
    let mut sub = [Sub::ZERO];
    for (blk, b) in x.chunks_exact(elems).zip(out.chunks_exact_mut(bytes)) {
        quantize(ty, blk, &mut sub);
        encode(ty, &sub[0], b);
    }
    Ok(())
}

/// The f32 weights of one block, as ggml (and gguf-py) widen them: `scale · q`, plus `min` for
/// the types that have one.
pub(crate) fn widen(subs: &[Sub], sub: usize, mins: bool, out: &mut [f32]) {
    for (o, s) in out.chunks_mut(sub).zip(subs) {
        for (x, &q) in o.iter_mut().zip(&s.q) {
            let v = s.scale * q as f32;
            *x = if mins { v + s.min } else { v };
        }
    }
}

/// `v` rounded to f16, as ggml stores its scales, and widened back.
fn half16(v: f32) -> f32 {
    f16_bits_to_f32(f32_to_f16_bits(v))
}

/// ggml's `quantize_row_q8_0_ref` of one block of up to 32 values (zero-padded): the scale as
/// stored (rounded to f16) and the integers.
pub(crate) fn ggml_q8_0(x: &[f32]) -> (f32, [i8; 32]) {
    let mut padded = [0.0f32; 32];
    padded[..x.len()].copy_from_slice(x);
    let mut sub = [Sub::ZERO];
    quantize(WeightType::Q8_0, &padded, &mut sub);
    (sub[0].scale, sub[0].q)
}

/// Quantizes one unit of weights `x` (32 values, or 256 for Q4_K; zero-padded by the caller) of
/// type `ty` into its sub-blocks, as ggml's reference quantizer for the type does (W8A8: kvgpt's
/// own, an f32 scale; Q4_K: min and max per sub-block, see DESIGN).
pub(crate) fn quantize(ty: WeightType, x: &[f32], out: &mut [Sub]) {
    // ggml's `(int8_t)(v + off)` with `MIN(top, …)`: truncation toward zero of a positive value.
    let trunc = |v: f32, top: f32| v.trunc().clamp(0.0, top) as i8;
    let amax_signed = |x: &[f32]| {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                (amax, max) = (v.abs(), v);
            }
        }
        max
    };
    let min_max = |x: &[f32]| x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    let o = &mut out[0];
    match ty {
        WeightType::W8A8 => (o.scale, o.min) = (quant::quantize_block(x, &mut o.q), 0.0),
        WeightType::Q8_0 => {
            let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            let id = inv(d);
            for (q, &v) in o.q.iter_mut().zip(x) {
                *q = (v * id).round() as i8;
            }
            (o.scale, o.min) = (half16(d), 0.0);
        }
        WeightType::Q4_0 | WeightType::Q5_0 => {
            let levels = if ty == WeightType::Q4_0 { 16.0 } else { 32.0 };
            let d = amax_signed(x) / -(levels / 2.0);
            let id = inv(d);
            for (q, &v) in o.q.iter_mut().zip(x) {
                *q = trunc(v * id + (levels / 2.0 + 0.5), levels - 1.0);
            }
            o.q.iter_mut().for_each(|q| *q -= (levels / 2.0) as i8);
            (o.scale, o.min) = (half16(d), 0.0);
        }
        WeightType::Q4_1 | WeightType::Q5_1 => {
            let top = if ty == WeightType::Q4_1 { 15.0 } else { 31.0 };
            let (lo, hi) = min_max(x);
            let d = (hi - lo) / top;
            let id = inv(d);
            for (q, &v) in o.q.iter_mut().zip(x) {
                *q = trunc((v - lo) * id + 0.5, top);
            }
            (o.scale, o.min) = (half16(d), half16(lo));
        }
        WeightType::Q4K => quantize_q4k(x, out),
        _ => unreachable!("quantize: {ty:?} is read from GGUF files only"),
    }
}

/// Q4_K by rounding to nearest: each sub-block of 32 spans its min (at most 0) to its max in 15
/// steps; the eight steps and mins are then put on 6-bit grids under an f16 `d` and `dmin`, and
/// the values quantized against the scales as stored. (ggml's own quantizer searches for better
/// scales; this one is simpler and stores the same format.)
fn quantize_q4k(x: &[f32], out: &mut [Sub]) {
    let mut steps = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    for (j, blk) in x.chunks(32).enumerate() {
        let (lo, hi) = blk.iter().fold((0.0f32, 0.0f32), |(l, h), &v| (l.min(v), h.max(v)));
        (steps[j], mins[j]) = ((hi - lo) / 15.0, -lo);
    }
    let d = half16(steps.iter().fold(0.0f32, |m, &v| m.max(v)) / 63.0);
    let dmin = half16(mins.iter().fold(0.0f32, |m, &v| m.max(v)) / 63.0);
    let six = |v: f32, by: f32| if by > 0.0 { (v / by).round().clamp(0.0, 63.0) } else { 0.0 };
    for (j, (o, blk)) in out.iter_mut().zip(x.chunks(32)).enumerate() {
        let (scale, min) = (d * six(steps[j], d), -(dmin * six(mins[j], dmin)));
        let id = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (q, &v) in o.q.iter_mut().zip(blk) {
            *q = ((v - min) * id).round().clamp(0.0, 15.0) as i8;
        }
        (o.scale, o.min) = (scale, min);
    }
}

/// Room for a unit's sub-blocks (at most 256 / 16), on the stack: loading quantizes and decodes
/// millions of units.
pub(crate) const NO_SUBS: [Sub; QK_K / 16] = [Sub::ZERO; QK_K / 16];
