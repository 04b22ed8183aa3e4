//! The one int8 quantizer, for W8A8's weights and every integer type's activations. Imports
//! nothing.

/// `x · (1/s)` rounded half to even and clamped to ±127 (0 when `s` is 0): the one int8
/// quantizer, for W8A8 weights and activations alike. (A product by the reciprocal, as
/// llama.cpp's, rather than a division per element.)
#[inline(always)]
pub(crate) fn quantize(x: f32, s: f32) -> i8 {
    quantize_each([x], [s], inverses([s]))[0]
}

/// [`quantize`] of `N` values, each by its own scale: the same integers, with one division per
/// scale rather than per value (`inv[j]` is `1 / s[j]`, see [`inverses`]), so it vectorizes.
#[inline(always)]
pub(crate) fn quantize_each<const N: usize>(x: [f32; N], s: [f32; N], inv: [f32; N]) -> [i8; N] {
    std::array::from_fn(|j| if s[j] == 0.0 { 0 } else { quantize_by(x[j], inv[j]) })
}

/// The `1 / s` [`quantize_each`] takes (0 where `s` is 0: never used).
#[inline(always)]
pub(crate) fn inverses<const N: usize>(s: [f32; N]) -> [f32; N] {
    s.map(|s| if s == 0.0 { 0.0 } else { 1.0 / s })
}

/// [`quantize`] given `inv = 1/s` for a nonzero `s`, in integer steps that vectorize:
/// `x · inv + 1.5·2²³` rounds to an integer half to even, which then sits in the low mantissa bits.
#[inline(always)]
pub(crate) fn quantize_by(x: f32, inv: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let q = x * inv;
    let y = q + MAGIC;
    // |q| < 2^22 keeps y in [2^23, 2^24), where one ulp is 1; beyond that the clamp holds.
    // Both sides computed, then selected, so that a block of them vectorizes.
    let rounded = (y.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let saturated = if q > 0.0 { 127 } else { -127 };
    let v = if (MAGIC * 0.5..MAGIC * 2.0).contains(&y) { rounded } else { saturated };
    v.clamp(-127, 127) as i8
}

/// The symmetric scale of values whose largest magnitude is `amax`.
#[inline(always)]
pub(crate) fn scale_of(amax: f32) -> f32 {
    amax / 127.0
}

/// W8A8's rule for one block of weights `x` into `q`: the scale of their largest magnitude,
/// returned, and each weight quantized by it.
#[inline(always)]
pub(crate) fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let s = scale_of(x.iter().fold(0.0f32, |m, &v| larger_magnitude(m, v)));
    for (q, &v) in q.iter_mut().zip(x) {
        *q = quantize(v, s);
    }
    s
}

/// The running largest magnitude `m` with `v` seen (a NaN is passed over): what a block's scale
/// is of.
#[inline(always)]
pub(crate) fn larger_magnitude(m: f32, v: f32) -> f32 {
    m.max(v.abs())
}
