//! Side-by-side checks: cached decode against uncached recomputation, and the engine's logits
//! against golden logits from a file.

use kvgpt_core::error::{Error, Result};
use kvgpt_core::kv_cache::KvCache;
use kvgpt_core::logprobs::kl_divergence;
use kvgpt_core::model::{Model, Scratch, CHUNK_ROWS};
use kvgpt_core::sampler::{argmax, Sampling};
use kvgpt_core::sequence::Sequence;

/// How two runs of logits compare, row by row (decode steps or prompt positions).
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Rows compared.
    pub steps: usize,
    pub max_abs_diff: f32,
    /// Fraction of rows whose argmax agrees.
    pub top1_agreement: f64,
    /// Mean KL(reference ‖ engine) over rows, in nats.
    pub mean_kl: f64,
    /// The first row whose max |Δ| exceeds the tolerance.
    pub first_divergent_step: Option<usize>,
}

impl Comparison {
    /// Whether every row stayed within the tolerance.
    pub fn passes(&self) -> bool {
        self.first_divergent_step.is_none()
    }
}

/// Accumulates row comparisons.
struct Compare {
    tolerance: f32,
    c: Comparison,
    agree: usize,
    kl: f64,
}

impl Compare {
    fn new(tolerance: f32) -> Compare {
        let c =
            Comparison { steps: 0, max_abs_diff: 0.0, top1_agreement: 1.0, mean_kl: 0.0, first_divergent_step: None };
        Compare { tolerance, c, agree: 0, kl: 0.0 }
    }

    /// Compares the engine's row against the reference row.
    fn row(&mut self, reference: &[f32], got: &[f32]) {
        let d = reference.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0.0f32, |m, x| {
            if x.is_nan() {
                f32::INFINITY
            } else {
                m.max(x)
            }
        });
        if d > self.tolerance && self.c.first_divergent_step.is_none() {
            self.c.first_divergent_step = Some(self.c.steps);
        }
        self.c.max_abs_diff = self.c.max_abs_diff.max(d);
        self.agree += (argmax(reference) == argmax(got)) as usize;
        self.kl += kl_divergence(reference, got);
        self.c.steps += 1;
    }

    fn finish(mut self) -> Comparison {
        if self.c.steps > 0 {
            self.c.top1_agreement = self.agree as f64 / self.c.steps as f64;
            self.c.mean_kl = self.kl / self.c.steps as f64;
        }
        self.c
    }
}

/// Greedy decode of `steps` tokens with the cache, and at every step the same sequence
/// recomputed from scratch without it; compares the two logit rows (reference: uncached).
pub fn cache_vs_recompute(model: &Model, prompt_ids: &[u32], steps: usize, tolerance: f32) -> Result<Comparison> {
    compare_cached(model, prompt_ids, steps, tolerance, &mut |_, _| {})
}

/// As [`cache_vs_recompute`], with `tamper` called on the cache before every decode step (step
/// numbers from 1): tests corrupt it on purpose, to see the comparison fail.
#[cfg(feature = "test-hooks")]
pub fn cache_vs_recompute_tampered(
    model: &Model,
    prompt_ids: &[u32],
    steps: usize,
    tolerance: f32,
    tamper: &mut dyn FnMut(&mut KvCache, usize),
) -> Result<Comparison> {
    compare_cached(model, prompt_ids, steps, tolerance, &mut |seq, step| tamper(seq.cache_mut(), step))
}

/// The comparison, with `before_step` called on the cached sequence before every decode step.
fn compare_cached(
    model: &Model,
    prompt_ids: &[u32],
    steps: usize,
    tolerance: f32,
    before_step: &mut dyn FnMut(&mut Sequence, usize),
) -> Result<Comparison> {
    let greedy = Sampling::GREEDY;
    let mut cached = Sequence::new(model, prompt_ids, steps, greedy)?;
    let mut fresh = Sequence::new(model, prompt_ids, steps, greedy)?;
    let cfg = &model.config;
    let total = prompt_ids.len() + steps;
    let (mut s1, mut s2) =
        (Scratch::new(cfg, prompt_ids.len().min(CHUNK_ROWS)), Scratch::new(cfg, total.min(CHUNK_ROWS)));
    let mut cmp = Compare::new(tolerance);
    for step in 0..steps {
        if step > 0 {
            before_step(&mut cached, step);
        }
        cached.feed(model, &mut s1)?;
        fresh.forget_cache();
        fresh.feed(model, &mut s2)?;
        cmp.row(fresh.logits(), cached.logits());
        fresh.push(cached.sample())?;
    }
    Ok(cmp.finish())
}

/// The engine's logits for `ids` (every position) against `reference` (`[R, V]` for the last R
/// positions, R ≤ T).
pub fn against_reference(
    model: &Model,
    ids: &[u32],
    shape: &[usize],
    reference: &[f32],
    tolerance: f32,
) -> Result<Comparison> {
    let cfg = &model.config;
    let v = cfg.vocab_size;
    // [V] (one row), [R, V], or with leading dimensions of 1 (HF's batch): [1, R, V].
    let rows = match shape {
        [last] if *last == v => 1,
        [lead @ .., r, last] if *last == v && lead.iter().all(|&d| d == 1) => *r,
        _ => 0,
    };
    if rows == 0 || rows > ids.len() || reference.len() != rows * v {
        let hint = match shape {
            [.., a, b] if *a == v && *b != v => " (the vocabulary comes first: transposed?)",
            _ => "",
        };
        return Err(Error::Invalid(format!(
            "the reference has shape {shape:?}{hint}; expected [{v}], [R, {v}] or [1, R, {v}] logits with R between \
             1 and the prompt's {} tokens",
            ids.len()
        )));
    }
    if let Some(i) = reference.iter().position(|x| !x.is_finite()) {
        return Err(Error::Invalid(format!(
            "the reference holds {} at row {}, column {}; a reference must be finite",
            reference[i],
            i / v,
            i % v
        )));
    }
    let rows = reference.len() / v;
    let mut logits = vec![0.0f32; rows * v];
    model.run(ids, &mut KvCache::new(cfg), &mut Scratch::new(cfg, ids.len().min(CHUNK_ROWS)), &mut logits)?;
    let mut cmp = Compare::new(tolerance);
    for (r, g) in reference.chunks_exact(v).zip(logits.chunks_exact(v)) {
        cmp.row(r, g);
    }
    Ok(cmp.finish())
}

/// Greedy decode of `steps` tokens with `reference` (cached); at every step `model` gets the same
/// tokens (cached too) and its logits are compared with the reference's. Used to measure what a
/// weight type (f16, bf16, int8) costs against f32.
pub fn against_model(
    reference: &Model,
    model: &Model,
    prompt_ids: &[u32],
    steps: usize,
    tolerance: f32,
) -> Result<Comparison> {
    let cfg = &reference.config;
    let mut seq_ref = Sequence::new(reference, prompt_ids, steps, Sampling::GREEDY)?;
    let mut seq = Sequence::new(model, prompt_ids, steps, Sampling::GREEDY)?;
    let (mut s1, mut s2) =
        (Scratch::new(cfg, prompt_ids.len().min(CHUNK_ROWS)), Scratch::new(cfg, prompt_ids.len().min(CHUNK_ROWS)));
    let mut cmp = Compare::new(tolerance);
    for _ in 0..steps {
        seq_ref.feed(reference, &mut s1)?;
        seq.feed(model, &mut s2)?;
        cmp.row(seq_ref.logits(), seq.logits());
        seq.push(seq_ref.sample())?;
    }
    Ok(cmp.finish())
}
