//! HTTP plumbing: the state the handlers share, bodies read within their limit and time, CPU
//! work moved off the async threads, and the endpoints that need no
//! engine (health, models, metrics, tokenize, detokenize).

use super::api::{ApiError, ApiResult};
use super::metrics::Metrics;
use axum::body::Body;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgpt_core::openai::{self, Served};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// What the server knows once the model is loaded.
pub struct Ready {
    /// The tokenizer, the served name (`--served-model-name`) with its aliases (`kvgpt` and the
    /// `--model` argument), and the engine.
    pub served: Served,
    /// `/server_info`: what routers read of this worker (names, sizes, the event block size).
    pub server_info: Value,
}

pub struct App {
    pub ready: OnceLock<Ready>,
    pub api_key: Option<String>,
    /// The `Host`/`Origin` names answered.
    pub hosts: super::hosts::Hosts,
    pub max_body: usize,
    /// The longest a request body may go without a byte (408 past it).
    pub body_timeout: std::time::Duration,
    pub metrics: Metrics,
    pub started: u64,
    pub next_id: AtomicU64,
    /// Where the KV-cache events go out (--kv-events).
    pub kv_events: Option<super::kv_events::Source>,
    /// Set by SIGTERM: `/health` answers 503 and new completions are refused (a router sends
    /// them elsewhere) while the ones in flight finish.
    pub draining: AtomicBool,
    /// Completion requests whose response has not been fully sent.
    pub working: AtomicUsize,
}

impl App {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Refuses new work while draining: 503, which routers retry on another replica.
    pub fn accepting(&self) -> ApiResult<()> {
        if !self.is_draining() {
            return Ok(());
        }
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "draining",
            "this server is shutting down and takes no new requests; send them to another replica",
        );
        e.retry_after = Some(1);
        Err(e)
    }
}

pub type Shared = Arc<App>;

/// Every route and the one method it takes: the server's router is built from this table, the
/// metrics count each route from the start, and a wrong method's 405 names the right one.
pub const ROUTES: &[(&str, Method)] = &[
    ("/health", Method::GET),
    ("/v1/models", Method::GET),
    ("/v1/completions", Method::POST),
    ("/v1/chat/completions", Method::POST),
    ("/tokenize", Method::POST),
    ("/detokenize", Method::POST),
    ("/metrics", Method::GET),
    ("/server_info", Method::GET),
    ("/get_server_info", Method::GET),
    ("/model_info", Method::GET),
    ("/get_model_info", Method::GET),
    ("/get_load", Method::GET),
    ("/kv_event_sources", Method::GET),
    ("/flush_cache", Method::POST),
    ("/v1/completions/render", Method::POST),
    ("/v1/chat/completions/render", Method::POST),
];

/// The method `path` takes (None: no such route).
pub fn method_of(path: &str) -> Option<&'static Method> {
    ROUTES.iter().find(|(p, _)| *p == path).map(|(_, m)| m)
}

pub use openai::now_secs;

pub async fn not_found(State(app): State<Shared>, req: HttpRequest) -> ApiError {
    let (parts, body) = req.into_parts();
    drain(&app, body).await;
    let req = HttpRequest::from_parts(parts, Body::empty());
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        format!(
            "no endpoint {} {}; this server has {}",
            req.method(),
            req.uri().path(),
            ROUTES.iter().map(|(p, m)| format!("{m} {p}")).collect::<Vec<_>>().join(", ")
        ),
    )
}

/// Where an endpoint exists but not for this method: 405 with an error object (axum's own has an
/// empty body) that says which method each endpoint takes.
pub async fn method_not_allowed(State(app): State<Shared>, req: HttpRequest) -> ApiError {
    let (parts, body) = req.into_parts();
    drain(&app, body).await;
    let path = parts.uri.path();
    let method = method_of(path).map_or("GET", Method::as_str);
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!("{path} does not take {}; send it as {method}", parts.method),
    )
}

pub fn ready(app: &App) -> ApiResult<&Ready> {
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

/// Reads and drops a body that an error answers without looking at (a wrong key, no such
/// endpoint or method), up to the same bound as an oversized one: a client still uploading then
/// sees the status, not a reset. A body that stalls is left unread.
pub async fn drain(app: &App, body: Body) {
    let mut stream = body.into_data_stream();
    let mut seen = 0usize;
    while let Ok(Some(Ok(chunk))) = next_chunk(app, &mut stream).await {
        seen = seen.saturating_add(chunk.len());
        if seen > app.max_body.saturating_mul(DRAIN_FACTOR) {
            break;
        }
    }
}

/// Why a body's next chunk did not come.
enum NoChunk {
    /// None for `body_timeout`.
    Stalled,
    /// The server began shutting down: a request not yet whole is not waited for.
    Draining,
}

/// The body's next chunk (None at its end), waiting `body_timeout` at most, and no longer once
/// the server drains.
async fn next_chunk(
    app: &App,
    stream: &mut axum::body::BodyDataStream,
) -> Result<Option<Result<axum::body::Bytes, axum::Error>>, NoChunk> {
    use tokio_stream::StreamExt;
    const SLICE: std::time::Duration = std::time::Duration::from_millis(50);
    let until = tokio::time::Instant::now() + app.body_timeout;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(NoChunk::Stalled);
        }
        if let Ok(next) = tokio::time::timeout(left.min(SLICE), stream.next()).await {
            return Ok(next);
        }
        if app.is_draining() {
            return Err(NoChunk::Draining);
        }
    }
}

/// Reads the body, at most `max_body` bytes (413 beyond), as a JSON object.
pub async fn body_object(app: &App, body: Body) -> ApiResult<serde_json::Map<String, Value>> {
    let mut stream = body.into_data_stream();
    let (mut bytes, mut seen) = (Vec::new(), 0usize);
    loop {
        let next = match next_chunk(app, &mut stream).await {
            Ok(next) => next,
            Err(NoChunk::Stalled) => return Err(stalled(app, seen)),
            Err(NoChunk::Draining) => return Err(app.accepting().expect_err("draining")),
        };
        let Some(chunk) = next else { break };
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
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("the request body is larger than the server's limit of {} bytes", app.max_body),
        ));
    }
    if bytes.len() < OFFLOAD_BYTES {
        return Ok(openai::object(&bytes)?);
    }
    offload(move || Ok(openai::object(&bytes)?)).await
}

/// Bodies this large are parsed off the async threads.
const OFFLOAD_BYTES: usize = 64 << 10;

/// Runs CPU work (parsing a large body, tokenizing) on the blocking pool, so the runtime's few
/// worker threads keep answering other requests (/health among them) meanwhile.
pub async fn offload<T: Send + 'static>(work: impl FnOnce() -> ApiResult<T> + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            format!("a worker failed: {e}"),
        ))
    })
}

fn stalled(app: &App, seen: usize) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        "request_timeout",
        format!(
            "the request body stalled: no byte for {} s after {seen} bytes (the server's --body-timeout); send the \
             whole body without pausing",
            app.body_timeout.as_secs_f64()
        ),
    )
}

/// 200 when ready; 503 while loading, and while draining after SIGTERM (routers and readiness
/// probes then send no new work here).
pub async fn health(State(app): State<Shared>) -> Response {
    let unavailable = |status| (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": status}))).into_response();
    match app.ready.get() {
        _ if app.is_draining() => unavailable("draining"),
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => unavailable("loading"),
    }
}

pub async fn models(State(app): State<Shared>) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{"id": r.served.name, "object": "model", "created": app.started, "owned_by": "kvgpt", "max_model_len": r.served.n_positions()}],
    })))
}

pub async fn metrics_text(State(app): State<Shared>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], app.metrics.render()).into_response()
}

pub async fn tokenize(State(app): State<Shared>, body: Body) -> ApiResult<Json<Value>> {
    ready(&app)?;
    let text = openai::text_field(&body_object(&app, body).await?)?;
    offload(move || {
        let tok = &ready(&app)?.served.tok;
        let ids = tok.encode(&text).map_err(|e| ApiError::bad("content", e.to_string()))?;
        let pieces: Vec<String> = ids.iter().map(|&i| tok.token_text(i)).collect();
        Ok(Json(json!({"tokens": ids, "pieces": pieces})))
    })
    .await
}

pub async fn detokenize(State(app): State<Shared>, body: Body) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    let ids = openai::tokens_field(&body_object(&app, body).await?)?;
    r.served.check_ids(&ids, "tokens")?;
    offload(move || Ok(Json(json!({"content": ready(&app)?.served.tok.decode(&ids)})))).await
}
