//! The `kvgpt` command line: argument parsing, output formats, exit codes, error messages.
//! Everything numeric lives in the library; this binary only asks and prints.

#![forbid(unsafe_code)]

/// `println!` that returns an error naming standard output instead of panicking on a closed
/// pipe or a full disk; use inside functions that return `anyhow::Result`.
macro_rules! outln {
    ($($t:tt)*) => { $crate::out::line(format_args!($($t)*))? };
}
/// `print!` in the same way.
macro_rules! out {
    ($($t:tt)*) => { $crate::out::text(format_args!($($t)*))? };
}
/// `eprintln!` that never panics: a diagnostic nobody can read is dropped.
macro_rules! errln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

mod bench;
mod cache;
mod chat;
mod common;
mod convert;
mod draft;
mod errors;
mod generate;
mod info;
mod inspect;
mod kv_disk;
mod out;
mod score;
mod serve;
mod verify;

use anyhow::Result;
use clap::{Parser, Subcommand};
use common::{with_threads, Input, Outcome};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "kvgpt", version, about = "A from-scratch DistilGPT-2 inference engine with a per-layer KV cache")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Continue a prompt, streaming the text as tokens arrive (greedy unless a sampling flag is given).
    Generate(generate::GenerateArgs),
    /// Talk with the model turn by turn, keeping the KV cache between turns (/help for commands).
    Chat(chat::ChatArgs),
    /// Show the token ids and pieces of a text (--json: {"ids", "tokens", "pieces"}).
    Tokenize(Input),
    /// Look inside the forward pass: tokens, embeddings, attention, logits, the KV cache.
    #[command(subcommand)]
    Inspect(inspect::InspectCmd),
    /// Walk through one forward pass and one cached decode step, with the real shapes and numbers.
    Explain(inspect::ExplainArgs),
    /// Check the engine: cached against uncached decoding, or against golden logits.
    #[command(subcommand)]
    Verify(verify::VerifyCmd),
    /// What a model is: config, parameters, bytes per dtype, KV cache, tokenizer, the kernels' ISA.
    Info(info::InfoArgs),
    /// Score a text: each token's surprisal and rank, the mean loss and the perplexity.
    Score(score::ScoreArgs),
    /// Measure prefill and decode speed, cached against uncached (forward passes only).
    Bench(bench::BenchArgs),
    /// Serve the model over HTTP (OpenAI-compatible), batching requests, with a prompt cache.
    Serve(serve::ServeArgs),
    /// The prompt cache across requests, offline: `cache diff A B …` says where reuse stops.
    #[command(subcommand)]
    Cache(cache::CacheCmd),
    /// Write a model as a GGUF file llama.cpp reads: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1.
    Convert(convert::ConvertArgs),
}

/// The command line with negative numbers accepted as option values everywhere, so that
/// `-n -5` is refused by the option's own range check ("invalid value '-5'") rather than read as
/// an unknown flag with clap's tip to write `-- -5` (which would make it a prompt).
fn command() -> clap::Command {
    fn negatives(cmd: clap::Command) -> clap::Command {
        let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
        let mut cmd = cmd.mut_args(|a| if a.get_action().takes_values() { a.allow_negative_numbers(true) } else { a });
        for name in subs {
            cmd = cmd.mut_subcommand(name, negatives);
        }
        cmd
    }
    negatives(<Cli as clap::CommandFactory>::command())
}

fn main() -> ExitCode {
    // Where `generate --json`'s wall time starts: its timings account for the whole run.
    let started = std::time::Instant::now();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let flag = cli.cmd.new_tokens_flag();
    let serve = matches!(cli.cmd, Cmd::Serve(_));
    let result = if serve { run(cli, started) } else { out::check_open().and_then(|()| run(cli, started)) };
    // Whatever is still buffered must reach stdout too, or the failure is reported.
    let result = result.and_then(|o| out::flush().map(|()| o));
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::CheckFailed) => ExitCode::FAILURE,
        Err(e) if errors::is_broken_pipe(&e) => ExitCode::from(errors::BROKEN_PIPE_EXIT),
        Err(e) => {
            errln!("error: {e:#}");
            if let Some(hint) = errors::hint(&e, flag) {
                errln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

impl Cmd {
    /// The flag that sets how many tokens a command adds after the prompt, if it has one.
    fn new_tokens_flag(&self) -> Option<&'static str> {
        match self {
            Cmd::Generate(_) | Cmd::Chat(_) => Some("--max-new-tokens"),
            Cmd::Verify(_) => Some("--steps"),
            Cmd::Bench(_) => Some("-n"),
            Cmd::Serve(_) => Some("max_tokens"),
            Cmd::Inspect(inspect::InspectCmd::Attention { .. } | inspect::InspectCmd::Cache { .. }) => {
                Some("--generate")
            }
            Cmd::Inspect(_)
            | Cmd::Explain(_)
            | Cmd::Tokenize(_)
            | Cmd::Score(_)
            | Cmd::Info(_)
            | Cmd::Cache(_)
            | Cmd::Convert(_) => None,
        }
    }
}

fn run(cli: Cli, started: std::time::Instant) -> Result<Outcome> {
    match cli.cmd {
        Cmd::Generate(a) => with_threads(&a.model, || generate::run(&a, started)),
        Cmd::Tokenize(a) => generate::tokenize(&a),
        Cmd::Chat(a) => with_threads(&a.model, || chat::run(&a)),
        Cmd::Inspect(c) => {
            let m = c.model_args().clone();
            with_threads(&m, || inspect::run(c))
        }
        Cmd::Explain(a) => with_threads(&a.model, || inspect::explain(&a)),
        Cmd::Bench(a) => bench::run(&a), // a pool per thread count of -t
        Cmd::Score(a) => with_threads(&a.model, || score::run(&a)),
        Cmd::Info(a) => info::run(&a),
        Cmd::Verify(c) => {
            let m = c.model_args().clone();
            with_threads(&m, || verify::run(c))
        }
        Cmd::Serve(a) => serve::run(&a).map(|()| Outcome::Done),
        Cmd::Cache(c) => with_threads(c.model_args(), || cache::run(&c)),
        Cmd::Convert(a) => convert::run(&a),
    }
}
