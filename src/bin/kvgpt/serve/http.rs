//! HTTP plumbing: the state the handlers share, the API key, bodies read within their limit,
//! and the endpoints that need no engine (health, models, metrics, tokenize, detokenize).

use super::api::{self, ApiError, ApiResult};
use super::metrics::Metrics;
use axum::body::Body;
use axum::extract::{MatchedPath, Request as HttpRequest, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgpt::engine::EngineHandle;
use kvgpt::Tokenizer;
use serde_json::{json, Value};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// What the server knows once the model is loaded.
pub struct Ready {
    pub tok: Tokenizer,
    /// The name `/v1/models` shows and responses carry (`--served-model-name`).
    pub name: String,
    /// Other names a request's `model` may give: `kvgpt` and the `--model` argument.
    pub aliases: Vec<String>,
    pub n_positions: usize,
    pub vocab: usize,
    pub eos: u32,
    pub engine: EngineHandle,
}

pub struct App {
    pub ready: OnceLock<Ready>,
    pub api_key: Option<String>,
    pub max_body: usize,
    pub metrics: Metrics,
    pub started: u64,
    pub next_id: AtomicU64,
}

pub type Shared = Arc<App>;

pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Checks the API key and counts every response by endpoint and status.
pub async fn auth(State(app): State<Shared>, req: HttpRequest, next: Next) -> Response {
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
            .is_some_and(|k| same_key(k.as_bytes(), key.as_bytes()));
        if !ok && req.uri().path() != "/health" {
            drain(app, req.into_body()).await;
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

/// Compares keys in time that depends only on their lengths, not on where they first differ.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn not_found(State(app): State<Shared>, req: HttpRequest) -> ApiError {
    let (parts, body) = req.into_parts();
    drain(&app, body).await;
    let req = HttpRequest::from_parts(parts, Body::empty());
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

/// Where an endpoint exists but not for this method: 405 with an error object (axum's own has an
/// empty body) that says which method each endpoint takes.
pub async fn method_not_allowed(State(app): State<Shared>, req: HttpRequest) -> ApiError {
    let (parts, body) = req.into_parts();
    drain(&app, body).await;
    let path = parts.uri.path();
    let method = if ["/health", "/v1/models", "/metrics"].contains(&path) { "GET" } else { "POST" };
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
/// sees the status, not a reset.
async fn drain(app: &App, body: Body) {
    use tokio_stream::StreamExt;
    let mut stream = body.into_data_stream();
    let mut seen = 0usize;
    while let Some(Ok(chunk)) = stream.next().await {
        seen = seen.saturating_add(chunk.len());
        if seen > app.max_body.saturating_mul(DRAIN_FACTOR) {
            break;
        }
    }
}

/// Reads the body, at most `max_body` bytes (413 beyond), as a JSON object.
pub async fn body_object(app: &App, body: Body) -> ApiResult<serde_json::Map<String, Value>> {
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

pub async fn health(State(app): State<Shared>) -> Response {
    match app.ready.get() {
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading"}))).into_response(),
    }
}

pub async fn models(State(app): State<Shared>) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{"id": r.name, "object": "model", "created": app.started, "owned_by": "kvgpt", "max_model_len": r.n_positions}],
    })))
}

pub async fn metrics_text(State(app): State<Shared>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], app.metrics.render()).into_response()
}

pub async fn tokenize(State(app): State<Shared>, body: Body) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    let text = api::text_field(&body_object(&app, body).await?)?;
    let ids = r.tok.encode(&text).map_err(|e| ApiError::bad("content", e.to_string()))?;
    let pieces: Vec<String> = ids.iter().map(|&i| r.tok.token_text(i)).collect();
    Ok(Json(json!({"tokens": ids, "pieces": pieces})))
}

pub async fn detokenize(State(app): State<Shared>, body: Body) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    let ids = api::tokens_field(&body_object(&app, body).await?)?;
    if let Some(&id) = ids.iter().find(|&&i| i as usize >= r.vocab) {
        return Err(ApiError::bad("tokens", format!("token id {id} is outside the vocabulary of {}", r.vocab)));
    }
    Ok(Json(json!({"content": r.tok.decode(&ids)})))
}
