//! `kvgpt score`: per-token surprisal and rank, mean loss and perplexity; with `--kv-dtype`, what
//! holding K/V in that type costs against f32 K/V (KL, top-1 agreement, perplexity change).

use crate::common::{load, print_json, read_prompt, ModelArgs, Outcome, PromptArgs};
use anyhow::Result;
use clap::Args;
use kvgpt_core::KvType;
use kvgpt_views::score::{kv_accuracy, KvAccuracy};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args)]
pub struct ScoreArgs {
    /// The text to score; `-` or nothing reads standard input.
    pub text: Option<String>,
    /// Read the text from a file (one trailing newline is dropped).
    #[arg(long, conflicts_with = "text")]
    pub file: Option<PathBuf>,
    /// Tokens per window (default: the model's context). Texts longer than it are scored in
    /// overlapping windows.
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    pub window: Option<u32>,
    /// Tokens each window moves by (default: half the window). Each token is scored once, given
    /// the tokens before it in the first window that scores it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub stride: Option<u32>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `score` prints, as text or as JSON.
#[derive(Serialize)]
struct Report {
    model: String,
    dtype: &'static str,
    kv_dtype: &'static str,
    /// With K/V held as another type than f32: what it costs against f32 K/V.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    kv_accuracy: Option<KvAccuracy>,
    ids: Vec<u32>,
    tokens_scored: usize,
    mean_loss: f64,
    perplexity: f64,
    bits_per_token: f64,
    window: usize,
    stride: usize,
    windows: usize,
    tokens: Vec<Row>,
}

#[derive(Serialize)]
struct Row {
    position: usize,
    id: u32,
    token: String,
    surprisal: f64,
    prob: f64,
    rank: usize,
    context: usize,
}

pub fn run(a: &ScoreArgs) -> Result<Outcome> {
    let text = read_prompt(&PromptArgs { prompt: a.text.clone(), prompt_file: a.file.clone() })?;
    let loaded = load(&a.model)?;
    let ids = loaded.tokenizer.encode(&text)?;
    let n = loaded.model.config.n_positions;
    let window = a.window.map_or(n, |w| w as usize);
    let stride = a.stride.map_or((window / 2).max(1), |s| s as usize);
    let s = kvgpt_views::score::score(&loaded.model, &ids, window, stride)?;
    let kv_dtype = loaded.model.kv().kv_type();
    let kv_accuracy =
        (kv_dtype != KvType::F32).then(|| kv_accuracy(&loaded.model, &ids, window, stride)).transpose()?;
    let tokens = s
        .tokens
        .iter()
        .map(|t| Row {
            position: t.position,
            id: t.id,
            token: loaded.tokenizer.token_label(t.id),
            surprisal: t.surprisal,
            prob: t.prob,
            rank: t.rank,
            context: t.context,
        })
        .collect::<Vec<_>>();
    let r = Report {
        model: a.model.model.clone(),
        dtype: loaded.model.weights_dtype(),
        kv_dtype: kv_dtype.name(),
        kv_accuracy,
        tokens_scored: tokens.len(),
        ids,
        mean_loss: s.mean_loss,
        perplexity: s.perplexity,
        bits_per_token: s.bits_per_token,
        window: s.window,
        stride: s.stride,
        windows: s.windows,
        tokens,
    };
    if a.json {
        print_json(&serde_json::to_value(&r)?)?;
    } else {
        print_text(&r)?;
    }
    Ok(Outcome::Done)
}

fn print_text(r: &Report) -> Result<()> {
    let w = if r.windows == 1 { "1 window".to_string() } else { format!("{} windows", r.windows) };
    outln!(
        "{} tokens, {} scored (the first has nothing before it), window {}, stride {}: {w}",
        r.ids.len(),
        r.tokens_scored,
        r.window,
        r.stride
    );
    outln!("{:>5}  {:<20} {:>10} {:>9} {:>7} {:>8}", "pos", "token", "surprisal", "prob", "rank", "context");
    for t in &r.tokens {
        outln!(
            "{:>5}  {:<20} {:>10.3} {:>9} {:>7} {:>8}",
            t.position,
            format!("{:?}", t.token),
            t.surprisal,
            kvgpt_views::render::prob(t.prob),
            t.rank,
            t.context
        );
    }
    outln!(
        "mean loss {:.4} nats/token | perplexity {:.2} | {:.3} bits/token",
        r.mean_loss,
        r.perplexity,
        r.bits_per_token
    );
    if let Some(k) = &r.kv_accuracy {
        outln!(
            "K/V as {} against f32 K/V: KL mean {:.3e}, max {:.3e} nats | top-1 agreement {:.2}% | perplexity {:.2} against {:.2} ({:+.3}%)",
            k.kv_dtype,
            k.kl_mean,
            k.kl_max,
            100.0 * k.top1_agreement,
            k.perplexity,
            k.perplexity_f32_kv,
            100.0 * k.perplexity_change
        );
    }
    Ok(())
}
