//! `kvgpt generate` and `kvgpt tokenize`.

mod report;

use crate::common::{
    load, locate, print_json, prompt_ids, read_prompt, Input, ModelArgs, Outcome, PromptArgs, SamplingArgs,
};
use crate::draft::DraftArgs;
use anyhow::{bail, Result};
use clap::Args;
use kvgpt_core::stop::TextStream;
use kvgpt_core::units::count;
use kvgpt_core::{generate_text, prompt_file, GenerateOptions, Generation, Loaded, Sequence, Step, Tokenizer};
use report::{LogprobEntry, Report};
use serde_json::json;
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
    pub kv_disk: crate::kv_disk::KvDiskArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
}

fn checked_stops(a: &GenerateArgs) -> Result<()> {
    if a.stop.iter().any(String::is_empty) {
        bail!("--stop needs a non-empty string");
    }
    if a.no_cache && a.kv_disk.kv_disk.is_some() {
        bail!("--kv-disk reuses and keeps K/V, which --no-cache does not hold: drop one of them");
    }
    if a.no_cache && (a.draft.draft.is_some() || a.draft.draft_model.is_some()) {
        bail!("--draft needs the KV cache (a verify step rolls it back); drop --no-cache");
    }
    Ok(())
}

/// Generates as `a` asks; `started` is when the process started, where the reported wall time
/// begins.
pub fn run(a: &GenerateArgs, started: Instant) -> Result<Outcome> {
    let sampling = a.sampling.sampling()?;
    checked_stops(a)?;
    let prompt = read_prompt(&a.prompt)?;
    let t0 = Instant::now();
    let loaded = load(&a.model)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let ids = prompt_ids(&loaded, &prompt)?;
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens as usize,
        sampling,
        stop_at_eos: !a.ignore_eos,
        use_cache: !a.no_cache,
    };
    let mut seq = Sequence::new(&loaded.model, &ids, opts.max_new_tokens, opts.sampling)?;
    let saved = restore_prompt_cache(a, &loaded, &ids, &mut seq)?;
    let store = a.kv_disk.open(&loaded.model)?;
    if let Some(store) = &store {
        store.restore(&loaded.model, &mut seq)?; // unless --prompt-cache restored a prefix
    }
    let reused = seq.cache().len();
    let t0 = Instant::now();
    let drafting = a.draft.load(&a.model, &loaded)?;
    let draft_load_ms = t0.elapsed().as_secs_f64() * 1e3;
    if let Some(d) = &drafting {
        seq.speculate_with(&d.config);
    }
    let (g, text, logprobs) = stream(a, &loaded, &prompt, &mut seq, &opts)?;
    if let Some(file) = &a.prompt_cache {
        if saved.as_deref() != Some(&ids[..]) {
            prompt_file::save(file, &loaded.model, &ids, seq.cache())?;
        }
    }
    if let Some(store) = &store {
        store.save(&seq, ids.len()); // written by the time the store is dropped
    }
    let draft_stats = seq.speculation().map(|s| s.stats);
    let report = Report {
        a,
        loaded: &loaded,
        prompt: &prompt,
        g: &g,
        text: &text,
        logprobs: &logprobs,
        opts: &opts,
        reused,
        drafting: drafting.as_ref().map(|d| (d, draft_stats.unwrap_or_default())),
        load_ms,
        draft_load_ms,
        started,
    };
    if a.json {
        // The stats first: the JSON's wall time then covers all but writing it.
        report.print_stats();
        print_json(&report.json()?)?;
    } else {
        outln!("");
        report.print_logprobs();
        report.print_stats();
    }
    // The process ends here: freeing the model and the tokenizer's tables took 5-7 ms of the
    // bundled model's 85 ms, time its timings would not show.
    std::mem::forget(loaded);
    Ok(Outcome::Done)
}

/// Starts `seq` from the longest prefix `--prompt-cache`'s file holds, if it exists: the ids it
/// holds.
fn restore_prompt_cache(
    a: &GenerateArgs,
    loaded: &Loaded,
    ids: &[u32],
    seq: &mut Sequence,
) -> Result<Option<Vec<u32>>> {
    let Some(file) = &a.prompt_cache else { return Ok(None) };
    let prompt_file = a.prompt.prompt_file.as_deref().map(|p| (p, "the prompt file"));
    crate::draft::inputs(&a.model, &loaded.files, Some(&a.draft), prompt_file.as_slice())?.refuse_as_output(file)?;
    if !file.exists() {
        return Ok(None);
    }
    let saved = prompt_file::load(file, &loaded.model)?;
    seq.restore(&saved.kv, 0, prompt_file::reusable(&saved, ids))?;
    Ok(Some(saved.ids))
}

/// Generates, streaming the prompt and then the text to stdout as it comes (unless `--json`):
/// the generation, its text (cut at a stop sequence) and each token's logprobs (`--logprobs`).
fn stream(
    a: &GenerateArgs,
    loaded: &Loaded,
    prompt: &str,
    seq: &mut Sequence,
    opts: &GenerateOptions,
) -> Result<(Generation, String, Vec<LogprobEntry>)> {
    let (model, tok) = (&loaded.model, &loaded.tokenizer);
    let mut stdout = std::io::stdout().lock();
    if !a.json {
        write!(stdout, "{prompt}").and_then(|_| stdout.flush()).map_err(crate::out::error)?;
    }
    let mut logprobs = Vec::new();
    let stream = TextStream::new(tok, opts.stop_at_eos.then_some(model.config.eos_token_id), a.stop.clone());
    let (g, text) = generate_text(model, seq, opts, stream, &mut |token, t| {
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
    Ok((g, text, logprobs))
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
