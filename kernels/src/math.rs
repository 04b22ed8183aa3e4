//! Elementary functions written so that one body vectorizes and gives the same bits everywhere:
//! no table look-ups, no branches, no libm calls, rounding done with the 1.5·2²³ trick.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Adding and subtracting 1.5·2²³ rounds an f32 of magnitude < 2²² to the nearest integer.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `e^x` to about 2 ulp for x in [-87, 88.7]; inputs below -87 give e^-87 (≈1.6e-38), which is
/// as good as 0 in a softmax.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.7);
    let m = x * LOG2E + ROUND_MAGIC; // the integer n = round(x·log2 e) in its low mantissa bits
    let n = m - ROUND_MAGIC;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    // Taylor series of e^r on |r| <= ln2/2, degree 7 (truncation error < 3e-9).
    let mut p: f32 = 1.0 / 5040.0;
    p = p.mul_add(r, 1.0 / 720.0);
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    // 2^n from n's bits (integer steps that vectorize, unlike the saturating `n as i32`).
    let ni = m.to_bits() as i32 - ROUND_MAGIC.to_bits() as i32;
    let bits = ((ni + 127) as u32) << 23;
    p * f32::from_bits(bits)
}

/// `tanh(y) = 1 - 2 / (e^{2y} + 1)`, absolute error about 1e-7.
#[inline(always)]
pub fn tanh_approx(y: f32) -> f32 {
    let e = exp_approx(2.0 * y.clamp(-20.0, 20.0));
    1.0 - 2.0 / (e + 1.0)
}

/// GPT-2's `gelu_new`: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
#[inline(always)]
pub fn gelu_new_scalar(x: f32) -> f32 {
    const S: f32 = 0.797_884_6; // √(2/π)
    let inner = S * (0.044715 * x * x).mul_add(x, x);
    0.5 * x * (1.0 + tanh_approx(inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp_approx(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_approx(0.0), 1.0);
        assert!(exp_approx(-1000.0) < 1e-37);
    }

    #[test]
    fn tanh_and_gelu_match_f64() {
        let mut x = -12.0f32;
        while x < 12.0 {
            let t = (x as f64).tanh();
            assert!((tanh_approx(x) as f64 - t).abs() < 3e-7, "tanh({x})");
            let xf = x as f64;
            let g = 0.5 * xf * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xf + 0.044715 * xf.powi(3))).tanh());
            assert!((gelu_new_scalar(x) as f64 - g).abs() < 2e-6 * (1.0 + xf.abs()), "gelu({x})");
            x += 0.0071;
        }
    }
}
