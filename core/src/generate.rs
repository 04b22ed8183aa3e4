//! The generation loop: prefill, decode (cached) or recompute (uncached), stop conditions,
//! timings, and a callback per token for streaming.

use crate::error::Result;
use crate::model::{Model, Scratch, CHUNK_ROWS};
use crate::sampler::Sampling;
use crate::sequence::{FinishReason, Sequence};
use crate::stop::TextStream;
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

/// What `on_token` tells the loop: go on, or stop here (the token stays generated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Go,
    Stop,
}

/// Where the time of a generation went: each step is a forward pass and then the choice of the
/// next token (the penalties, temperature, top-k, top-p and the draw, or greedy's argmax), so the
/// figures per token are what a user waits for a token. Not in them: tokenization, and the
/// caller's `on_token` (printing, log-probabilities).
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// The first step: the forward call over the prompt, and choosing the first token.
    pub prefill: Duration,
    pub prefill_tokens: usize,
    /// Every later step: its forward call (over the last token, and any drafted ones) and
    /// choosing the next token (or tokens, when drafts are accepted); with a draft, its proposal.
    pub decode: Duration,
    /// Tokens generated after the first (each later step makes one, or more with drafts).
    pub decode_steps: usize,
    /// Forward calls (steps), prefill included: fewer than the tokens when drafts are accepted.
    pub forwards: usize,
    /// The draft's work: its prefill of the prompt (part of `prefill`) and its proposals (part
    /// of `decode`).
    pub draft: Duration,
    /// Choosing the tokens, all of them: already part of `prefill` (the first) and `decode`.
    pub sample: Duration,
    /// Tokens chosen (one per step, or more with accepted drafts).
    pub sample_tokens: usize,
}

impl Timings {
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_steps == 0 {
            return 0.0;
        }
        self.decode_steps as f64 / self.decode.as_secs_f64()
    }

    /// Milliseconds per decode step (its forward call and its choice of token).
    pub fn decode_ms_per_token(&self) -> f64 {
        per_token_ms(self.decode, self.decode_steps)
    }

    /// Milliseconds per token spent choosing it.
    pub fn sample_ms_per_token(&self) -> f64 {
        per_token_ms(self.sample, self.sample_tokens)
    }
}

fn per_token_ms(d: Duration, n: usize) -> f64 {
    if n == 0 {
        return 0.0;
    }
    d.as_secs_f64() * 1e3 / n as f64
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

pub use crate::sequence::check_context;

/// Runs the loop. `on_token` sees every new id as soon as it is chosen, with the logits it was
/// chosen from (before penalties and temperature); it returns whether to go on, and an error
/// stops.
pub fn generate(
    model: &Model,
    prompt_ids: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32, &[f32]) -> Result<Step>,
) -> Result<Generation> {
    let mut seq = Sequence::new(model, prompt_ids, opts.max_new_tokens, opts.sampling)?;
    generate_from(model, &mut seq, opts, on_token)
}

/// The loop over a sequence made by the caller (whose cache may already hold a prefix of the
/// prompt, restored from a prompt cache): only the rest is computed.
pub fn generate_from(
    model: &Model,
    seq: &mut Sequence,
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32, &[f32]) -> Result<Step>,
) -> Result<Generation> {
    let cfg = &model.config;
    let prompt_len = seq.prompt().len();
    let drafts = seq.speculation().map_or(0, |s| s.max_k);
    let rows = if opts.use_cache { seq.pending().max(1 + drafts) } else { prompt_len + opts.max_new_tokens };
    let mut scratch = Scratch::new(cfg, rows.clamp(1, CHUNK_ROWS));
    let mut timings = Timings { prefill_tokens: seq.pending(), ..Timings::default() };
    let mut finish = FinishReason::Length;
    let mut made = 0;
    'steps: while made < opts.max_new_tokens {
        let start = Instant::now();
        if !opts.use_cache {
            seq.forget_cache(); // the whole sequence again from an empty cache
        }
        seq.draft(1)?; // with a draft: proposed tokens to verify in this feed
        let drafted = Instant::now();
        seq.feed(model, &mut scratch)?;
        let chosen = Instant::now();
        seq.sample();
        let end = Instant::now();
        let n = seq.new_tokens().len();
        timings.draft += drafted - start;
        timings.sample += end - chosen;
        timings.sample_tokens += n;
        if made == 0 {
            seq.prefill_draft()?;
            let drafted = Instant::now();
            timings.draft += drafted - end;
            timings.prefill = drafted - start;
            timings.decode_steps += n - 1;
        } else {
            timings.decode += end - start;
            timings.decode_steps += n;
        }
        timings.forwards += 1;
        for j in 0..n {
            let next = seq.new_tokens()[j];
            made += 1;
            let stop = on_token(next, seq.new_logits(j))? == Step::Stop;
            let eos = opts.stop_at_eos && next == cfg.eos_token_id;
            if stop || eos {
                finish = if stop { FinishReason::Stop } else { FinishReason::Eos };
                seq.keep_generated(made);
                break 'steps;
            }
        }
    }
    Ok(Generation {
        prompt_ids: seq.prompt().to_vec(),
        generated_ids: seq.generated().to_vec(),
        finish_reason: finish,
        timings,
    })
}

/// A generated token and its logits (None: the text held back to the end).
pub type Generated<'a> = Option<(u32, &'a [f32])>;

/// [`generate_from`] with the text a reader sees: each token's piece of text from `stream`
/// (held back while it could still become a stop sequence or a character; cut at a stop
/// sequence, which ends the generation) is handed to `on_text` with the token and its logits,
/// and what is still held back at the end, if anything, last with no token. Returns the
/// generation and its whole text.
pub fn generate_text(
    model: &Model,
    seq: &mut Sequence,
    opts: &GenerateOptions,
    mut stream: TextStream,
    on_text: &mut dyn FnMut(Generated, &str) -> Result<Step>,
) -> Result<(Generation, String)> {
    let mut text = String::new();
    let g = generate_from(model, seq, opts, &mut |id, logits| {
        let (t, stopped) = stream.push(id);
        text.push_str(&t);
        let step = on_text(Some((id, logits)), &t)?;
        Ok(if stopped { Step::Stop } else { step })
    })?;
    if g.finish_reason != FinishReason::Stop {
        let t = stream.finish();
        if !t.is_empty() {
            text.push_str(&t);
            on_text(None, &t)?;
        }
    }
    Ok((g, text))
}
