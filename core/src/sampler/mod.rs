//! Choosing the next token: greedy (argmax, as HF `generate()` by default) or sampled with
//! temperature, top-k and top-p, from a named portable RNG; either after the penalties people
//! expect: HF's `repetition_penalty` and OpenAI's presence and frequency penalties.
//!
//! Reproducibility: the RNG is ChaCha20 (`rand_chacha::ChaCha20Rng::seed_from_u64`, whose output
//! is fixed by the ChaCha20 specification); a uniform draw is the top 53 bits of one `next_u64`
//! scaled to [0, 1); probabilities use the engine's own `exp` and sums in a fixed order. The same
//! seed gives the same tokens on every platform and version.

mod order;
#[cfg(test)]
mod tests;

use kvgpt_kernels::Isa;
use order::Order;
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

    /// The command line's rule for the temperature (`kvgpt generate`, `chat`, and Python's
    /// `generate`): greedy unless a temperature, top-k or top-p is given; given a top-k or
    /// top-p alone, the temperature is 1.
    pub fn temperature_of(temperature: Option<f32>, top_k: Option<usize>, top_p: Option<f32>) -> f32 {
        match temperature {
            Some(t) => t,
            None if top_k.is_some() || top_p.is_some() => 1.0,
            None => 0.0,
        }
    }

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
    /// The kernels' instruction set for the weights (every one gives the same bits).
    isa: Isa,
    /// Per token, in id order: its scaled logit, then its weight. Allocated once (sampled only).
    weights: Vec<f32>,
    /// The candidates' order, and scratch for the running sums. Allocated once (sampled only).
    order: Order,
    /// The penalized logits, and per token how often the completion produced it (kept zero
    /// between calls): allocated once, used only with penalties.
    work: Vec<f32>,
    counts: Vec<u32>,
}

/// A uniform number in [0, 1) from the top 53 bits of one 64-bit draw.
fn uniform(rng: &mut ChaCha20Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
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
        Sampler::with_isa(cfg, vocab, Isa::detect())
    }

    /// A sampler whose weights use the kernels of `isa` (the model's, so that `--isa` holds).
    pub fn with_isa(cfg: Sampling, vocab: usize, isa: Isa) -> Sampler {
        let room = if cfg.penalizes() { vocab } else { 0 };
        let sampled = if cfg.is_greedy() { 0 } else { vocab };
        Sampler {
            cfg,
            rng: ChaCha20Rng::seed_from_u64(cfg.seed),
            isa,
            weights: Vec::with_capacity(sampled),
            order: Order::new(sampled),
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

    /// The next token for these logits. HF's order: temperature, then top-k, then top-p.
    ///
    /// The candidates run most likely first, ties by lower id (a total order, so portable); the
    /// weights `e^(l/T - max)` (0 below e^-87, f32's smallest normal, not `exp_approx`'s clamped
    /// floor) are summed in f64 in that order, and a uniform draw times the total picks the first
    /// candidate whose running sum exceeds it. The order comes from a radix sort, or for a small
    /// top-k a selection ([`order`]), and the weights from a kernel: a token costs O(V) with no
    /// allocation, where a comparison sort cost O(V log V), and the sums are the same additions
    /// in the same order, so the same seed still gives the same tokens.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_and_total(logits).0
    }

    /// [`Sampler::sample`], and the total weight the draw was scaled by (0 for greedy): the
    /// tests compare its bits with the sorting sampler's.
    fn sample_and_total(&mut self, logits: &[f32]) -> (u32, f64) {
        if self.cfg.is_greedy() {
            return (argmax(logits), 0.0);
        }
        // A tiny temperature is the limit T → 0: all the probability on the most likely token
        // (shared evenly by exact ties). 1/T may overflow (T below ~3e-39), and l/T may overflow
        // for large logits; then the logits are shifted by their maximum first, so the scaled
        // values are 0 for the maximum and -inf or finite below it, never NaN.
        let inv_t = (1.0 / self.cfg.temperature).min(f32::MAX);
        let (lo, hi) = logits.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &l| (a.min(l), b.max(l)));
        let shift = if (lo.abs().max(hi.abs()) * inv_t).is_finite() { 0.0 } else { hi };
        let k = self.cfg.top_k.filter(|&k| k > 0).unwrap_or(logits.len());
        let (cand, sums) = self.order.first(logits, shift, inv_t, k);
        // The weights in candidate order, then their running sums (f64 bits in the scratch).
        let weights = &mut self.weights;
        weights.clear();
        weights.extend(cand.iter().map(|&c| order::value(c)));
        let max = weights[0];
        kvgpt_kernels::exp_weights(self.isa, weights, max);
        let mut total = 0.0f64;
        for (&w, s) in weights.iter().zip(sums.iter_mut()) {
            total += w as f64;
            *s = total.to_bits();
        }
        let mut keep = cand.len();
        if let Some(p) = self.cfg.top_p.filter(|&p| p < 1.0) {
            let mut cum = 0.0f64;
            for (i, &w) in weights.iter().enumerate() {
                cum += w as f64 / total;
                if cum >= p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            total = f64::from_bits(sums[keep - 1]);
        }
        let (cand, sums) = (&cand[..keep], &sums[..keep]);
        let target = uniform(&mut self.rng) * total;
        // The first candidate whose running sum exceeds the target (the sums never decrease: the
        // weights are not negative); none, if the total is NaN (a NaN logit): then the last, as
        // a walk would.
        if target.is_nan() || target >= total {
            return (order::id(cand[keep - 1]), total);
        }
        let at = sums.partition_point(|&s| f64::from_bits(s) <= target);
        (order::id(cand[at]), total)
    }
}
