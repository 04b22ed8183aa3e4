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
mod chat;
mod generate;
mod info;
mod inspect;
mod render;
mod score;
mod serve;
mod verify;

/// Standard output without panics: every write error comes back as an error that names it.
pub mod out {
    use std::io::Write;

    /// A write to standard output failed (the source says how: a closed pipe, a full disk…).
    #[derive(Debug, thiserror::Error)]
    #[error("could not write to standard output")]
    pub struct StdoutError(#[source] pub std::io::Error);

    pub fn error(e: std::io::Error) -> anyhow::Error {
        StdoutError(e).into()
    }

    pub fn text(args: std::fmt::Arguments) -> anyhow::Result<()> {
        std::io::stdout().lock().write_fmt(args).map_err(error)
    }

    pub fn line(args: std::fmt::Arguments) -> anyhow::Result<()> {
        let mut o = std::io::stdout().lock();
        o.write_fmt(args).and_then(|()| o.write_all(b"\n")).map_err(error)
    }

    pub fn flush() -> anyhow::Result<()> {
        std::io::stdout().lock().flush().map_err(error)
    }

    /// Fails if standard output was closed (`>&-`): writes to it would vanish without an error.
    pub fn check_open() -> anyhow::Result<()> {
        if kvgpt_process::stdout_closed_at_start() {
            anyhow::bail!("standard output is closed; redirect it, e.g. to a file or /dev/null");
        }
        Ok(())
    }
}

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use kvgpt::{hub, Loaded, Locate};
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
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
}

/// Where the model comes from and how many threads run it.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// A model folder (config.json, model.safetensors, tokenizer.json) or a Hugging Face Hub id.
    #[arg(long, default_value = hub::DEFAULT_MODEL)]
    pub model: String,
    /// Use only the local Hugging Face cache, never the network (also: HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
    /// Worker threads for the kernels (default: one per core).
    #[arg(long, short = 't', value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// How the weight matrices are held: f32, f16 or bf16 (16-bit storage, f32 arithmetic); q8
    /// (int8 weights with an f32 scale per row and 32 columns, f32 activations and arithmetic);
    /// or w8a8 (int8 weights with a scale per column and 32 rows, times activations quantized to
    /// int8 per token and 32 values: integer dot products). Both int8 types quantize at load.
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    pub dtype: Dtype,
    /// The instruction set the kernels use (default: the best this CPU has). Any of them gives
    /// the same bits; this is for measuring one against another.
    #[arg(long, value_name = "NAME")]
    pub isa: Option<String>,
}

#[derive(Clone, Copy, clap::ValueEnum, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    Q8,
    W8a8,
}

impl Dtype {
    pub fn weight_type(self) -> kvgpt::WeightType {
        match self {
            Dtype::F32 => kvgpt::WeightType::F32,
            Dtype::F16 => kvgpt::WeightType::F16,
            Dtype::Bf16 => kvgpt::WeightType::Bf16,
            Dtype::Q8 => kvgpt::WeightType::Q8,
            Dtype::W8a8 => kvgpt::WeightType::W8A8,
        }
    }
}

/// The prompt, from the command line, a file or standard input.
#[derive(Args, Clone)]
pub struct PromptArgs {
    /// The prompt text; `-` or nothing reads standard input (one trailing newline is dropped).
    pub prompt: Option<String>,
    /// Read the prompt from a file (one trailing newline is dropped).
    #[arg(long, conflicts_with = "prompt")]
    pub prompt_file: Option<PathBuf>,
}

/// A prompt, a model and the output format: what most commands take.
#[derive(Args, Clone)]
pub struct Input {
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What every command exits with: success, or a check that failed (exit 1 after printing).
pub enum Outcome {
    Done,
    CheckFailed,
}

/// The exit status of a process that a closed pipe ended (128 + SIGPIPE), as the shell reports
/// for Unix tools: `kvgpt … | head` stops quietly with it.
const BROKEN_PIPE_EXIT: u8 = 141;

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
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let flag = cli.cmd.new_tokens_flag();
    let serve = matches!(cli.cmd, Cmd::Serve(_));
    let result = if serve { run(cli) } else { out::check_open().and_then(|()| run(cli)) };
    // Whatever is still buffered must reach stdout too, or the failure is reported.
    let result = result.and_then(|o| out::flush().map(|()| o));
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::CheckFailed) => ExitCode::FAILURE,
        Err(e) if is_broken_pipe(&e) => ExitCode::from(BROKEN_PIPE_EXIT),
        Err(e) => {
            errln!("error: {e:#}");
            if let Some(hint) = hint(&e, flag) {
                errln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Did the reader of stdout (or stderr) go away?
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
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
            Cmd::Inspect(_) | Cmd::Explain(_) | Cmd::Tokenize(_) | Cmd::Score(_) | Cmd::Info(_) => None,
        }
    }
}

/// What the user can do about a library error, in terms of this command's flags.
fn hint(e: &anyhow::Error, flag: Option<&str>) -> Option<String> {
    match e.downcast_ref::<kvgpt::Error>()? {
        kvgpt::Error::ContextOverflow { room, .. } if *room > 0 => match flag {
            Some(flag) => Some(format!("shorten the prompt or lower {flag} to at most {room}")),
            None => Some("shorten the prompt".into()),
        },
        kvgpt::Error::ContextOverflow { n_positions, .. } => {
            Some(format!("shorten the prompt to at most {n_positions} tokens"))
        }
        kvgpt::Error::NotCached { .. } => Some(format!(
            "run once without --offline (and HF_HUB_OFFLINE unset), or pass --model /path/to/folder{}",
            bundled_model_hint()
        )),
        kvgpt::Error::HubFetch { .. } | kvgpt::Error::NotAModel { .. } => Some(format!(
            "pass a local folder with --model /path/to/folder (config.json, model.safetensors, tokenizer.json){}",
            bundled_model_hint()
        )),
        kvgpt::Error::WhichTensor { .. } => Some("name it with --tensor NAME".into()),
        _ => None,
    }
}

/// The small model bundled with the source (random weights, the real tokenizer), as a way to try
/// every command without the Hub: named relative to the working directory when it is there,
/// else by the source folder's path when that still exists.
fn bundled_model_hint() -> String {
    const REL: &str = "tests/fixtures/tiny-gpt2";
    let abs = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-gpt2");
    let path = if std::path::Path::new(REL).join("config.json").is_file() {
        REL
    } else if std::path::Path::new(abs).join("config.json").is_file() {
        abs
    } else {
        return String::new();
    };
    format!("; to try every command now, use the small bundled model: --model {path} (random weights, the real GPT-2 tokenizer)")
}

fn run(cli: Cli) -> Result<Outcome> {
    match cli.cmd {
        Cmd::Generate(a) => with_threads(&a.model, || generate::run(&a)),
        Cmd::Tokenize(a) => generate::tokenize(&a),
        Cmd::Chat(a) => with_threads(&a.model, || chat::run(&a)),
        Cmd::Inspect(c) => {
            let m = c.model_args().clone();
            with_threads(&m, || inspect::run(c))
        }
        Cmd::Explain(a) => with_threads(&a.model, || inspect::explain(&a)),
        Cmd::Bench(a) => with_threads(&a.model, || bench::run(&a)),
        Cmd::Score(a) => with_threads(&a.model, || score::run(&a)),
        Cmd::Info(a) => info::run(&a),
        Cmd::Verify(c) => {
            let m = c.model_args().clone();
            with_threads(&m, || verify::run(c))
        }
        Cmd::Serve(a) => serve::run(&a).map(|()| Outcome::Done),
    }
}

/// Runs `f` inside a rayon pool of the requested size (no global state is changed).
fn with_threads<T: Send>(m: &ModelArgs, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(n) = m.threads {
        b = b.num_threads(n as usize);
    }
    b.build().context("could not start the worker threads")?.install(f)
}

pub fn locate(m: &ModelArgs) -> Result<kvgpt::ModelFiles> {
    Ok(Locate::from_env(m.offline).resolve(&m.model)?)
}

/// The instruction set `--isa` names, if it names one; an error if this CPU does not offer it.
pub fn chosen_isa(m: &ModelArgs) -> Result<Option<kvgpt_kernels::Isa>> {
    let Some(name) = &m.isa else { return Ok(None) };
    let isa = kvgpt_kernels::Isa::by_name(name).ok_or_else(|| {
        let names: Vec<&str> = kvgpt_kernels::Isa::available().iter().map(|i| i.name()).collect();
        anyhow::anyhow!("--isa {name:?}: this CPU offers {}; pick one of them", names.join(", "))
    })?;
    Ok(Some(isa))
}

pub fn load(m: &ModelArgs) -> Result<Loaded> {
    let isa = chosen_isa(m)?;
    let mut loaded = kvgpt::load_as(&locate(m)?, m.dtype.weight_type())?;
    if let Some(isa) = isa {
        loaded.model = loaded.model.with_isa(isa);
    }
    Ok(loaded)
}

/// The prompt text from the argument, `--prompt-file` or standard input.
pub fn read_prompt(p: &PromptArgs) -> Result<String> {
    let text = match (&p.prompt, &p.prompt_file) {
        (_, Some(file)) => std::fs::read_to_string(file)
            .with_context(|| format!("could not read the prompt file {}", file.display()))?,
        (Some(t), None) if t != "-" => return Ok(t.clone()),
        _ => {
            if std::io::stdin().is_terminal() {
                errln!("(reading the prompt from standard input; end it with Ctrl-D)");
            }
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("could not read the prompt from standard input")?;
            s
        }
    };
    let text = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
    Ok(text.to_string())
}

/// The prompt's ids; an empty prompt starts from `<|endoftext|>` (the BOS of GPT-2).
pub fn prompt_ids(loaded: &Loaded, text: &str) -> Result<Vec<u32>> {
    let mut ids = loaded.tokenizer.encode(text)?;
    if ids.is_empty() {
        ids.push(loaded.model.config.bos_token_id);
    }
    Ok(ids)
}

/// Prints a JSON value on stdout.
pub fn print_json(v: &serde_json::Value) -> Result<()> {
    out::line(format_args!("{}", serde_json::to_string_pretty(v)?))
}

/// Refuses an output path that is one of the files the command reads.
pub fn refuse_input_path(
    out: &std::path::Path,
    files: &kvgpt::ModelFiles,
    prompt_file: Option<&std::path::Path>,
) -> Result<()> {
    // A new file cannot be an input; an existing one (or a symlink to one, as in an HF cache
    // snapshot) is compared by the file it resolves to.
    let Ok(target) = out.canonicalize() else { return Ok(()) };
    let mut inputs = vec![files.config.clone(), files.weights.clone()];
    inputs.extend(files.tokenizer.paths());
    inputs.extend(prompt_file.map(std::path::Path::to_path_buf));
    for input in inputs {
        if input.canonicalize().is_ok_and(|p| p == target) {
            anyhow::bail!(
                "{} is one of this command's inputs ({}); choose another output file",
                out.display(),
                input.display()
            );
        }
    }
    Ok(())
}
