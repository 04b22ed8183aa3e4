//! Choosing the next token: greedy (argmax, as HF `generate()` by default) or sampled with
//! temperature, top-k and top-p, from a named portable RNG.
//!
//! Reproducibility: the RNG is ChaCha20 (`rand_chacha::ChaCha20Rng::seed_from_u64`, whose output
//! is fixed by the ChaCha20 specification); a uniform draw is the top 53 bits of one `next_u64`
//! scaled to [0, 1); probabilities use the engine's own `exp` and sums in a fixed order. The same
//! seed gives the same tokens on every platform and version.

use kvgpt_kernels::exp_approx;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

/// How to pick tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens (None or 0: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches p (None or 1: all).
    pub top_p: Option<f32>,
    pub seed: u64,
}

impl Sampling {
    pub const GREEDY: Sampling = Sampling { temperature: 0.0, top_k: None, top_p: None, seed: 0 };

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

pub struct Sampler {
    cfg: Sampling,
    rng: ChaCha20Rng,
    /// (probability, id) candidates, allocated once.
    cand: Vec<(f32, u32)>,
}

/// The index of the largest logit; ties go to the lowest id (as torch.argmax).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(cfg: Sampling, vocab: usize) -> Sampler {
        Sampler { cfg, rng: ChaCha20Rng::seed_from_u64(cfg.seed), cand: Vec::with_capacity(vocab) }
    }

    /// A uniform number in [0, 1) from the top 53 bits of one 64-bit draw.
    fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// The next token for these logits. HF's order: temperature, then top-k, then top-p.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.is_greedy() {
            return argmax(logits);
        }
        // A tiny temperature is the limit T → 0: all the probability on the most likely token
        // (shared evenly by exact ties). 1/T may overflow (T below ~3e-39), and l/T may overflow
        // for large logits; then the logits are shifted by their maximum first, so the scaled
        // values are 0 for the maximum and -inf or finite below it, never NaN.
        let inv_t = (1.0 / self.cfg.temperature).min(f32::MAX);
        let (lo, hi) = logits.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &l| (a.min(l), b.max(l)));
        let shift = if (lo.abs().max(hi.abs()) * inv_t).is_finite() { 0.0 } else { hi };
        self.cand.clear();
        self.cand.extend(logits.iter().enumerate().map(|(i, &l)| ((l - shift) * inv_t, i as u32)));
        // Most likely first; ties by lower id, so the order is total and portable.
        let by_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if let Some(k) = self.cfg.top_k.filter(|&k| k > 0 && k < self.cand.len()) {
            self.cand.select_nth_unstable_by(k - 1, by_desc);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by(by_desc);
        let max = self.cand[0].0;
        let mut total = 0.0f64;
        for c in self.cand.iter_mut() {
            // Below e^-87 (f32's smallest normal) a weight is 0, not exp_approx's clamped floor.
            let d = c.0 - max;
            c.0 = if d < -87.0 { 0.0 } else { exp_approx(d) };
            total += c.0 as f64;
        }
        if let Some(p) = self.cfg.top_p.filter(|&p| p < 1.0) {
            let mut cum = 0.0f64;
            let mut keep = self.cand.len();
            for (i, c) in self.cand.iter().enumerate() {
                cum += c.0 as f64 / total;
                if cum >= p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
            total = self.cand.iter().map(|c| c.0 as f64).sum();
        }
        let target = self.uniform() * total;
        let mut cum = 0.0f64;
        for c in &self.cand {
            cum += c.0 as f64;
            if target < cum {
                return c.1;
            }
        }
        self.cand.last().expect("at least one candidate").1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_chacha20_as_specified() {
        // ChaCha20 test vector (all-zero key and nonce, block 0): keystream starts 76 b8 e0 ad
        // a0 f1 3d 90, i.e. the little-endian words 0xade0b876, 0x903df1a0.
        let mut rng = ChaCha20Rng::from_seed([0u8; 32]);
        assert_eq!(rng.next_u32(), 0xade0_b876);
        assert_eq!(rng.next_u32(), 0x903d_f1a0);
    }

    #[test]
    fn top_k_1_and_tiny_top_p_are_greedy() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 * 0.1).collect();
        let best = argmax(&logits);
        for cfg in [
            Sampling { temperature: 1.0, top_k: Some(1), top_p: None, seed: 1 },
            Sampling { temperature: 1.0, top_k: None, top_p: Some(1e-6), seed: 2 },
        ] {
            let mut s = Sampler::new(cfg, logits.len());
            for _ in 0..20 {
                assert_eq!(s.sample(&logits), best);
            }
        }
    }

    #[test]
    fn a_tiny_temperature_is_greedy_and_ties_share_the_mass() {
        let mut logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 * 0.7 - 30.0).collect();
        logits[417] = 41.0; // one clear maximum, and logits large enough that l / T overflows
        for t in [1e-3f32, 1e-20, 1e-38, 1e-45] {
            for top_k in [None, Some(1), Some(5)] {
                let mut s = Sampler::new(Sampling { temperature: t, top_k, top_p: None, seed: 3 }, logits.len());
                for _ in 0..50 {
                    assert_eq!(s.sample(&logits), 417, "T={t} top_k={top_k:?}");
                }
            }
        }
        // Two equal maxima: each is drawn about half the time, nothing else ever.
        logits[9] = 41.0;
        let mut s = Sampler::new(Sampling { temperature: 1e-38, top_k: None, top_p: None, seed: 5 }, logits.len());
        let draws: Vec<u32> = (0..4000).map(|_| s.sample(&logits)).collect();
        assert!(draws.iter().all(|&d| d == 9 || d == 417));
        let nine = draws.iter().filter(|&&d| d == 9).count() as f64 / 4000.0;
        assert!((nine - 0.5).abs() < 0.04, "{nine}");
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // Two tokens with probabilities 0.2 / 0.8 (logit gap ln 4).
        let logits = [0.0f32, 4.0f32.ln()];
        let mut s = Sampler::new(Sampling { temperature: 1.0, top_k: None, top_p: None, seed: 7 }, 2);
        let n = 20000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.8).abs() < 0.015, "{frac}");
    }
}
