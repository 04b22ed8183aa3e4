//! `kvgpt serve`: the server's flags, checked and handed to `kvgpt_serve::run`.

use crate::common::ModelArgs;
use crate::draft::DraftArgs;
use anyhow::Result;
use clap::Args;
use kvgpt_core::files;
use kvgpt_serve::{KvEventOptions, LogFormat, ServeOptions};
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub kv_events: KvEventArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 serves every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded at once (each choice of each request is one). The default, 16, is where
    /// batching stops paying much: a step of 16 rows gave 10× one sequence's tokens/s on
    /// DistilGPT-2 (AVX-512), 32 rows 12× at 1.7× the time per token; the K/V pool (--kv-mb), not
    /// this ceiling, admits sequences by their memory.
    #[arg(long, default_value_t = kvgpt_serve::DEFAULT_PARALLEL, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// Megabytes (MiB) of K/V the prompt cache may hold (0 turns it off).
    #[arg(long, default_value_t = 256)]
    pub cache_mb: u32,
    /// Megabytes (MiB, decimals allowed) of the one K/V pool that running sequences and the prompt
    /// cache share, in blocks of --kv-block-size positions. Default: four sequences at the full
    /// context (or --parallel, if fewer) plus --cache-mb; more slots share it by memory.
    #[arg(long, value_name = "MB", value_parser = parse_mb)]
    pub kv_mb: Option<f64>,
    #[command(flatten)]
    pub kv_disk: crate::kv_disk::KvDiskArgs,
    /// A Redis server (redis://host:port/db) that holds K/V blocks for every replica that names
    /// it: written through as --kv-disk is, looked up after it. Redis down, slow or full costs
    /// speed, never an answer (the server serves from RAM and disk, and reconnects).
    #[arg(long, value_name = "URL")]
    pub kv_redis: Option<String>,
    /// Prove this share (0 to 1) of the K/V blocks loaded back from --kv-disk or --kv-redis by
    /// recomputing them and comparing bits before a request may use them; a block that differs is
    /// removed, counted and logged, and the prompt computed instead. 1 proves every block (as
    /// costly as computing the prefix); 0.1 one block in ten.
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = parse_share)]
    pub kv_verify: f64,
    /// Sequences that may wait for a slot (each choice of each prompt is one); past that, 503 with
    /// Retry-After. A request with more sequences than --parallel + --max-queue is refused (400).
    #[arg(long, default_value_t = 64)]
    pub max_queue: u32,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health. A flag is visible to
    /// every local user (in /proc); prefer `KVGPT_API_KEY` or --api-key-file.
    #[arg(long, env = "KVGPT_API_KEY", hide_env_values = true, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line).
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Rows per forward step: decode rows first, then prompt chunks.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_tokens: u16,
    /// The model's name in `/v1/models` and in responses (default: the model folder's or file's
    /// name, or the hub id). Requests may also name it `kvgpt` or by the `--model` argument.
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a client may take to send a request's headers (counted from when the server
    /// waits for them, so also how long an idle kept-alive connection stays open).
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout: u64,
    /// Seconds a request body may go without a byte before the request gets 408.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout: u64,
    /// Seconds the requests in flight get to finish after SIGTERM or Ctrl-C (meanwhile /health
    /// answers 503 and new completions are refused with 503, so routers send them elsewhere);
    /// then their connections are closed and their sequences cancelled.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Answer requests whose `Host` (and `Origin`) names this host too, on any port: a name or IP
    /// address, `*.NAME` for every name under NAME, `*` for any (repeatable, or comma-separated).
    /// A port, a URL or a path is refused. On loopback the server answers only localhost,
    /// 127.0.0.1 and [::1], a guard against DNS rebinding; on other addresses it checks only when
    /// this is given.
    #[arg(long, value_name = "NAME")]
    pub allowed_host: Vec<String>,
    /// Log lines as text or as one JSON object per line (each request gets one line).
    #[arg(long, value_enum, default_value_t = LogFormatArg::Text)]
    pub log_format: LogFormatArg,
}

#[derive(Args, Clone, Debug)]
pub struct KvEventArgs {
    /// Publish the prompt cache's stored and evicted blocks (vLLM's KV-cache events) on a ZeroMQ
    /// PUB socket bound here, e.g. tcp://127.0.0.1:5557 (port 0: any free port, printed).
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
    /// Also answer replay requests (a ZeroMQ ROUTER socket bound here) from the last 10000 batches
    /// (at most 64 MiB of them).
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    pub kv_events_replay: Option<String>,
    /// The events' topic (the first frame of every message; vllm-router's static sources use "").
    #[arg(long, value_name = "TOPIC", default_value = "")]
    pub kv_events_topic: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// A positive, finite number of megabytes.
fn parse_mb(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(mb) if mb.is_finite() && mb > 0.0 && mb <= 1e9 => Ok(mb),
        _ => Err(format!("'{s}' is not a size in MiB: give a number above 0, e.g. 256 or 0.5")),
    }
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("'{s}' is not a share: give a number from 0 to 1, e.g. 0.1 or 1")),
    }
}

pub fn run(a: &ServeArgs) -> Result<()> {
    kvgpt_serve::run(&options(a)?)
}

/// The flags as the server's options.
fn options(a: &ServeArgs) -> Result<ServeOptions> {
    let k = &a.kv_events;
    Ok(ServeOptions {
        load: a.model.spec()?,
        threads: a.model.thread_count()?,
        draft: a.draft.spec()?,
        kv_events: KvEventOptions {
            endpoint: k.kv_events.clone(),
            replay: k.kv_events_replay.clone(),
            topic: k.kv_events_topic.clone(),
        },
        host: a.host.clone(),
        port: a.port,
        parallel: usize::from(a.parallel),
        cache_bytes: a.cache_mb as usize * (1 << 20),
        kv_bytes: a.kv_mb.map(|mb| (mb * (1u64 << 20) as f64) as usize),
        kv_disk: a.kv_disk.tier(),
        kv_redis: a.kv_redis.clone(),
        kv_verify: a.kv_verify,
        max_queue: a.max_queue as usize,
        api_key: api_key(a)?,
        batch_tokens: usize::from(a.batch_tokens),
        served_model_name: a.served_model_name.clone(),
        max_body_bytes: a.max_body_bytes,
        header_timeout: Duration::from_secs(a.header_timeout),
        body_timeout: Duration::from_secs(a.body_timeout),
        shutdown_timeout: Duration::from_secs(a.shutdown_timeout),
        allowed_hosts: a.allowed_host.clone(),
        log_format: match a.log_format {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        },
    })
}

/// The API key, from the flag, `KVGPT_API_KEY` or the first line of --api-key-file (a regular
/// file or a pipe such as `<(pass show key)`, of at most 4 KiB); the server's options check it.
fn api_key(a: &ServeArgs) -> Result<Option<String>> {
    let Some(file) = &a.api_key_file else { return Ok(a.api_key.clone()) };
    let bytes = files::read(file, "an API key file", 4096, files::Kinds::RegularOrPipe)?;
    let text =
        String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{}: the API key file is not text", file.display()))?;
    Ok(Some(text.lines().next().unwrap_or("").trim().to_string()))
}
