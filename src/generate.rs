//! The generation loop: prefill, decode (cached) or recompute (uncached), stop conditions,
//! timings, and a callback per token for streaming.

use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::model::{Model, Scratch, CHUNK_ROWS};
use crate::sampler::{Sampler, Sampling};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Stop when the model emits the end-of-text token (it is kept in the ids, not in the text).
    pub stop_at_eos: bool,
    /// Decode with the KV cache (true) or recompute the whole sequence every step (false).
    pub use_cache: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions { max_new_tokens: 50, sampling: Sampling::GREEDY, stop_at_eos: true, use_cache: true }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Eos,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
        }
    }
}

/// Forward-pass time only: tokenization and sampling are not in these figures.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// The first forward call, over the prompt.
    pub prefill: Duration,
    pub prefill_tokens: usize,
    /// Every later forward call, one per generated token after the first.
    pub decode: Duration,
    pub decode_steps: usize,
}

impl Timings {
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_steps == 0 {
            return 0.0;
        }
        self.decode_steps as f64 / self.decode.as_secs_f64()
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

/// Checks that the prompt and the new tokens fit the model's positions.
pub fn check_context(model: &Model, prompt: usize, new: usize) -> Result<()> {
    let n_positions = model.config.n_positions;
    if prompt + new > n_positions {
        return Err(Error::ContextOverflow { prompt, new, n_positions });
    }
    Ok(())
}

/// Runs the loop. `on_token` sees every new id as soon as it is chosen, with the logits it was
/// chosen from (before temperature); returning an error stops.
pub fn generate(
    model: &Model,
    prompt_ids: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32, &[f32]) -> Result<()>,
) -> Result<Generation> {
    if prompt_ids.is_empty() {
        return Err(Error::Invalid("the prompt has no tokens".into()));
    }
    check_context(model, prompt_ids.len(), opts.max_new_tokens)?;
    let cfg = &model.config;
    let mut cache = KvCache::new(cfg);
    let rows = if opts.use_cache { prompt_ids.len() } else { prompt_ids.len() + opts.max_new_tokens };
    let mut scratch = Scratch::new(cfg, rows.min(CHUNK_ROWS));
    let mut logits = vec![0.0f32; cfg.vocab_size];
    let mut sampler = Sampler::new(opts.sampling, cfg.vocab_size);
    let mut seq: Vec<u32> = Vec::with_capacity(prompt_ids.len() + opts.max_new_tokens);
    seq.extend_from_slice(prompt_ids);
    let mut timings = Timings { prefill_tokens: prompt_ids.len(), ..Timings::default() };
    let mut finish = FinishReason::Length;

    for step in 0..opts.max_new_tokens {
        let start = Instant::now();
        if step == 0 || !opts.use_cache {
            // Prefill, or in uncached mode the whole sequence again from an empty cache.
            cache.reset();
            model.run(&seq, &mut cache, &mut scratch, &mut logits)?;
        } else {
            let last = seq.len() - 1;
            model.run(&seq[last..], &mut cache, &mut scratch, &mut logits)?;
        }
        let took = start.elapsed();
        if step == 0 {
            timings.prefill = took;
        } else {
            timings.decode += took;
            timings.decode_steps += 1;
        }
        let next = sampler.sample(&logits);
        seq.push(next);
        on_token(next, &logits)?;
        if opts.stop_at_eos && next == cfg.eos_token_id {
            finish = FinishReason::Eos;
            break;
        }
    }
    Ok(Generation {
        prompt_ids: prompt_ids.to_vec(),
        generated_ids: seq[prompt_ids.len()..].to_vec(),
        finish_reason: finish,
        timings,
    })
}
