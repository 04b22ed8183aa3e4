//! `kvgpt serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of the engine thread
//! of `kvgpt::scheduler`. The HTTP side parses, tokenizes, checks limits and streams; it never
//! runs model code, and the engine never waits on a socket: they meet at the engine's channel
//! (requests in) and one event channel per sequence (tokens out).

mod api;
mod choice;
mod metrics;

use crate::{load, ModelArgs};
use anyhow::{Context, Result};
use api::{ApiError, ApiResult, Params, Prompt};
use axum::body::Body;
use axum::extract::{MatchedPath, Request as HttpRequest, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use choice::{drive, Delta, Ended};
use clap::Args;
use kvgpt::scheduler::{self, Client, Command, EngineConfig, Event, Request, TokenLogprob, Usage};
use kvgpt::{Sampling, Tokenizer};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
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
    /// Requests that may wait for a slot; past that, 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub max_queue: u32,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Rows per forward step: decode rows first, then prompt chunks.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_tokens: u16,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
}

/// What the server knows once the model is loaded.
struct Ready {
    tok: Tokenizer,
    name: String,
    n_positions: usize,
    vocab: usize,
    eos: u32,
    engine: mpsc::Sender<Command>,
}

struct App {
    ready: OnceLock<Ready>,
    api_key: Option<String>,
    max_queue: usize,
    max_body: usize,
    /// Requests submitted and not yet admitted by the engine.
    queued: Arc<AtomicUsize>,
    metrics: metrics::Metrics,
    started: u64,
    next_id: AtomicU64,
}

type Shared = Arc<App>;

/// Sends a sequence's events to its HTTP handler.
struct ChannelClient(UnboundedSender<Event>);

impl Client for ChannelClient {
    fn send(&mut self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn gone(&self) -> bool {
        self.0.is_closed()
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub fn run(a: &ServeArgs) -> Result<()> {
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
    errln!("kvgpt serve: listening on http://{local} (loading the model; /health answers 503 until it is ready)");
    let app = Arc::new(App {
        ready: OnceLock::new(),
        api_key: a.api_key.clone(),
        max_queue: a.max_queue as usize,
        max_body: a.max_body_bytes,
        queued: Arc::new(AtomicUsize::new(0)),
        metrics: metrics::Metrics::new()?,
        started: now_secs(),
        next_id: AtomicU64::new(1),
    });
    let router = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), auth))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(app.clone());
    let server =
        tokio::spawn(async move { axum::serve(listener, router).with_graceful_shutdown(shutdown_signal()).await });

    // Load while the listener already answers /health with 503.
    let model_args = a.model.clone();
    let loaded = tokio::task::spawn_blocking(move || load(&model_args)).await??;
    let model = Arc::new(loaded.model);
    let cfg = &model.config;
    let weights = model.weight_bytes();
    let kv_limit = scheduler::Engine::kv_limit(&model, a.parallel as usize);
    let cache_bytes = a.cache_mb as usize * (1 << 20);
    let mut pool = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("kvgpt-kernel-{i}"));
    if let Some(n) = a.model.threads {
        pool = pool.num_threads(n as usize);
    }
    let pool = pool.build().context("could not start the worker threads")?;
    let threads = pool.current_num_threads();
    app.metrics.limits(weights, kv_limit, cache_bytes);
    let engine_cfg = EngineConfig { parallel: a.parallel as usize, batch_tokens: a.batch_tokens as usize, cache_bytes };
    let (engine, engine_thread) =
        scheduler::spawn(model.clone(), engine_cfg, app.queued.clone(), Box::new(app.metrics.monitor()), Some(pool))
            .context("could not start the engine thread")?;
    let mb = |b: usize| b as f64 / (1u64 << 20) as f64;
    errln!(
        "kvgpt serve: {} ready on http://{local} | {} positions | {} threads, {} kernels, {} weights | memory: weights \
         {:.1} MB + K/V of {} slots ≤ {:.1} MB + prompt cache ≤ {:.1} MB = ≤ {:.1} MB",
        loaded.files.name,
        cfg.n_positions,
        threads,
        model.isa().name(),
        model.weights_dtype(),
        mb(weights),
        a.parallel,
        mb(kv_limit),
        mb(cache_bytes),
        mb(weights + kv_limit + cache_bytes)
    );
    let ready = Ready {
        tok: loaded.tokenizer,
        name: loaded.files.name.clone(),
        n_positions: cfg.n_positions,
        vocab: cfg.vocab_size,
        eos: cfg.eos_token_id,
        engine: engine.clone(),
    };
    let _ = app.ready.set(ready);

    let served = server.await.context("the server task failed")?;
    // Every connection has finished (graceful shutdown drains them); the engine finishes the rest.
    let _ = engine.send(Command::Drain);
    drop(engine);
    let _ = engine_thread.join();
    errln!("kvgpt serve: drained, exiting");
    served.context("the server stopped")
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
    errln!("kvgpt serve: shutting down, finishing the requests in flight");
}

/// Checks the API key and counts every response by endpoint and status.
async fn auth(State(app): State<Shared>, req: HttpRequest, next: Next) -> Response {
    let endpoint = req.extensions().get::<MatchedPath>().map_or("unmatched", |m| m.as_str()).to_string();
    let resp = check_key(&app, req, next).await;
    app.metrics.request(&endpoint, resp.status().as_u16());
    resp
}

async fn check_key(app: &App, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let ok = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|k| k == key);
        if !ok && req.uri().path() != "/health" {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "invalid_api_key",
                "missing or wrong API key: send `Authorization: Bearer <key>` with the key the server was started with",
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn not_found(req: HttpRequest) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        format!(
            "no endpoint {} {}; this server has /v1/completions, /v1/chat/completions, /v1/models, /health, /tokenize, \
             /detokenize and /metrics",
            req.method(),
            req.uri().path()
        ),
    )
}

fn ready(app: &App) -> ApiResult<&Ready> {
    app.ready.get().ok_or_else(|| {
        let mut e =
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "loading", "the model is still loading");
        e.retry_after = Some(1);
        e
    })
}

/// A body over the limit is still read and dropped, up to this many times the limit, before the
/// 413 goes out: a socket closed with unread bytes is reset, and the client would see a broken
/// connection instead of the error.
const DRAIN_FACTOR: usize = 8;

/// Reads the body, at most `max_body` bytes (413 beyond), as a JSON object.
async fn body_object(app: &App, body: Body) -> ApiResult<serde_json::Map<String, Value>> {
    use tokio_stream::StreamExt;
    let mut stream = body.into_data_stream();
    let (mut bytes, mut seen) = (Vec::new(), 0usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "bad_body",
                format!("could not read the request body: {e}"),
            )
        })?;
        seen = seen.saturating_add(chunk.len());
        if seen <= app.max_body {
            bytes.extend_from_slice(&chunk);
        } else if seen > app.max_body.saturating_mul(DRAIN_FACTOR) {
            break;
        }
    }
    if seen > app.max_body {
        return Err(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than the server's limit of {} bytes", app.max_body),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
            retry_after: None,
        });
    }
    api::object(&bytes)
}

async fn health(State(app): State<Shared>) -> Response {
    match app.ready.get() {
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading"}))).into_response(),
    }
}

async fn models(State(app): State<Shared>) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{"id": r.name, "object": "model", "created": app.started, "owned_by": "kvgpt", "max_model_len": r.n_positions}],
    })))
}

async fn metrics_text(State(app): State<Shared>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], app.metrics.render()).into_response()
}

async fn tokenize(State(app): State<Shared>, body: Body) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    let text = api::text_field(&body_object(&app, body).await?)?;
    let ids = r.tok.encode(&text).map_err(|e| ApiError::bad("content", e.to_string()))?;
    let pieces: Vec<String> = ids.iter().map(|&i| r.tok.token_text(i)).collect();
    Ok(Json(json!({"tokens": ids, "pieces": pieces})))
}

async fn detokenize(State(app): State<Shared>, body: Body) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    let ids = api::tokens_field(&body_object(&app, body).await?)?;
    if let Some(&id) = ids.iter().find(|&&i| i as usize >= r.vocab) {
        return Err(ApiError::bad("tokens", format!("token id {id} is outside the vocabulary of {}", r.vocab)));
    }
    Ok(Json(json!({"content": r.tok.decode(&ids)})))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Completions,
    Chat,
}

async fn completions(State(app): State<Shared>, body: Body) -> Response {
    respond(app, body, Endpoint::Completions).await
}

async fn chat_completions(State(app): State<Shared>, body: Body) -> Response {
    respond(app, body, Endpoint::Chat).await
}

async fn respond(app: Shared, body: Body, ep: Endpoint) -> Response {
    let out = match start(&app, body, ep).await {
        Ok(job) if job.params.stream => Ok(stream(app.clone(), job)),
        Ok(job) => collect(&app, job).await.map(|v| Json(v).into_response()),
        Err(e) => Err(e),
    };
    out.unwrap_or_else(|e| e.into_response())
}

/// A request split into sequences: prompt `i`, choice `j` is `seqs[i * n + j]`.
struct Job {
    ep: Endpoint,
    id: String,
    params: Params,
    prompt_ids: Vec<Vec<u32>>,
    prompt_texts: Vec<String>,
    seqs: Vec<tokio::sync::mpsc::UnboundedReceiver<Event>>,
    started: Instant,
}

/// Parses, checks every limit, and submits the sequences.
async fn start(app: &Shared, body: Body, ep: Endpoint) -> ApiResult<Job> {
    let r = ready(app)?;
    let obj = body_object(app, body).await?;
    let params = match ep {
        Endpoint::Completions => api::completion(&obj)?,
        Endpoint::Chat => api::chat(&obj)?,
    };
    if let Some(m) = &params.model {
        if m != &r.name && m != "kvgpt" {
            let mut e = ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("the model `{m}` does not exist here; this server serves `{}`", r.name),
            );
            e.param = Some("model".into());
            return Err(e);
        }
    }
    let mut prompt_ids = vec![];
    let mut prompt_texts = vec![];
    let mut max_news = vec![]; // completion tokens per prompt, checked against the context
    for p in &params.prompts {
        let (mut ids, text) = match p {
            Prompt::Text(t) => {
                // A long text takes a while to tokenize: off the async worker's hot loop.
                let ids = tokio::task::block_in_place(|| r.tok.encode(t));
                (ids.map_err(|e| ApiError::bad("prompt", e.to_string()))?, t.clone())
            }
            Prompt::Ids(ids) => {
                if let Some(&id) = ids.iter().find(|&&i| i as usize >= r.vocab) {
                    return Err(ApiError::bad(
                        "prompt",
                        format!("token id {id} is outside the vocabulary of {}", r.vocab),
                    ));
                }
                (ids.clone(), r.tok.decode(ids))
            }
        };
        if ids.is_empty() {
            ids.push(r.eos); // an empty prompt starts from <|endoftext|>, as `kvgpt generate` does
        }
        // OpenAI's rule, stricter by one than `generate`'s (which does not count the last token,
        // never fed): prompt + max_tokens ≤ the context length, as OpenAI clients expect.
        let room = r.n_positions.saturating_sub(ids.len());
        let max_tokens = params.max_tokens.unwrap_or(match ep {
            Endpoint::Completions => 16,
            Endpoint::Chat => room,
        });
        if max_tokens == 0 || ids.len() + max_tokens > r.n_positions {
            let param = if params.max_tokens.is_some() && ids.len() < r.n_positions { "max_tokens" } else { "prompt" };
            return Err(ApiError::bad(
                param,
                format!(
                    "this model's maximum context length is {} tokens, but {} prompt tokens + {max_tokens} completion \
                     tokens were asked for; shorten the prompt or lower max_tokens to at most {room}",
                    r.n_positions,
                    ids.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        prompt_ids.push(ids);
        max_news.push(max_tokens);
        prompt_texts.push(text);
    }
    let count = prompt_ids.len() * params.n;
    if app.queued.load(Ordering::Relaxed) + count > app.max_queue {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "queue_full",
            format!(
                "the server is busy: {} sequences are waiting (limit {}); retry shortly",
                app.queued.load(Ordering::Relaxed),
                app.max_queue
            ),
        );
        e.retry_after = Some(1);
        return Err(e);
    }
    let mut seqs = vec![];
    let now = Instant::now();
    for (ids, &max_new) in prompt_ids.iter().zip(&max_news) {
        for j in 0..params.n {
            let (tx, rx) = unbounded_channel();
            let req = Request {
                prompt: ids.clone(),
                max_new_tokens: max_new,
                sampling: sampling(&params, j),
                stop_at_eos: !params.ignore_eos,
                logprobs: params.logprobs,
                client: Box::new(ChannelClient(tx)),
            };
            app.queued.fetch_add(1, Ordering::Relaxed);
            if r.engine.send(Command::Submit(req, now)).is_err() {
                app.queued.fetch_sub(1, Ordering::Relaxed);
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "shutting_down",
                    "the engine has stopped",
                ));
            }
            seqs.push(rx);
        }
    }
    let prefix = if ep == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{}-{}", app.started, app.next_id.fetch_add(1, Ordering::Relaxed));
    Ok(Job { ep, id, params, prompt_ids, prompt_texts, seqs, started: now })
}

/// Choice `j` of a request samples with seed `seed + j`, so choices differ and each is reproducible.
fn sampling(p: &Params, j: usize) -> Sampling {
    Sampling {
        temperature: p.temperature,
        top_k: (p.top_k > 0).then_some(p.top_k),
        top_p: (p.top_p < 1.0).then_some(p.top_p),
        seed: p.seed.wrapping_add(j as u64),
        repetition_penalty: p.repetition_penalty,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
    }
}

/// One choice's logprobs in the endpoint's format, for the tokens of one delta.
fn logprobs_json(ep: Endpoint, tok: &Tokenizer, tokens: &[(u32, TokenLogprob)], offset: usize) -> Value {
    match ep {
        Endpoint::Completions => {
            let mut off = offset;
            let mut offsets = vec![];
            for (id, _) in tokens {
                offsets.push(off);
                off += tok.token_text(*id).len();
            }
            json!({
                "tokens": tokens.iter().map(|(id, _)| tok.token_label(*id)).collect::<Vec<_>>(),
                "token_logprobs": tokens.iter().map(|(_, l)| l.logprob).collect::<Vec<_>>(),
                "top_logprobs": tokens.iter().map(|(_, l)| {
                    l.top.iter().map(|(i, lp)| (tok.token_label(*i), json!(lp))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
                "token_ids": tokens.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            })
        }
        Endpoint::Chat => {
            let entry =
                |id: u32, lp: f64| json!({"token": tok.token_label(id), "logprob": lp, "bytes": tok.token_bytes(id)});
            json!({"content": tokens.iter().map(|(id, l)| {
                let mut e = entry(*id, l.logprob);
                e["top_logprobs"] = l.top.iter().map(|(i, lp)| entry(*i, *lp)).collect();
                e
            }).collect::<Vec<_>>()})
        }
    }
}

fn usage_json(usages: &[(usize, Usage)]) -> Value {
    let prompt: usize = usages.iter().map(|(p, _)| p).sum();
    let completion: usize = usages.iter().map(|(_, u)| u.completion_tokens).sum();
    let cached: usize = usages.iter().map(|(_, u)| u.cached_tokens).sum();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let prompt_ms: f64 = usages.iter().map(|(_, u)| ms(u.prompt_time)).sum();
    let predicted_ms: f64 = usages.iter().map(|(_, u)| ms(u.decode_time)).sum();
    let computed = prompt - cached;
    let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "timings": {
            "cache_n": cached,
            "prompt_n": computed,
            "prompt_ms": prompt_ms,
            "prompt_per_second": per_s(computed, prompt_ms),
            "predicted_n": completion,
            "predicted_ms": predicted_ms,
            "predicted_per_second": per_s(completion.saturating_sub(usages.len()), predicted_ms),
            "queue_ms": usages.iter().map(|(_, u)| ms(u.queue)).fold(0.0, f64::max),
        },
    })
}

/// Usage counts each prompt once (its first choice's cache use), and every choice's tokens.
fn usage_of(job_n: usize, prompt_lens: &[usize], ended: &[Ended]) -> Vec<(usize, Usage)> {
    ended
        .iter()
        .enumerate()
        .map(|(k, e)| {
            let mut u = e.usage.clone();
            let first = k % job_n == 0;
            if !first {
                u.cached_tokens = 0;
            }
            (if first { prompt_lens[k / job_n] } else { 0 }, u)
        })
        .collect()
}

/// Waits for every choice and answers with one JSON object.
async fn collect(app: &Shared, job: Job) -> ApiResult<Value> {
    let r = ready(app)?;
    let Job { ep, id, params, prompt_ids, prompt_texts, seqs, started: job_started } = job;
    let mut choices = vec![];
    let mut ended = vec![];
    for (k, rx) in seqs.into_iter().enumerate() {
        let prompt_text = &prompt_texts[k / params.n];
        let mut text = if params.echo { prompt_text.clone() } else { String::new() };
        let mut tokens: Vec<(u32, TokenLogprob)> = vec![];
        let mut stops = params.stop.clone();
        stops.dedup();
        let res = drive(&r.tok, r.eos, rx, stops, |d: Delta| {
            text.push_str(&d.text);
            if let Some((id, Some(lp))) = d.token {
                tokens.push((id, lp));
            }
            true
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "engine_error", e))?;
        let Some(end) = res else {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "engine_error",
                "the sequence ended early",
            ));
        };
        let logprobs = params.logprobs.map(|_| logprobs_json(ep, &r.tok, &tokens, 0));
        choices.push(match ep {
            Endpoint::Completions => {
                json!({"index": k, "text": text, "logprobs": logprobs, "finish_reason": end.finish_reason})
            }
            Endpoint::Chat => json!({
                "index": k,
                "message": {"role": "assistant", "content": text.trim_start()},
                "logprobs": logprobs,
                "finish_reason": end.finish_reason,
            }),
        });
        ended.push(end);
    }
    let lens: Vec<usize> = prompt_ids.iter().map(Vec::len).collect();
    let usage = usage_json(&usage_of(params.n, &lens, &ended));
    app.metrics.request_seconds(job_started.elapsed());
    let object = if ep == Endpoint::Chat { "chat.completion" } else { "text_completion" };
    Ok(json!({"id": id, "object": object, "created": now_secs(), "model": r.name, "choices": choices, "usage": usage}))
}

/// The chunks of one streamed response.
struct Chunks {
    ep: Endpoint,
    id: String,
    created: u64,
    model: String,
}

impl Chunks {
    fn object(&self) -> &'static str {
        if self.ep == Endpoint::Chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        }
    }

    fn event(&self, k: usize, delta: Value, logprobs: Value, finish: Value) -> SseEvent {
        let choice = match self.ep {
            Endpoint::Completions => json!({"index": k, "text": delta, "logprobs": logprobs, "finish_reason": finish}),
            Endpoint::Chat => json!({"index": k, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
        };
        let v = json!({"id": self.id, "object": self.object(), "created": self.created, "model": self.model, "choices": [choice]});
        SseEvent::default().data(v.to_string())
    }

    fn usage(&self, usage: Value) -> SseEvent {
        let v = json!({"id": self.id, "object": self.object(), "created": self.created, "model": self.model, "choices": [], "usage": usage});
        SseEvent::default().data(v.to_string())
    }
}

/// Streams every choice as server-sent events, then `data: [DONE]`.
fn stream(app: Shared, job: Job) -> Response {
    let (tx, rx) = unbounded_channel::<SseEvent>();
    tokio::spawn(async move {
        let app2 = app.clone();
        let Some(r) = app2.ready.get() else { return };
        let Job { ep, id, params, prompt_ids, prompt_texts, seqs, started } = job;
        let chunks = Arc::new(Chunks { ep, id, created: now_secs(), model: r.name.clone() });
        let mut tasks = vec![];
        for (k, rx_seq) in seqs.into_iter().enumerate() {
            let (tx, params, chunks) = (tx.clone(), params.clone(), chunks.clone());
            let chunk = move |k, delta, logprobs, finish| chunks.event(k, delta, logprobs, finish);
            let echo = params.echo.then(|| prompt_texts[k / params.n].clone());
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                let r = app.ready.get()?;
                if ep == Endpoint::Chat
                    && tx.send(chunk(k, json!({"role": "assistant", "content": ""}), Value::Null, Value::Null)).is_err()
                {
                    return None;
                }
                if let Some(e) = echo {
                    if tx.send(chunk(k, json!(e), Value::Null, Value::Null)).is_err() {
                        return None;
                    }
                }
                let mut offset = 0;
                let mut first = ep == Endpoint::Chat;
                let res = drive(&r.tok, r.eos, rx_seq, params.stop.clone(), |d: Delta| {
                    let mut text = d.text;
                    if first {
                        // The template ends with "Assistant:"; the answer's leading space is not content.
                        text = text.trim_start().to_string();
                        first = text.is_empty();
                    }
                    let lp = match (&d.token, params.logprobs) {
                        (Some((id, Some(l))), Some(_)) => logprobs_json(ep, &r.tok, &[(*id, l.clone())], offset),
                        _ => Value::Null,
                    };
                    offset += text.len();
                    if text.is_empty() && lp.is_null() {
                        return !tx.is_closed();
                    }
                    let delta = if ep == Endpoint::Chat { json!({"content": text}) } else { json!(text) };
                    tx.send(chunk(k, delta, lp, Value::Null)).is_ok()
                })
                .await;
                match res {
                    Ok(Some(end)) => {
                        let empty = if ep == Endpoint::Chat { json!({}) } else { json!("") };
                        tx.send(chunk(k, empty, Value::Null, json!(end.finish_reason))).ok()?;
                        Some(end)
                    }
                    Ok(None) => None,
                    Err(e) => {
                        let err = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "engine_error", e);
                        let _ = tx.send(SseEvent::default().data(err.body().to_string()));
                        None
                    }
                }
            }));
        }
        let mut ended = vec![];
        for t in tasks {
            match t.await {
                Ok(Some(e)) => ended.push(e),
                _ => return, // the client went away or a choice failed: no usage, no [DONE]
            }
        }
        if params.include_usage {
            let lens: Vec<usize> = prompt_ids.iter().map(Vec::len).collect();
            let usage = usage_json(&usage_of(params.n, &lens, &ended));
            let _ = tx.send(chunks.usage(usage));
        }
        let _ = tx.send(SseEvent::default().data("[DONE]"));
        app.metrics.request_seconds(started.elapsed());
    });
    let body = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    let body = tokio_stream::StreamExt::map(body, Ok::<_, std::convert::Infallible>);
    Sse::new(body).keep_alive(KeepAlive::default()).into_response()
}
