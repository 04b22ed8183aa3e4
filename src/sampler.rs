//! Choosing the next token: greedy (argmax, as HF `generate()` by default) or sampled with
//! temperature, top-k and top-p, from a named portable RNG; either after the penalties people
//! expect: HF's `repetition_penalty` and OpenAI's presence and frequency penalties.
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
    /// HF's `repetition_penalty` θ (1 = off): the logit `l` of every token already in the
    /// sequence, prompt included, becomes `l / θ` if positive, `l · θ` if not.
    pub repetition_penalty: f32,
    /// OpenAI's `presence_penalty` (0 = off): taken once off the logit of every token the
    /// completion has produced so far.
    pub presence_penalty: f32,
    /// OpenAI's `frequency_penalty` (0 = off): taken off the logit of a token once per time the
    /// completion has produced it.
    pub frequency_penalty: f32,
}

impl Sampling {
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_k: None,
        top_p: None,
        seed: 0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
    };

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every setting against its range: the one rule the CLI's flags and the server's
    /// fields share (each names the setting its own way: [`Setting::flag`], [`Setting::param`]).
    pub fn check(&self) -> Result<(), BadSetting> {
        let bad = |setting, rule| Err(BadSetting { setting, rule });
        let t = self.temperature;
        if !(t.is_finite() && (0.0..=2.0).contains(&t)) {
            return bad(Setting::Temperature, format!("must be a number between 0 and 2 (0 = greedy), got {t}"));
        }
        if self.top_k == Some(0) {
            return bad(Setting::TopK, "must be at least 1".into());
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return bad(Setting::TopP, format!("must be in (0, 1], got {p}"));
        }
        let r = self.repetition_penalty;
        if !(r > 0.0 && r <= 10.0) {
            return bad(Setting::RepetitionPenalty, format!("must be a number > 0 and at most 10 (1 = off), got {r}"));
        }
        for (setting, v) in
            [(Setting::PresencePenalty, self.presence_penalty), (Setting::FrequencyPenalty, self.frequency_penalty)]
        {
            if !(-2.0..=2.0).contains(&v) {
                return bad(setting, format!("must be in [-2, 2] (0 = off), got {v}"));
            }
        }
        Ok(())
    }

    /// Whether any penalty changes the logits.
    pub fn penalizes(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// A sampler setting, as [`Sampling::check`] names the one out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    Temperature,
    TopK,
    TopP,
    RepetitionPenalty,
    PresencePenalty,
    FrequencyPenalty,
}

impl Setting {
    /// The command-line flag.
    pub fn flag(self) -> &'static str {
        match self {
            Setting::Temperature => "--temperature",
            Setting::TopK => "--top-k",
            Setting::TopP => "--top-p",
            Setting::RepetitionPenalty => "--repetition-penalty",
            Setting::PresencePenalty => "--presence-penalty",
            Setting::FrequencyPenalty => "--frequency-penalty",
        }
    }

    /// The request field of the OpenAI-compatible API.
    pub fn param(self) -> &'static str {
        match self {
            Setting::Temperature => "temperature",
            Setting::TopK => "top_k",
            Setting::TopP => "top_p",
            Setting::RepetitionPenalty => "repetition_penalty",
            Setting::PresencePenalty => "presence_penalty",
            Setting::FrequencyPenalty => "frequency_penalty",
        }
    }
}

/// A setting out of its range, and the range (`rule` reads after the setting's name).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{} {rule}", setting.param())]
pub struct BadSetting {
    pub setting: Setting,
    pub rule: String,
}

pub struct Sampler {
    cfg: Sampling,
    rng: ChaCha20Rng,
    /// (probability, id) candidates, allocated once.
    cand: Vec<(f32, u32)>,
    /// The penalized logits, and per token how often the completion produced it (kept zero
    /// between calls): allocated once, used only with penalties.
    work: Vec<f32>,
    counts: Vec<u32>,
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
        let room = if cfg.penalizes() { vocab } else { 0 };
        Sampler {
            cfg,
            rng: ChaCha20Rng::seed_from_u64(cfg.seed),
            cand: Vec::with_capacity(vocab),
            work: Vec::with_capacity(room),
            counts: vec![0; room],
        }
    }

    /// The next token after `ids` (the sequence so far: `prompt` tokens, then the completion's),
    /// from the logits of its last position: the penalties, then [`Sampler::sample`].
    pub fn sample_after(&mut self, logits: &[f32], ids: &[u32], prompt: usize) -> u32 {
        if !self.cfg.penalizes() {
            return self.sample(logits);
        }
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        work.extend_from_slice(logits);
        self.penalize(&mut work, ids, prompt);
        let id = self.sample(&work);
        self.work = work;
        id
    }

    /// Applies the penalties to `l` in place (HF's repetition penalty first, as its logits
    /// processors run before temperature; then presence and frequency).
    pub fn penalize(&mut self, l: &mut [f32], ids: &[u32], prompt: usize) {
        let Sampling { repetition_penalty: theta, presence_penalty: pres, frequency_penalty: freq, .. } = self.cfg;
        if self.counts.len() < l.len() {
            self.counts.resize(l.len(), 0);
        }
        if theta != 1.0 {
            // Each distinct token once: mark it in `counts`, then clear the marks.
            for &id in ids {
                let c = &mut self.counts[id as usize];
                if *c == 0 {
                    *c = 1;
                    let x = &mut l[id as usize];
                    *x = if *x > 0.0 { *x / theta } else { *x * theta };
                }
            }
            ids.iter().for_each(|&id| self.counts[id as usize] = 0);
        }
        if pres != 0.0 || freq != 0.0 {
            let done = &ids[prompt.min(ids.len())..];
            done.iter().for_each(|&id| self.counts[id as usize] += 1);
            for &id in done {
                let c = std::mem::take(&mut self.counts[id as usize]);
                if c > 0 {
                    l[id as usize] -= c as f32 * freq + pres;
                }
            }
        }
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
            Sampling { temperature: 1.0, top_k: Some(1), seed: 1, ..Sampling::GREEDY },
            Sampling { temperature: 1.0, top_p: Some(1e-6), seed: 2, ..Sampling::GREEDY },
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
                let mut s = Sampler::new(Sampling { temperature: t, top_k, seed: 3, ..Sampling::GREEDY }, logits.len());
                for _ in 0..50 {
                    assert_eq!(s.sample(&logits), 417, "T={t} top_k={top_k:?}");
                }
            }
        }
        // Two equal maxima: each is drawn about half the time, nothing else ever.
        logits[9] = 41.0;
        let mut s = Sampler::new(Sampling { temperature: 1e-38, seed: 5, ..Sampling::GREEDY }, logits.len());
        let draws: Vec<u32> = (0..4000).map(|_| s.sample(&logits)).collect();
        assert!(draws.iter().all(|&d| d == 9 || d == 417));
        let nine = draws.iter().filter(|&&d| d == 9).count() as f64 / 4000.0;
        assert!((nine - 0.5).abs() < 0.04, "{nine}");
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // Two tokens with probabilities 0.2 / 0.8 (logit gap ln 4).
        let logits = [0.0f32, 4.0f32.ln()];
        let mut s = Sampler::new(Sampling { temperature: 1.0, seed: 7, ..Sampling::GREEDY }, 2);
        let n = 20000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.8).abs() < 0.015, "{frac}");
    }

    #[test]
    fn penalties_follow_their_definitions() {
        // Logits 0..8 minus 4; the prompt is [7, 2, 2], the completion so far [5, 5, 1].
        let logits: Vec<f32> = (0..8).map(|i| i as f32 - 4.0).collect();
        let ids = [7u32, 2, 2, 5, 5, 1];
        let cfg = |theta, pres, freq| Sampling {
            repetition_penalty: theta,
            presence_penalty: pres,
            frequency_penalty: freq,
            ..Sampling::GREEDY
        };
        let mut l = logits.clone();
        Sampler::new(cfg(2.0, 0.0, 0.0), 8).penalize(&mut l, &ids, 3);
        // Seen: 7 (3 → 1.5), 2 (-2 → -4), 5 (1 → 0.5), 1 (-3 → -6); once each however often.
        assert_eq!(l, [-4.0, -6.0, -4.0, -1.0, 0.0, 0.5, 2.0, 1.5]);
        let mut l = logits.clone();
        Sampler::new(cfg(1.0, 0.5, 0.25), 8).penalize(&mut l, &ids, 3);
        // Only the completion counts: 5 twice (1 - 2·0.25 - 0.5 = 0), 1 once (-3 - 0.75).
        assert_eq!(l, [-4.0, -3.75, -2.0, -1.0, 0.0, 0.0, 2.0, 3.0]);
        // Greedy after them: the repetition penalty takes 7 below 6.
        let mut s = Sampler::new(cfg(2.0, 0.0, 0.0), 8);
        assert_eq!(s.sample_after(&logits, &ids, 3), 6);
        assert_eq!(Sampler::new(Sampling::GREEDY, 8).sample_after(&logits, &ids, 3), 7);
        // The marks are cleared: the same call again gives the same.
        assert_eq!(s.sample_after(&logits, &ids, 3), 6);
    }
}
