//! The `kvgpt` command line: argument parsing, output formats, exit codes, error messages.
//! Everything numeric lives in the library.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use kvgpt::{generate, hub, FinishReason, GenerateOptions, Loaded, Locate, Sampling, StreamDecoder};
use serde_json::json;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "kvgpt", version, about = "A from-scratch DistilGPT-2 inference engine with a per-layer KV cache")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Continue a prompt, streaming the text as tokens arrive (greedy unless a sampling flag is given).
    Generate(GenerateArgs),
    /// Show the token ids and pieces of a text.
    Tokenize(TokenizeArgs),
}

#[derive(Args)]
struct ModelArgs {
    /// A model folder (config.json, model.safetensors, tokenizer.json) or a Hugging Face Hub id.
    #[arg(long, default_value = hub::DEFAULT_MODEL)]
    model: String,
    /// Use only the local Hugging Face cache, never the network (also: HF_HUB_OFFLINE=1).
    #[arg(long)]
    offline: bool,
    /// Worker threads for the kernels (default: one per core).
    #[arg(long, short = 't', value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
}

#[derive(Args)]
struct PromptArgs {
    /// The prompt text; `-` or nothing reads standard input (one trailing newline is dropped).
    prompt: Option<String>,
    /// Read the prompt from a file (one trailing newline is dropped).
    #[arg(long, conflicts_with = "prompt")]
    prompt_file: Option<PathBuf>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    model: ModelArgs,
    /// How many tokens to generate at most.
    #[arg(long, short = 'n', default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    max_new_tokens: u32,
    /// Sample with this temperature (0 = greedy). Giving any sampling flag turns sampling on.
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Sample only from the K most likely tokens.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    top_k: Option<u32>,
    /// Sample only from the most likely tokens whose probabilities add up to P (0 < P <= 1).
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Seed of the ChaCha20 sampling RNG: the same seed gives the same text everywhere.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating after <|endoftext|>.
    #[arg(long)]
    ignore_eos: bool,
    /// Recompute the whole sequence at every step instead of using the KV cache.
    #[arg(long)]
    no_cache: bool,
    /// Print one JSON object on stdout instead of streaming text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TokenizeArgs {
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    model: ModelArgs,
    /// Print {"ids", "tokens", "pieces"} as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Generate(a) => with_threads(&a.model, || cmd_generate(&a)),
        Cmd::Tokenize(a) => cmd_tokenize(&a),
    }
}

/// Runs `f` inside a rayon pool of the requested size (no global state is changed).
fn with_threads(m: &ModelArgs, f: impl FnOnce() -> Result<()> + Send) -> Result<()> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(n) = m.threads {
        b = b.num_threads(n as usize);
    }
    b.build().context("could not start the worker threads")?.install(f)
}

fn locate(m: &ModelArgs) -> Result<kvgpt::ModelFiles> {
    Ok(Locate::from_env(m.offline).resolve(&m.model)?)
}

fn load(m: &ModelArgs) -> Result<Loaded> {
    Ok(kvgpt::load(&locate(m)?)?)
}

/// The prompt text from the argument, `--prompt-file` or standard input.
fn read_prompt(p: &PromptArgs) -> Result<String> {
    let text = match (&p.prompt, &p.prompt_file) {
        (_, Some(file)) => std::fs::read_to_string(file)
            .with_context(|| format!("could not read the prompt file {}", file.display()))?,
        (Some(t), None) if t != "-" => return Ok(t.clone()),
        _ => {
            if std::io::stdin().is_terminal() {
                eprintln!("(reading the prompt from standard input; end it with Ctrl-D)");
            }
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("could not read the prompt from standard input")?;
            s
        }
    };
    let text = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
    Ok(text.to_string())
}

fn sampling(a: &GenerateArgs) -> Result<Sampling> {
    if let Some(t) = a.temperature {
        if !(t.is_finite() && t >= 0.0) {
            bail!("--temperature must be a number >= 0 (0 = greedy), got {t}");
        }
    }
    if let Some(p) = a.top_p {
        if !(p > 0.0 && p <= 1.0) {
            bail!("--top-p must be in (0, 1], got {p}");
        }
    }
    let sampled = a.temperature.is_some() || a.top_k.is_some() || a.top_p.is_some();
    let temperature = if sampled { a.temperature.unwrap_or(1.0) } else { 0.0 };
    Ok(Sampling { temperature, top_k: a.top_k.map(|k| k as usize), top_p: a.top_p, seed: a.seed })
}

fn cmd_generate(a: &GenerateArgs) -> Result<()> {
    let sampling = sampling(a)?;
    let prompt = read_prompt(&a.prompt)?;
    let t0 = Instant::now();
    let loaded = load(&a.model)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (model, tok) = (&loaded.model, &loaded.tokenizer);
    let eos = model.config.eos_token_id;
    let mut prompt_ids = tok.encode(&prompt)?;
    if prompt_ids.is_empty() {
        prompt_ids.push(model.config.bos_token_id);
    }
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens as usize,
        sampling,
        stop_at_eos: !a.ignore_eos,
        use_cache: !a.no_cache,
    };
    kvgpt::generate::check_context(model, prompt_ids.len(), opts.max_new_tokens)?;

    let mut stdout = std::io::stdout().lock();
    let mut stream = StreamDecoder::default();
    if !a.json {
        write!(stdout, "{prompt}").and_then(|_| stdout.flush())?;
    }
    let stop_at_eos = opts.stop_at_eos;
    let g = generate(model, &prompt_ids, &opts, &mut |id| {
        if a.json || (stop_at_eos && id == eos) {
            return Ok(());
        }
        let text = stream.push(tok.token_bytes(id));
        write!(stdout, "{text}")
            .and_then(|_| stdout.flush())
            .map_err(|e| kvgpt::Error::Invalid(format!("could not write to standard output: {e}")))
    })?;
    let shown: &[u32] = match g.finish_reason {
        FinishReason::Eos => &g.generated_ids[..g.generated_ids.len() - 1],
        FinishReason::Length => &g.generated_ids,
    };
    let t = &g.timings;
    let prefill_ms = t.prefill.as_secs_f64() * 1e3;
    let decode_ms = t.decode.as_secs_f64() * 1e3;
    if a.json {
        let out = json!({
            "model": loaded.files.name,
            "prompt": prompt,
            "prompt_ids": g.prompt_ids,
            "generated_ids": g.generated_ids,
            "text": tok.decode(shown),
            "finish_reason": g.finish_reason.as_str(),
            "use_cache": opts.use_cache,
            "timings": {
                "load_ms": load_ms,
                "prefill_ms": prefill_ms,
                "prefill_tokens": t.prefill_tokens,
                "decode_ms": decode_ms,
                "decode_steps": t.decode_steps,
                "decode_tokens_per_s": t.decode_tokens_per_s(),
            },
        });
        writeln!(stdout, "{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        writeln!(stdout, "{}", stream.finish())?;
    }
    drop(stdout);
    let per_tok = if t.decode_steps > 0 { decode_ms / t.decode_steps as f64 } else { 0.0 };
    eprintln!(
        "[kvgpt] load {load_ms:.0} ms | prefill {} tokens {prefill_ms:.1} ms ({:.0} tok/s) | decode {} tokens \
         {per_tok:.2} ms/token ({:.1} tok/s) | {} | finish: {}",
        t.prefill_tokens,
        t.prefill_tokens as f64 / t.prefill.as_secs_f64().max(1e-9),
        t.decode_steps,
        t.decode_tokens_per_s(),
        if opts.use_cache { "KV cache on" } else { "KV cache off (recompute)" },
        g.finish_reason.as_str(),
    );
    Ok(())
}

fn cmd_tokenize(a: &TokenizeArgs) -> Result<()> {
    let text = read_prompt(&a.prompt)?;
    let files = locate(&a.model)?;
    let tok = kvgpt::Tokenizer::from_files(&files.tokenizer)?;
    let ids = tok.encode(&text)?;
    let tokens: Vec<String> = ids.iter().map(|&i| tok.token_text(i)).collect();
    let pieces: Vec<String> = ids.iter().map(|&i| tok.piece(i)).collect();
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", json!({ "ids": ids, "tokens": tokens, "pieces": pieces }))?;
    } else {
        writeln!(out, "{} tokens", ids.len())?;
        for ((id, t), p) in ids.iter().zip(&tokens).zip(&pieces) {
            writeln!(out, "{id:>6}  {:<20} {p}", format!("{t:?}"))?;
        }
    }
    Ok(())
}
