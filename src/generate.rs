//! `kvgpt generate` and `kvgpt tokenize`.

use crate::common::{
    load, locate, print_json, prompt_ids, read_prompt, sampler_words, Input, ModelArgs, Outcome, PromptArgs,
    SamplingArgs,
};
use crate::draft::DraftArgs;
use anyhow::{bail, Result};
use clap::Args;
use kvgpt_core::stop::TextStream;
use kvgpt_core::units::count;
use kvgpt_core::{generate_text, prompt_file, GenerateOptions, Sampling, Sequence, Step, Tokenizer};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    /// How many tokens to generate at most.
    #[arg(long, short = 'n', default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_new_tokens: u32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop where the generated text first contains STR (cut before it; repeatable).
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    /// Keep generating after <|endoftext|>.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Recompute the whole sequence at every step instead of using the KV cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Report each generated token's log-probability and the K most likely alternatives
    /// (from the model's distribution before temperature, top-k and top-p).
    #[arg(long, value_name = "K")]
    pub logprobs: Option<usize>,
    /// Print one JSON object on stdout instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Reuse the K/V of the longest prefix this file holds and compute only the rest (the same
    /// bits as without it), then save this prompt's K/V there (created if missing).
    #[arg(long, value_name = "FILE", conflicts_with = "no_cache")]
    pub prompt_cache: Option<PathBuf>,
    #[command(flatten)]
    pub draft: DraftArgs,
}

fn checked_stops(a: &GenerateArgs) -> Result<()> {
    if a.stop.iter().any(String::is_empty) {
        bail!("--stop needs a non-empty string");
    }
    if a.no_cache && (a.draft.draft.is_some() || a.draft.draft_model.is_some()) {
        bail!("--draft needs the KV cache (a verify step rolls it back); drop --no-cache");
    }
    Ok(())
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

/// One generated token with its log-probability and the most likely alternatives (the server's
/// numbers: `kvgpt_core::logprobs::token_logprob`), as `--json` and the text report show it.
#[derive(Serialize)]
struct LogprobEntry {
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
    fn of(tok: &Tokenizer, id: u32, logits: &[f32], k: usize) -> LogprobEntry {
        let lp = kvgpt_core::logprobs::token_logprob(logits, id, k);
        LogprobEntry {
            id,
            token: tok.token_label(id),
            logprob: lp.logprob,
            top: lp.top.iter().map(|&(i, l)| Alternative { id: i, token: tok.token_label(i), logprob: l }).collect(),
        }
    }
}

pub fn run(a: &GenerateArgs) -> Result<Outcome> {
    let sampling = a.sampling.sampling()?;
    checked_stops(a)?;
    let prompt = read_prompt(&a.prompt)?;
    let t0 = Instant::now();
    let loaded = load(&a.model)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (model, tok) = (&loaded.model, &loaded.tokenizer);
    let eos = model.config.eos_token_id;
    let ids = prompt_ids(&loaded, &prompt)?;
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens as usize,
        sampling,
        stop_at_eos: !a.ignore_eos,
        use_cache: !a.no_cache,
    };
    let mut seq = Sequence::new(model, &ids, opts.max_new_tokens, opts.sampling)?;
    let mut saved_ids = None;
    if let Some(file) = &a.prompt_cache {
        crate::common::refuse_input_path(file, &loaded.files, a.prompt.prompt_file.as_deref())?;
        if file.exists() {
            let saved = prompt_file::load(file, model)?;
            let reuse = prompt_file::reusable(&saved, &ids);
            seq.restore(&saved.kv, 0, reuse)?;
            saved_ids = Some(saved.ids);
        }
    }
    let reused = seq.cache().len();
    let drafting = a.draft.load(&a.model, &loaded)?;
    if let Some(d) = &drafting {
        seq.speculate_with(&d.config);
    }

    let mut stdout = std::io::stdout().lock();
    if !a.json {
        write!(stdout, "{prompt}").and_then(|_| stdout.flush()).map_err(crate::out::error)?;
    }
    let mut logprobs = Vec::new();
    let stream = TextStream::new(tok, opts.stop_at_eos.then_some(eos), a.stop.clone());
    // `text` is what was shown: the generated text, cut at a stop sequence.
    let (g, text) = generate_text(model, &mut seq, &opts, stream, &mut |token, t| {
        if let (Some((id, logits)), Some(k)) = (token, a.logprobs) {
            logprobs.push(LogprobEntry::of(tok, id, logits, k));
        }
        if !a.json && !t.is_empty() {
            write!(stdout, "{t}")
                .and_then(|_| stdout.flush())
                .map_err(|source| kvgpt_core::Error::Write { what: "standard output".into(), source })?;
        }
        Ok(Step::Go)
    })?;
    if let Some(file) = &a.prompt_cache {
        if saved_ids.as_deref() != Some(&ids[..]) {
            prompt_file::save(file, model, &ids, seq.cache())?;
        }
    }
    let t = &g.timings;
    let draft_stats = seq.speculation().map(|s| s.stats);
    let prefill_ms = t.prefill.as_secs_f64() * 1e3;
    let decode_ms = t.decode.as_secs_f64() * 1e3;
    if a.json {
        let mut out = json!({
            "model": loaded.files.name,
            "prompt": prompt,
            "prompt_ids": g.prompt_ids,
            "generated_ids": g.generated_ids,
            "text": text,
            "finish_reason": g.finish_reason.as_str(),
            "sampler": sampler_json(&opts.sampling),
            "stop": a.stop,
            "dtype": model.weights_dtype(),
            "threads": rayon::current_num_threads(),
            "isa": model.isa().name(),
            "use_cache": opts.use_cache,
            "prompt_cache": a.prompt_cache.as_ref().map(|f| json!({"file": f, "reused_tokens": reused})),
            "speculative": drafting.as_ref().map(|d| d.json(draft_stats)),
            "timings": {
                "load_ms": load_ms,
                "prefill_ms": prefill_ms,
                "prefill_tokens": t.prefill_tokens,
                "decode_ms": decode_ms,
                "decode_steps": t.decode_steps,
                "decode_tokens_per_s": t.decode_tokens_per_s(),
                "sample_ms": t.sample.as_secs_f64() * 1e3,
                "sample_tokens": t.sample_tokens,
                "sample_ms_per_token": t.sample_ms_per_token(),
                "forwards": t.forwards,
                "draft_ms": t.draft.as_secs_f64() * 1e3,
            },
        });
        if a.logprobs.is_some() {
            out["logprobs"] = serde_json::to_value(&logprobs)?;
        }
        drop(stdout);
        print_json(&out)?;
    } else {
        writeln!(stdout)?;
        drop(stdout);
        if a.logprobs.is_some() {
            errln!("[kvgpt] log-probabilities (natural log) of the generated tokens and the top alternatives:");
            for (i, e) in logprobs.iter().enumerate() {
                let alts: Vec<String> = e.top.iter().map(|c| format!("{:?} {:.3}", c.token, c.logprob)).collect();
                errln!(
                    "  {i:>3} {:>6} {:<16} {:>8.3}  | {}",
                    e.id,
                    format!("{:?}", e.token),
                    e.logprob,
                    alts.join(", ")
                );
            }
        }
    }
    if let Some(f) = &a.prompt_cache {
        errln!("[kvgpt] prompt cache {}: reused {reused} of {} prompt tokens", f.display(), ids.len());
    }
    if let (Some(d), Some(s)) = (&drafting, draft_stats) {
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
            t.draft.as_secs_f64() * 1e3
        );
    }
    // Each step's figure includes choosing its token (see `Timings`); sampling is also shown alone.
    errln!(
        "[kvgpt] load {load_ms:.0} ms | prefill {} {prefill_ms:.1} ms ({:.0} tok/s) | decode {} \
         {:.2} ms/token ({:.1} tok/s) | sampling {:.3} ms/token | {} | {} | {} {} {} | finish: {}",
        count(t.prefill_tokens, "token"),
        t.prefill_tokens as f64 / t.prefill.as_secs_f64().max(1e-9),
        count(t.decode_steps, "token"),
        t.decode_ms_per_token(),
        t.decode_tokens_per_s(),
        t.sample_ms_per_token(),
        if opts.use_cache { "KV cache on" } else { "KV cache off (recompute)" },
        sampler_words(&opts.sampling),
        model.weights_dtype(),
        count(rayon::current_num_threads(), "thread"),
        model.isa().name(),
        g.finish_reason.as_str(),
    );
    Ok(Outcome::Done)
}

pub fn tokenize(a: &Input) -> Result<Outcome> {
    let text = read_prompt(&a.prompt)?;
    let tok = Tokenizer::from_files(&locate(&a.model)?.tokenizer)?;
    let ids = tok.encode(&text)?;
    let tokens: Vec<String> = ids.iter().map(|&i| tok.token_text(i)).collect();
    let pieces: Vec<String> = ids.iter().map(|&i| tok.piece(i)).collect();
    if a.json {
        print_json(&json!({ "ids": ids, "tokens": tokens, "pieces": pieces }))?;
    } else {
        outln!("{}", count(ids.len(), "token"));
        for (id, p) in ids.iter().zip(&pieces) {
            outln!("{id:>6}  {:<20} {p}", format!("{:?}", tok.token_label(*id)));
        }
    }
    Ok(Outcome::Done)
}
