//! What the commands share: the model, prompt and output flags, and the helpers that load a
//! model, read a prompt and print JSON.

use anyhow::{Context, Result};
use clap::Args;
use kvgpt_core::{hub, Isa, KvSpec, KvType, LoadSpec, Loaded, Locate, ModelFiles, Sampling, WeightType};
use std::io::{IsTerminal, Read};
use std::path::PathBuf;

/// Where the model comes from and how many threads run it.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// A model folder (config.json, model.safetensors, tokenizer.json), a GGUF file or a Hugging
    /// Face Hub id (-m as llama.cpp's tools take it).
    #[arg(long, short = 'm', default_value = hub::DEFAULT_MODEL)]
    pub model: String,
    /// Use only the local Hugging Face cache, never the network (also: HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
    /// Worker threads for the kernels (default: one per core); bench takes a comma-separated list.
    #[arg(long, short = 't', value_delimiter = ',', value_parser = clap::value_parser!(u16))]
    pub threads: Vec<u16>,
    /// How the weight matrices are held (default: as the file stores them; f32 from safetensors).
    /// f32, f16 or bf16: float storage, f32 arithmetic. q8: int8 with an f32 scale per row and
    /// 32 columns, f32 activations. The integer types multiply activations quantized to int8 per
    /// token and 32 values, with exact integer dot products: w8a8 (int8, an f32 scale per column
    /// and 32 rows) and llama.cpp's q8_0, q4_0, q4_1, q5_0, q5_1 (its reference quantizers) and
    /// q4_k (its format, rounded to nearest). A GGUF's q5_k and q6_k are read as they are.
    #[arg(long, value_enum)]
    pub dtype: Option<Dtype>,
    /// The instruction set the kernels use (default: the best this CPU has). Any of them gives
    /// the same bits; this is for measuring one against another.
    #[arg(long, value_name = "NAME")]
    pub isa: Option<String>,
    /// Positions per K/V block (1 to 4096): a cache takes its memory a block at a time as tokens
    /// arrive (the server's pool, the prompt cache and the KV events count in these blocks;
    /// vllm-router's default is 16). Every size gives the same bits; small blocks cost some speed
    /// at long contexts, large ones leave up to a block unused per sequence.
    #[arg(long, value_name = "N", default_value_t = kvgpt_core::kv_cache::DEFAULT_BLOCK)]
    pub kv_block_size: usize,
    /// How K and V are held (bytes per position of DistilGPT-2's six layers: f32 36,864, f16 and
    /// bf16 18,432, q8_0 9,792). f32 keeps them as computed; the others round them as they are
    /// stored (q8_0 as llama.cpp's -ctk/-ctv q8_0: blocks of 32 with an f16 scale). Any type
    /// gives the same bits batched or alone, cached or not, on every instruction set; `kvgpt
    /// score --kv-dtype` measures what it costs in accuracy.
    #[arg(long, value_enum, default_value_t = KvDtype::F32)]
    pub kv_dtype: KvDtype,
}

#[derive(Clone, Copy, clap::ValueEnum, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
}

impl KvDtype {
    pub fn kv_type(self) -> KvType {
        match self {
            KvDtype::F32 => KvType::F32,
            KvDtype::F16 => KvType::F16,
            KvDtype::Bf16 => KvType::Bf16,
            KvDtype::Q8_0 => KvType::Q8_0,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    Q8,
    W8a8,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q5_0")]
    Q5_0,
    #[value(name = "q5_1")]
    Q5_1,
    #[value(name = "q4_k")]
    Q4K,
}

impl Dtype {
    pub fn weight_type(self) -> WeightType {
        use WeightType as W;
        match self {
            Dtype::F32 => W::F32,
            Dtype::F16 => W::F16,
            Dtype::Bf16 => W::Bf16,
            Dtype::Q8 => W::Q8,
            Dtype::W8a8 => W::W8A8,
            Dtype::Q8_0 => W::Q8_0,
            Dtype::Q4_0 => W::Q4_0,
            Dtype::Q4_1 => W::Q4_1,
            Dtype::Q5_0 => W::Q5_0,
            Dtype::Q5_1 => W::Q5_1,
            Dtype::Q4K => W::Q4K,
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

impl ModelArgs {
    /// The one thread count asked for (None: one per core); a list is bench's alone.
    pub fn thread_count(&self) -> Result<Option<usize>> {
        match self.threads[..] {
            [] => Ok(None),
            [n] => Ok(Some(usize::from(n))),
            _ => anyhow::bail!("-t takes one thread count here (a comma-separated list is for bench)"),
        }
    }
}

/// Runs `f` inside a rayon pool of `threads` (None: one per core); no global state is changed.
pub fn in_pool<T: Send>(threads: Option<usize>, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    kvgpt_core::threads::pool(threads, "kvgpt-kernel")?.install(f)
}

/// Runs `f` inside a rayon pool of the requested size.
pub fn with_threads<T: Send>(m: &ModelArgs, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    in_pool(m.thread_count()?, f)
}

/// The instruction set `--isa` names, if it names one; an error if this CPU does not offer it.
pub fn chosen_isa(m: &ModelArgs) -> Result<Option<Isa>> {
    let Some(name) = &m.isa else { return Ok(None) };
    let isa = Isa::by_name(name).ok_or_else(|| {
        let names: Vec<&str> = Isa::available().iter().map(|i| i.name()).collect();
        anyhow::anyhow!("--isa {name:?}: this CPU offers {}; pick one of them", names.join(", "))
    })?;
    Ok(Some(isa))
}

impl ModelArgs {
    /// The type asked for with --dtype, if any.
    pub fn weight_type(&self) -> Option<WeightType> {
        self.dtype.map(Dtype::weight_type)
    }

    /// What these flags ask the library to load.
    pub fn spec(&self) -> Result<LoadSpec> {
        Ok(LoadSpec {
            model: self.model.clone(),
            offline: self.offline,
            dtype: self.weight_type(),
            isa: chosen_isa(self)?,
            kv: KvSpec::new(self.kv_block_size)?.with_type(self.kv_dtype.kv_type()),
        })
    }
}

/// The model's files (the flags that only locate them: no --isa or --dtype is looked at).
pub fn locate(m: &ModelArgs) -> Result<ModelFiles> {
    Ok(Locate::from_env(m.offline).resolve(&m.model)?)
}

/// Loads the model the flags name; a note on what --dtype does to a GGUF goes to stderr first.
pub fn load(m: &ModelArgs) -> Result<Loaded> {
    Ok(m.spec()?.load(&mut |note| errln!("{note}"))?)
}

/// A prompt file's text; one final newline is the file's, not the prompt's.
pub fn read_prompt_file(file: &std::path::Path) -> Result<String> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("could not read the prompt file {}", file.display()))?;
    Ok(without_final_newline(&text).to_string())
}

fn without_final_newline(text: &str) -> &str {
    text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(text)
}

/// The prompt text from the argument, `--prompt-file` or standard input.
pub fn read_prompt(p: &PromptArgs) -> Result<String> {
    let text = match (&p.prompt, &p.prompt_file) {
        (_, Some(file)) => return read_prompt_file(file),
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
    Ok(without_final_newline(&text).to_string())
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
    crate::out::line(format_args!("{}", serde_json::to_string_pretty(v)?))
}

/// How tokens are chosen: the flags `generate` and `chat` share.
#[derive(Args)]
pub struct SamplingArgs {
    /// Sample with this temperature (0 = greedy). Giving any sampling flag turns sampling on.
    #[arg(long, visible_alias = "temp", allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Sample only from the K most likely tokens.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
    /// Sample only from the most likely tokens whose probabilities add up to P (0 < P <= 1).
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Seed of the ChaCha20 sampling RNG: the same seed gives the same text everywhere.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// HF's repetition penalty θ > 0 (1 = off): every token already in the text, prompt
    /// included, has its logit divided by θ if positive, multiplied by it if not. Greedy too.
    #[arg(long, default_value_t = 1.0, value_name = "THETA")]
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty in [-2, 2]: taken once off every token generated so far.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty in [-2, 2]: taken off a token once per time it was generated.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
}

impl SamplingArgs {
    /// The sampler settings, each flag checked ([`Sampling::check`]).
    pub fn sampling(&self) -> Result<Sampling> {
        let a = self;
        let top_k = a.top_k.map(|k| k as usize);
        let s = Sampling {
            temperature: Sampling::temperature_of(a.temperature, top_k, a.top_p),
            top_k,
            top_p: a.top_p,
            seed: a.seed,
            repetition_penalty: a.repetition_penalty,
            presence_penalty: a.presence_penalty,
            frequency_penalty: a.frequency_penalty,
        };
        s.check().map_err(|e| anyhow::anyhow!("{} {}", e.setting.flag(), e.rule))?;
        Ok(s)
    }
}

/// The sampler settings in a few words, for the stats line.
pub fn sampler_words(s: &Sampling) -> String {
    let mut w = if s.is_greedy() {
        "greedy".to_string()
    } else {
        let mut w = format!("sampled T={} seed={}", s.temperature, s.seed);
        if let Some(k) = s.top_k {
            w += &format!(" top-k={k}");
        }
        if let Some(p) = s.top_p {
            w += &format!(" top-p={p}");
        }
        w
    };
    if s.repetition_penalty != 1.0 {
        w += &format!(" repetition-penalty={}", s.repetition_penalty);
    }
    if s.presence_penalty != 0.0 {
        w += &format!(" presence-penalty={}", s.presence_penalty);
    }
    if s.frequency_penalty != 0.0 {
        w += &format!(" frequency-penalty={}", s.frequency_penalty);
    }
    w
}
