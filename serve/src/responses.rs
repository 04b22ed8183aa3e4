//! Responses: every choice collected into one JSON object, or streamed as server-sent events;
//! and the usage both report.

use super::admission::Job;
use super::api::Params;
use super::api::{ApiError, ApiResult};
use super::choice::{drive, Delta, Ended};
use super::endpoint::Endpoint;
use super::http::{now_secs, ready, Shared};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use kvgpt_core::cache_report::Report;
use kvgpt_core::engine::Usage;
use kvgpt_core::logprobs::TokenLogprob;
use kvgpt_core::Tokenizer;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc::unbounded_channel;

fn engine_error(e: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "engine_error", e)
}

/// Waits for every choice and answers with one JSON object.
pub async fn collect(app: &Shared, job: Job) -> ApiResult<Value> {
    let r = ready(app)?;
    let Job { ep, id, params, prompt_ids, prompt_texts, seqs, started, tally } = job;
    let mut choices = vec![];
    let mut ended = vec![];
    for (k, events) in seqs.into_iter().enumerate() {
        let mut text = if params.echo { prompt_texts[k / params.n].clone() } else { String::new() };
        let mut tokens: Vec<(u32, TokenLogprob)> = vec![];
        let mut stops = params.stop.clone();
        stops.dedup();
        // A client that leaves drops this whole future, and with it every choice's events.
        let end = drive(&r.tok, r.eos, &r.engine, events, stops, std::future::pending(), |d: Delta| {
            text.push_str(&d.text);
            if let Some((id, Some(lp))) = d.token {
                tokens.push((id, lp));
            }
            true
        })
        .await
        .map_err(engine_error)?
        .ok_or_else(|| engine_error("the sequence ended early"))?;
        let logprobs = params.logprobs.map(|_| ep.logprobs(&r.tok, &tokens, 0));
        choices.push(ep.choice(k, &text, logprobs, end.finish_reason));
        ended.push(end);
    }
    let usages = usage_of(params.n, &prompt_ids, &ended);
    tally.add(&usages);
    let mut usage = usage_json(&usages);
    usage["prompt_cache"] = prompt_cache_json(&r.tok, &params, &prompt_ids, &ended);
    app.metrics.request_seconds(started.elapsed());
    Ok(
        json!({"id": id, "object": ep.object(), "created": now_secs(), "model": r.name, "seed": params.sampling.seed, "choices": choices, "usage": usage}),
    )
}

/// The chunks of one streamed response.
struct Chunks {
    ep: Endpoint,
    id: String,
    created: u64,
    model: String,
    /// The first choice's seed (given or drawn), so a sampled answer can be asked for again.
    seed: u64,
}

impl Chunks {
    fn event(&self, k: usize, delta: Value, logprobs: Value, finish: Value) -> SseEvent {
        let choice = self.ep.chunk_choice(k, delta, logprobs, finish);
        self.data(json!([choice]), None)
    }

    fn data(&self, choices: Value, usage: Option<Value>) -> SseEvent {
        let mut v = json!({"id": self.id, "object": self.ep.chunk_object(), "created": self.created, "model": self.model, "seed": self.seed, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        SseEvent::default().data(v.to_string())
    }
}

/// Streams every choice as server-sent events, then `data: [DONE]`.
pub fn stream(app: Shared, job: Job) -> Response {
    let (tx, rx) = unbounded_channel::<SseEvent>();
    tokio::spawn(async move {
        let Some(r) = app.ready.get() else { return };
        let Job { ep, id, params, prompt_ids, prompt_texts, seqs, started, tally } = job;
        let seed = params.sampling.seed;
        let chunks = Arc::new(Chunks { ep, id, created: now_secs(), model: r.name.clone(), seed });
        let mut tasks = vec![];
        for (k, events) in seqs.into_iter().enumerate() {
            let (tx, params, chunks, app) = (tx.clone(), params.clone(), chunks.clone(), app.clone());
            let echo = params.echo.then(|| prompt_texts[k / params.n].clone());
            tasks.push(tokio::spawn(async move {
                let r = app.ready.get()?;
                let chunk = |delta, logprobs, finish| chunks.event(k, delta, logprobs, finish);
                for opening in ep.opening().into_iter().chain(echo.map(|e| json!(e))) {
                    tx.send(chunk(opening, Value::Null, Value::Null)).ok()?;
                }
                let mut offset = 0;
                let mut leading = ep.trims_start();
                // The stream's body going away (the client left) cancels this choice too while it
                // still waits for a slot, when it has no token to fail to send.
                let gone = tx.clone();
                let res = drive(&r.tok, r.eos, &r.engine, events, params.stop.clone(), gone.closed(), |d: Delta| {
                    let mut text = d.text;
                    if leading {
                        text = text.trim_start().to_string();
                        leading = text.is_empty();
                    }
                    let lp = match (&d.token, params.logprobs) {
                        (Some((id, Some(l))), Some(_)) => ep.logprobs(&r.tok, &[(*id, l.clone())], offset),
                        _ => Value::Null,
                    };
                    offset += text.len();
                    if text.is_empty() && lp.is_null() {
                        return !tx.is_closed();
                    }
                    tx.send(chunk(ep.delta(&text), lp, Value::Null)).is_ok()
                })
                .await;
                match res {
                    Ok(Some(end)) => {
                        tx.send(chunk(ep.delta(""), Value::Null, json!(end.finish_reason))).ok()?;
                        Some(end)
                    }
                    Ok(None) => None,
                    Err(e) => {
                        let _ = tx.send(SseEvent::default().data(engine_error(e).body().to_string()));
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
        let usages = usage_of(params.n, &prompt_ids, &ended);
        tally.add(&usages);
        if params.include_usage {
            let mut usage = usage_json(&usages);
            usage["prompt_cache"] = prompt_cache_json(&r.tok, &params, &prompt_ids, &ended);
            let _ = tx.send(chunks.data(json!([]), Some(usage)));
        }
        let _ = tx.send(SseEvent::default().data("[DONE]"));
        app.metrics.request_seconds(started.elapsed());
    });
    let body = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    let body = tokio_stream::StreamExt::map(body, Ok::<_, std::convert::Infallible>);
    Sse::new(body).keep_alive(KeepAlive::default()).into_response()
}

/// Where reuse of the prompt cache stopped for each prompt (its first choice's lookup), and why:
/// an object for one prompt, a list for several; null with the prompt cache off. With the
/// request's `kvgpt.cache_diagnosis`, the text around each stop and a sentence too.
fn prompt_cache_json(tok: &Tokenizer, params: &Params, prompts: &[Vec<u32>], ended: &[Ended]) -> Value {
    let reports: Vec<Value> = prompts
        .iter()
        .zip(ended.iter().step_by(params.n))
        .map(|(ids, e)| {
            e.usage
                .reuse
                .as_ref()
                .map_or(Value::Null, |stop| json!(Report::new(tok, ids, stop, params.cache_diagnosis)))
        })
        .collect();
    match <[Value; 1]>::try_from(reports) {
        Ok([one]) => one,
        Err(all) => json!(all),
    }
}

/// Usage counts each prompt once (its first choice's cache use), and every choice's tokens.
fn usage_of(n: usize, prompts: &[Vec<u32>], ended: &[Ended]) -> Vec<(usize, Usage)> {
    ended
        .iter()
        .enumerate()
        .map(|(k, e)| {
            let mut u = e.usage.clone();
            let first = k % n == 0;
            if !first {
                u.cached_tokens = 0;
            }
            (if first { prompts[k / n].len() } else { 0 }, u)
        })
        .collect()
}

fn usage_json(usages: &[(usize, Usage)]) -> Value {
    let prompt: usize = usages.iter().map(|(p, _)| p).sum();
    let completion: usize = usages.iter().map(|(_, u)| u.completion_tokens).sum();
    let cached: usize = usages.iter().map(|(_, u)| u.cached_tokens).sum();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let prompt_ms: f64 = usages.iter().map(|(_, u)| ms(u.prompt_time)).sum();
    let predicted_ms: f64 = usages.iter().map(|(_, u)| ms(u.decode_time)).sum();
    let computed = prompt - cached;
    let drafted: usize = usages.iter().map(|(_, u)| u.drafted_tokens).sum();
    let accepted: usize = usages.iter().map(|(_, u)| u.accepted_tokens).sum();
    let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        // Speculative decoding (`--draft`), under OpenAI's names for predicted tokens; unlike
        // OpenAI's, rejected ones are not counted in `completion_tokens`.
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        },
        "timings": {
            "cache_n": cached,
            "prompt_n": computed,
            "prompt_ms": prompt_ms,
            "prompt_per_second": per_s(computed, prompt_ms),
            "predicted_n": completion,
            "predicted_ms": predicted_ms,
            "predicted_per_second": per_s(completion.saturating_sub(usages.len()), predicted_ms),
            "draft_n": drafted,
            "draft_n_accepted": accepted,
            "queue_ms": usages.iter().map(|(_, u)| ms(u.queue)).fold(0.0, f64::max),
        },
    })
}
