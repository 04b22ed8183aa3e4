//! `kvgpt serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of the engine thread
//! of `kvgpt::engine`. The HTTP side parses, tokenizes, checks limits and streams; it never runs
//! model code, and the engine never waits on a socket: they meet at the engine's handle (a
//! request in, a stream of events out).
//!
//! - this file: the server's lifecycle (listen, load, start the engine, drain) and its routes;
//! - `listen`: connections, the header deadline, the bounded drain; `access`: the host check, the
//!   API key, counting and the log line of every request;
//! - `http`: shared state, body limits, the endpoints that need no engine;
//! - `admission`: parse → tokenize → context → submit;
//! - `responses`: collect, SSE, usage; `endpoint`: what completions and chat do differently;
//! - `api`: request bodies; `choice`: one sequence's events into text; `metrics`;
//! - `worker`: what routers read of a replica; `kv_events`: the prompt cache's blocks published
//!   for them over ZeroMQ.

mod access;
mod admission;
mod api;
mod choice;
mod endpoint;
mod hosts;
mod http;
mod kv_events;
mod listen;
mod metrics;
mod responses;
mod worker;

use crate::common::{load, ModelArgs};
use crate::draft::DraftArgs;
use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::State;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use clap::Args;
use endpoint::Endpoint;
use http::{App, Ready, Shared};
use kvgpt::engine::{self, EngineConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub kv_events: kv_events::KvEventArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 serves every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded at once (each choice of each request is one).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// Megabytes of K/V the prompt cache may hold (0 turns it off).
    #[arg(long, default_value_t = 256)]
    pub cache_mb: u32,
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
    /// Answer requests whose `Host` (and `Origin`) names this host too (repeatable; `*`: any).
    /// On loopback the server answers only localhost, 127.0.0.1 and [::1], a guard against DNS
    /// rebinding; on other addresses it checks only when this is given.
    #[arg(long, value_name = "NAME")]
    pub allowed_host: Vec<String>,
    /// Log lines as text or as one JSON object per line (each request gets one line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Log lines on stderr: text (ANSI colours only on a terminal) or JSON objects.
fn init_log(format: LogFormat) {
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false);
    let _ = match format {
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => fmt.json().flatten_event(true).try_init(),
    };
}

pub fn run(a: &ServeArgs) -> Result<()> {
    init_log(a.log_format);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    rt.block_on(serve(a))
}

async fn serve(a: &ServeArgs) -> Result<()> {
    let addr = format!("{}:{}", a.host, a.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("could not listen on {addr}"))?;
    let local = listener.local_addr()?;
    tracing::info!("listening on http://{local} (loading the model; /health answers 503 until it is ready)");
    if a.kv_events.kv_events.is_some() && a.cache_mb == 0 {
        anyhow::bail!("--kv-events publishes what the prompt cache holds, but --cache-mb 0 turns it off");
    }
    let metrics = metrics::Metrics::new(http::ROUTES.iter().map(|(path, _)| *path))?;
    let (kv_source, kv_sink) = kv_events::start(&a.kv_events, metrics.clone()).await?.unzip();
    let app = Arc::new(App {
        ready: OnceLock::new(),
        api_key: api_key(a)?,
        hosts: hosts::Hosts::new(&a.host, &a.allowed_host),
        max_body: a.max_body_bytes,
        body_timeout: Duration::from_secs(a.body_timeout),
        metrics,
        started: http::now_secs(),
        next_id: AtomicU64::new(1),
        kv_events: kv_source,
        draining: AtomicBool::new(false),
        working: AtomicUsize::new(0),
    });
    let mut router = Router::new();
    router = route(router, "/health", http::health);
    router = route(router, "/v1/models", http::models);
    router = route(router, "/v1/completions", completions);
    router = route(router, "/v1/chat/completions", chat_completions);
    router = route(router, "/tokenize", http::tokenize);
    router = route(router, "/detokenize", http::detokenize);
    router = route(router, "/metrics", http::metrics_text);
    router = route(router, "/server_info", worker::server_info);
    router = route(router, "/get_server_info", worker::server_info);
    router = route(router, "/model_info", worker::model_info);
    router = route(router, "/get_model_info", worker::model_info);
    router = route(router, "/get_load", worker::load);
    router = route(router, "/kv_event_sources", worker::kv_event_sources);
    router = route(router, "/flush_cache", worker::flush_cache);
    router = route(router, "/v1/completions/render", worker::render_completion);
    router = route(router, "/v1/chat/completions/render", worker::render_chat);
    let router = router
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), access::front))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(app.clone());
    let header = Duration::from_secs(a.header_timeout);
    let stop = drain(app.clone(), Duration::from_secs(a.shutdown_timeout));
    let server = tokio::spawn(listen::serve(listener, router, header, stop));

    // Load while the listener already answers /health with 503.
    let mut pool = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("kvgpt-kernel-{i}"));
    if let Some(n) = a.model.thread_count()? {
        pool = pool.num_threads(n);
    }
    let pool = pool.build().context("could not start the worker threads")?;
    let (model_args, draft_args) = (a.model.clone(), a.draft.clone());
    // On the engine's own threads: loading, and timing what drafting costs.
    let (loaded, drafting, pool) = tokio::task::spawn_blocking(move || -> Result<_> {
        let (loaded, drafting) = pool.install(|| -> Result<_> {
            let loaded = load(&model_args)?;
            let drafting = draft_args.load(&model_args, &loaded)?;
            Ok((loaded, drafting))
        })?;
        Ok((loaded, drafting, pool))
    })
    .await??;
    let model = Arc::new(loaded.model);
    let cfg = &model.config;
    let weights = model.weight_bytes();
    let engine_cfg = EngineConfig {
        parallel: a.parallel as usize,
        batch_tokens: a.batch_tokens as usize,
        cache_bytes: a.cache_mb as usize * (1 << 20),
        max_queue: a.max_queue as usize,
        draft: drafting.as_ref().map(|d| d.config.clone()),
    };
    let draft_weights = engine_cfg.draft.as_ref().map_or(0, |d| d.weight_bytes());
    let kv_limit = engine_cfg.kv_limit(&model);
    let cache_bytes = engine_cfg.cache_bytes;
    let threads = pool.current_num_threads();
    let block_size = a.kv_events.kv_block_size as usize;
    let slot_positions = a.parallel as usize * cfg.n_positions; // every slot at full context
    app.metrics.limits(&metrics::Limits {
        weights,
        draft_weights,
        kv: kv_limit,
        kv_positions: slot_positions,
        cache: cache_bytes,
        block_size,
    });
    let sink = kv_sink.map(|s| Box::new(move |changes| s.send(changes)) as metrics::CacheSink);
    let model_kv = slot_positions * kvgpt::KvCache::bytes_per_position(cfg);
    let monitor = Box::new(app.metrics.monitor(model_kv, sink));
    let (engine, engine_thread) =
        engine::spawn(model.clone(), engine_cfg, monitor, Some(pool)).context("could not start the engine thread")?;
    let mb = |b: usize| b as f64 / (1u64 << 20) as f64;
    let draft = match &drafting {
        Some(d) => format!(
            " | draft {} (up to {} tokens a step; measured: a verify row costs {:.2} and a drafted token {:.2} \
             of a decode step)",
            d.name, d.config.max_k, d.config.costs.row, d.config.costs.draft
        ),
        None => String::new(),
    };
    let draft_memory =
        if draft_weights > 0 { format!(" + draft weights {:.1} MB", mb(draft_weights)) } else { String::new() };
    tracing::info!(
        "{} ready on http://{local} | {} positions | {}, {} kernels, {} weights{draft} | memory: weights \
         {:.1} MB{draft_memory} + K/V of {} ≤ {:.1} MB + prompt cache ≤ {:.1} MB = ≤ {:.1} MB",
        loaded.files.name,
        cfg.n_positions,
        crate::out::count(threads, "thread"),
        model.isa().name(),
        model.weights_dtype(),
        mb(weights),
        crate::out::count(usize::from(a.parallel), "slot"),
        mb(kv_limit),
        mb(cache_bytes),
        mb(weights + draft_weights + kv_limit + cache_bytes)
    );
    let name = a.served_model_name.clone().unwrap_or_else(|| served_name(&a.model.model));
    let server_info = serde_json::json!({
        "model_id": name,
        "served_model_name": name,
        "model_path": a.model.model,
        "version": concat!("kvgpt ", env!("CARGO_PKG_VERSION")),
        "instance_id": format!("kvgpt@{local}"),
        "tp_size": 1,
        "dp_size": 1,
        "kv_block_size": block_size,
        "context_length": cfg.n_positions,
        "max_running_requests": a.parallel,
        "max_total_tokens": slot_positions,
        "max_queued_requests": a.max_queue,
        "prompt_cache_bytes": cache_bytes,
        "dtype": model.weights_dtype().to_string(),
        "isa": model.isa().name(),
        "threads": threads,
        "draft": drafting.as_ref().map(|d| d.name.clone()),
    });
    let ready = Ready {
        tok: loaded.tokenizer,
        name,
        aliases: vec!["kvgpt".into(), a.model.model.clone()],
        n_positions: cfg.n_positions,
        vocab: cfg.vocab_size,
        eos: cfg.eos_token_id,
        engine: engine.clone(),
        server_info,
    };
    let _ = app.ready.set(ready);

    let open = server.await.context("the server task failed")?;
    if open > 0 {
        tracing::warn!(
            "closed {open} connection{} still open after --shutdown-timeout {} s, cancelling their sequences",
            if open == 1 { "" } else { "s" },
            a.shutdown_timeout
        );
    }
    // Every connection has finished or been closed; the engine finishes the rest.
    engine.drain();
    drop(engine);
    let _ = engine_thread.join();
    tracing::info!("drained, exiting");
    Ok(())
}

/// Adds `path` with `handler`, for the method `http::ROUTES` gives it (the one table of routes).
fn route<H, T>(router: Router<Shared>, path: &'static str, handler: H) -> Router<Shared>
where
    H: axum::handler::Handler<T, Shared>,
    T: 'static,
{
    let method = http::method_of(path).unwrap_or_else(|| panic!("{path} is not in http::ROUTES"));
    // get() answers HEAD too, as HTTP asks of a GET.
    let handler =
        if method == axum::http::Method::POST { axum::routing::post(handler) } else { axum::routing::get(handler) };
    router.route(path, handler)
}

/// The API key, from the flag, `KVGPT_API_KEY` or the first line of --api-key-file.
fn api_key(a: &ServeArgs) -> Result<Option<String>> {
    let Some(file) = &a.api_key_file else { return Ok(a.api_key.clone()) };
    let text =
        std::fs::read_to_string(file).with_context(|| format!("could not read the API key file {}", file.display()))?;
    let key = text.lines().next().unwrap_or("").trim();
    if key.is_empty() {
        anyhow::bail!("the API key file {} is empty; put the key on its first line", file.display());
    }
    Ok(Some(key.to_string()))
}

/// The default served name: a local folder's or file's name (without `.gguf`), a hub id as it is
/// (`--model` is a server-side path, which clients need not see).
fn served_name(spec: &str) -> String {
    let path = std::path::Path::new(spec);
    if !path.exists() {
        return spec.to_string();
    }
    let name = if path.is_file() { path.file_stem() } else { path.file_name() };
    name.map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned())
}

/// Resolves when a drain that SIGTERM (or Ctrl-C) started is over: from the signal on, `/health`
/// answers 503 and new completions are refused, while those in flight go on for at most `bound`.
/// Resolves to the time left of `bound`, for the connections still open.
async fn drain(app: Shared, bound: Duration) -> Duration {
    shutdown_signal().await;
    app.draining.store(true, Ordering::Relaxed);
    app.metrics.draining();
    let until = tokio::time::Instant::now() + bound;
    while app.working.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until.saturating_duration_since(tokio::time::Instant::now())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down, finishing the requests in flight");
}

type TallyOf = Extension<Arc<access::Tally>>;

async fn completions(State(app): State<Shared>, Extension(tally): TallyOf, body: Body) -> Response {
    respond(app, tally, body, Endpoint::Completions).await
}

async fn chat_completions(State(app): State<Shared>, Extension(tally): TallyOf, body: Body) -> Response {
    respond(app, tally, body, Endpoint::Chat).await
}

async fn respond(app: Shared, tally: Arc<access::Tally>, body: Body, ep: Endpoint) -> Response {
    if let Err(e) = app.accepting() {
        http::drain(&app, body).await;
        return e.into_response();
    }
    let out = match admission::start(&app, body, ep, tally).await {
        Ok(job) if job.params.stream => Ok(responses::stream(app.clone(), job)),
        Ok(job) => responses::collect(&app, job).await.map(|v| Json(v).into_response()),
        Err(e) => Err(e),
    };
    out.unwrap_or_else(|e| e.into_response())
}
