//! What the routers people put in front of replicas read of a worker, beside the OpenAI
//! endpoints and `/health` (vllm-router 0.1.17 and sglang-router 0.3.2, found by running them
//! against a worker that logged every request):
//!
//! - `/server_info` (and `/get_server_info`): the model's name and path, sizes, and the block
//!   size of the KV-cache events; `/model_info` (and `/get_model_info`);
//! - `/kv_event_sources`: where the KV-cache events are published (vllm-router's `kv_aware`
//!   subscribes to them);
//! - `/v1/completions/render`, `/v1/chat/completions/render`: a request's prompt as the token
//!   ids the engine will prefill (`cache_aware` and `kv_aware` ask every worker for each request);
//! - `/get_load` (sglang-router's `power_of_two`), `POST /flush_cache`.

use super::admission::prepare;
use super::api::{ApiError, ApiResult};
use super::http::{ready, Shared};
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use kvgpt_core::openai::Endpoint;
use kvgpt_core::openai::Prepared;
use serde_json::{json, Value};

pub async fn server_info(State(app): State<Shared>) -> ApiResult<Json<Value>> {
    Ok(Json(ready(&app)?.server_info.clone()))
}

pub async fn model_info(State(app): State<Shared>) -> ApiResult<Json<Value>> {
    let r = ready(&app)?;
    Ok(Json(json!({
        "model_path": r.server_info["model_path"],
        "tokenizer_path": r.server_info["model_path"],
        "is_generation": true,
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
    })))
}

/// sglang-router's form (it sums `num_tokens`): one data-parallel rank.
pub async fn load(State(app): State<Shared>) -> ApiResult<Json<Value>> {
    ready(&app)?;
    let g = app.metrics.last_step();
    Ok(Json(json!([{"dp_rank": 0, "num_reqs": g.running, "num_waiting_reqs": g.waiting, "num_tokens": g.kv_tokens}])))
}

/// vllm-router's discovery form: one rank, `"0"`.
pub async fn kv_event_sources(State(app): State<Shared>) -> ApiResult<Json<Value>> {
    let Some(s) = &app.kv_events else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            "this server publishes no KV-cache events; start it with --kv-events ENDPOINT",
        ));
    };
    Ok(Json(json!({"0": {
        "endpoint": s.endpoint,
        "replay_endpoint": s.replay,
        "topic": s.topic,
        "publisher": "zmq",
        "encoding": "msgpack",
        "schema_version": 1,
        "enable_kv_cache_events": true,
    }})))
}

/// Evicts every prompt-cache entry that no running sequence holds.
pub async fn flush_cache(State(app): State<Shared>) -> ApiResult<Json<Value>> {
    let f =
        ready(&app)?.served.engine.flush_cache().await.map_err(|e| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "shutting_down", e.to_string())
        })?;
    Ok(Json(json!({"evicted_tokens": f.evicted_tokens, "held_tokens": f.held_tokens})))
}

/// vLLM's completions render: one object per prompt.
pub async fn render_completion(State(app): State<Shared>, body: Body) -> ApiResult<Json<Value>> {
    let Prepared { prompts, .. } = prepare(&app, body, Endpoint::Completions).await?;
    Ok(Json(prompts.into_iter().map(|(ids, _)| json!({"token_ids": ids})).collect()))
}

/// vLLM's chat render: the conversation through the chat template, as ids.
pub async fn render_chat(State(app): State<Shared>, body: Body) -> ApiResult<Json<Value>> {
    let Prepared { mut prompts, .. } = prepare(&app, body, Endpoint::Chat).await?;
    Ok(Json(json!({"token_ids": prompts.swap_remove(0).0})))
}
