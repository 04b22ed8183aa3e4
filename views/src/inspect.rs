//! The learner's views: a traced run (prefill, then greedy decode steps with the cache on) whose
//! recorded points are stitched back into whole-sequence tensors, and statistics of logits.
//!
//! Stitching is what lets `inspect attention --generate N` show the full lower-triangular matrix
//! over the final sequence although each decode step only computed its own row.
//!
//! [`rounds`]: speculative decoding step by step (drafted, accepted, the model's token, the cache
//! before and after the rollback). [`cache_steps`]: the cache view's numbers per forward call.

use kvgpt_core::error::{Error, Result};
use kvgpt_core::kv_cache::KvCache;
use kvgpt_core::model::{Model, Scratch};
use kvgpt_core::sampler::argmax;
use kvgpt_core::sampler::Sampling;
use kvgpt_core::sequence::Sequence;
use kvgpt_core::tap::{Point, Recorder};

pub mod attention;
pub mod cache;
pub mod draft;
pub mod explain;
pub mod logits;
mod rounds;
mod steps;
pub use rounds::{rounds, Round};
pub use steps::{cache_steps, wants as cache_step_points, CacheStep};

/// `--layer` or `--head`: that one (checked against the model's `n`), or all of them.
pub fn selected(sel: Option<usize>, n: usize, what: &str) -> Result<Vec<usize>> {
    match sel {
        Some(i) => check_indices(&[i], n, what).map(|()| vec![i]),
        None => Ok((0..n).collect()),
    }
}

/// Errors unless every one of `indices` is below `n` (the model's layers or heads, `what`).
pub fn check_indices(indices: &[usize], n: usize, what: &str) -> Result<()> {
    match indices.iter().find(|&&i| i >= n) {
        Some(i) => Err(Error::Invalid(format!(
            "--{what} {i} is out of range: the model has {n} {what}s (0..{})",
            n.saturating_sub(1)
        ))),
        None => Ok(()),
    }
}

/// What a traced run recorded.
pub struct Trace {
    /// Every id fed to the model: the prompt, then the greedily generated tokens.
    pub ids: Vec<u32>,
    pub prompt_len: usize,
    /// Prompt tokens the prefill call fed (the rest were fed one at a time).
    pub prefill_len: usize,
    /// One map of recorded points per forward call (call 0 is the prefill).
    pub recorder: Recorder,
    /// Logits `[S, V]` for every fed position when asked for, else `[1, V]` of the last.
    pub logits: Vec<f32>,
    /// The cache after the last call.
    pub cache: KvCache,
    /// The token the model would produce next.
    pub next: u32,
}

/// Options of a traced run.
pub struct TraceSpec {
    /// Greedy decode steps after the prefill; each feeds the token the previous call chose.
    pub generate: usize,
    /// Which points to record.
    pub want: fn(Point) -> bool,
    /// Keep logits for every position (else only the last).
    pub all_logits: bool,
    /// Feed only the first N prompt tokens in the prefill call and the rest one call each, as
    /// decode steps of the prompt's own tokens (the cache view's lesson); `None`: all at once.
    pub prefill: Option<usize>,
}

/// Runs the prompt, then `spec.generate` decode steps with the cache on, recording as asked.
pub fn trace(model: &Model, prompt_ids: &[u32], spec: &TraceSpec) -> Result<Trace> {
    let cfg = &model.config;
    let v = cfg.vocab_size;
    // Every decoded token is fed (its K/V recorded); the token after the last is only predicted.
    kvgpt_core::sequence::check_fed(model, prompt_ids.len(), spec.generate)?;
    let t = prompt_ids.len();
    let first = match spec.prefill {
        Some(n) if n == 0 || n > t => {
            return Err(Error::Invalid(format!(
                "the prefill must feed 1 to {t} tokens of the {t}-token prompt (asked for {n})"
            )))
        }
        Some(n) => n,
        None => t,
    };
    let forced = &prompt_ids[first..];
    let mut seq = Sequence::new(model, &prompt_ids[..first], forced.len() + spec.generate + 1, Sampling::GREEDY)?;
    let mut scratch = Scratch::new(cfg, first);
    let mut recorder = Recorder::only(spec.want);
    let rows = if spec.all_logits { first } else { 1 };
    let mut logits = vec![0.0f32; rows * v];
    seq.feed_observed(model, &mut scratch, &mut recorder, &mut logits)?;
    let mut step_logits = vec![0.0f32; v];
    for i in 0..forced.len() + spec.generate {
        match forced.get(i) {
            Some(&id) => seq.push(id)?, // the prompt's own next token
            None => _ = seq.sample(),   // greedy
        }
        seq.feed_observed(model, &mut scratch, &mut recorder, &mut step_logits)?;
        if spec.all_logits {
            logits.extend_from_slice(&step_logits);
        } else {
            logits.copy_from_slice(&step_logits);
        }
    }
    let next = argmax(seq.logits());
    let ids = seq.ids().to_vec();
    let cache = seq.into_cache();
    Ok(Trace { ids, prompt_len: t, prefill_len: first, recorder, logits, cache, next })
}

impl Trace {
    /// Sequence length `S` (prompt + generated tokens fed).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// A row-shaped point (`[T, W]` per call) concatenated over all calls: `[S, W]`.
    pub fn rows(&self, point: Point) -> Option<(usize, Vec<f32>)> {
        let mut out = Vec::new();
        let mut width = 0;
        for call in &self.recorder.calls {
            let r = call.get(&point)?;
            width = *r.shape.last()?;
            out.extend_from_slice(&r.data);
        }
        Some((width, out))
    }

    /// Attention weights of `layer` over the whole sequence, `[NH, S, S]`, stitched from the
    /// prefill's `[NH, T, T]` and each decode step's `[NH, 1, P+1]` (0 above the diagonal).
    pub fn attention(&self, layer: usize) -> Option<(usize, Vec<f32>)> {
        let s = self.len();
        let mut nh = 0;
        let mut out = Vec::new();
        let mut q0 = 0;
        for call in &self.recorder.calls {
            let r = call.get(&Point::AttnProbs(layer))?;
            let (h, t, kv) = (r.shape[0], r.shape[1], r.shape[2]);
            if out.is_empty() {
                nh = h;
                out = vec![0.0; nh * s * s];
            }
            for head in 0..nh {
                for i in 0..t {
                    let src = &r.data[(head * t + i) * kv..][..kv];
                    out[(head * s + q0 + i) * s..][..kv].copy_from_slice(src);
                }
            }
            q0 += t;
        }
        (q0 == s).then_some((nh, out))
    }
}
