//! What `kvgpt generate` reports once the text is out: one JSON object (`--json`), or the
//! logprobs and the stats lines on stderr.

use super::GenerateArgs;
use crate::common::sampler_words;
use anyhow::Result;
use kvgpt_core::speculative::{DraftStats, Drafting};
use kvgpt_core::units::count;
use kvgpt_core::{GenerateOptions, Generation, Loaded, Sampling, Tokenizer};
use serde::Serialize;
use serde_json::{json, Value};

/// One generated token with its log-probability and the most likely alternatives (the server's
/// numbers: `kvgpt_core::logprobs::token_logprob`), as `--json` and the text report show it.
#[derive(Serialize)]
pub struct LogprobEntry {
    id: u32,
    token: String,
    logprob: f64,
    top: Vec<Alternative>,
}

#[derive(Serialize)]
struct Alternative {
    id: u32,
    token: String,
    logprob: f64,
}

impl LogprobEntry {
    pub fn of(tok: &Tokenizer, id: u32, logits: &[f32], k: usize) -> LogprobEntry {
        let lp = kvgpt_core::logprobs::token_logprob(logits, id, k);
        LogprobEntry {
            id,
            token: tok.token_label(id),
            logprob: lp.logprob,
            top: lp.top.iter().map(|&(i, l)| Alternative { id: i, token: tok.token_label(i), logprob: l }).collect(),
        }
    }
}

/// A finished generation and what it was asked for.
pub struct Report<'a> {
    pub a: &'a GenerateArgs,
    pub loaded: &'a Loaded,
    pub prompt: &'a str,
    pub g: &'a Generation,
    /// The text shown (cut at a stop sequence).
    pub text: &'a str,
    pub logprobs: &'a [LogprobEntry],
    pub opts: &'a GenerateOptions,
    /// Prompt tokens restored from `--prompt-cache` or `--kv-disk`.
    pub reused: usize,
    pub drafting: Option<(&'a Drafting, DraftStats)>,
    pub load_ms: f64,
    /// Loading (or quantizing) the draft model, 0 without one.
    pub draft_load_ms: f64,
    /// When the process started: the wall time is counted from there.
    pub started: std::time::Instant,
}

/// The sampler settings as `--json` and the stats line report them.
fn sampler_json(s: &Sampling) -> Value {
    json!({
        "mode": if s.is_greedy() { "greedy" } else { "sampled" },
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "seed": s.seed,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    })
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Report<'_> {
    pub fn json(&self) -> Result<Value> {
        let (a, g, model, t) = (self.a, self.g, &self.loaded.model, &self.g.timings);
        // Everything the parts below do not cover: reading the flags and the prompt,
        // tokenizing it, making its cache, writing the output.
        let wall_ms = self.started.elapsed().as_secs_f64() * 1e3;
        let other_ms = wall_ms - self.load_ms - self.draft_load_ms - ms(t.prefill) - ms(t.decode);
        let mut out = json!({
            "model": self.loaded.files.name,
            "prompt": self.prompt,
            "prompt_ids": g.prompt_ids,
            "generated_ids": g.generated_ids,
            "text": self.text,
            "finish_reason": g.finish_reason.as_str(),
            "sampler": sampler_json(&self.opts.sampling),
            "stop": a.stop,
            "dtype": model.weights_dtype(),
            "threads": rayon::current_num_threads(),
            "isa": model.isa().name(),
            "use_cache": self.opts.use_cache,
            "prompt_cache": a.prompt_cache.as_ref().map(|f| json!({"file": f, "reused_tokens": self.reused})),
            "kv_disk": a.kv_disk.kv_disk.as_ref().map(|d| json!({"dir": d, "reused_tokens": self.reused})),
            "speculative": self.drafting.map(|(d, s)| d.json(Some(s))),
            "timings": {
                "wall_ms": wall_ms,
                "load_ms": self.load_ms,
                "draft_load_ms": self.draft_load_ms,
                "other_ms": other_ms,
                "prefill_ms": ms(t.prefill),
                "prefill_tokens": t.prefill_tokens,
                "decode_ms": ms(t.decode),
                "decode_steps": t.decode_steps,
                "decode_tokens_per_s": t.decode_tokens_per_s(),
                "sample_ms": ms(t.sample),
                "sample_tokens": t.sample_tokens,
                "sample_ms_per_token": t.sample_ms_per_token(),
                "forwards": t.forwards,
                "draft_ms": ms(t.draft),
            },
        });
        if a.logprobs.is_some() {
            out["logprobs"] = serde_json::to_value(self.logprobs)?;
        }
        Ok(out)
    }

    /// `--logprobs` on stderr, under the text.
    pub fn print_logprobs(&self) {
        if self.a.logprobs.is_none() {
            return;
        }
        errln!("[kvgpt] log-probabilities (natural log) of the generated tokens and the top alternatives:");
        for (i, e) in self.logprobs.iter().enumerate() {
            let alts: Vec<String> = e.top.iter().map(|c| format!("{:?} {:.3}", c.token, c.logprob)).collect();
            errln!("  {i:>3} {:>6} {:<16} {:>8.3}  | {}", e.id, format!("{:?}", e.token), e.logprob, alts.join(", "));
        }
    }

    /// The prompt cache's reuse, the draft's acceptance and the timings, on stderr.
    pub fn print_stats(&self) {
        let (g, t, model) = (self.g, &self.g.timings, &self.loaded.model);
        if let Some(f) = &self.a.prompt_cache {
            let of = count(g.prompt_ids.len(), "prompt token");
            errln!("[kvgpt] prompt cache {}: reused {} of {of}", f.display(), self.reused);
        }
        if let Some(d) = &self.a.kv_disk.kv_disk {
            let of = count(g.prompt_ids.len(), "prompt token");
            errln!("[kvgpt] K/V disk {}: reused {} of {of}", d.display(), self.reused);
        }
        if let Some((d, s)) = self.drafting {
            errln!(
                "[kvgpt] draft {}: accepted {} of {} drafted tokens ({:.0}%) in {} verify steps; {} tokens in {} \
                 forward calls; drafting {:.1} ms",
                d.name,
                s.accepted,
                s.drafted,
                100.0 * s.acceptance(),
                s.steps,
                g.generated_ids.len(),
                t.forwards,
                ms(t.draft)
            );
        }
        // Each step's figure includes choosing its token (see `Timings`); sampling is also shown alone.
        errln!(
            "[kvgpt] load {:.0} ms | prefill {} {:.1} ms ({:.0} tok/s) | decode {} {:.2} ms/token ({:.1} tok/s) | \
             sampling {:.3} ms/token | {} | {} | {} {} {} | finish: {}",
            self.load_ms,
            count(t.prefill_tokens, "token"),
            ms(t.prefill),
            t.prefill_tokens as f64 / t.prefill.as_secs_f64().max(1e-9),
            count(t.decode_steps, "token"),
            t.decode_ms_per_token(),
            t.decode_tokens_per_s(),
            t.sample_ms_per_token(),
            if self.opts.use_cache { "KV cache on" } else { "KV cache off (recompute)" },
            sampler_words(&self.opts.sampling),
            model.weights_dtype(),
            count(rayon::current_num_threads(), "thread"),
            model.isa().name(),
            g.finish_reason.as_str(),
        );
    }
}
