//! Admission: parse the body, tokenize the prompts, check them against the context, and submit
//! every sequence (prompt × choice) to the engine at once.

use super::access::Tally;
use super::api::{ApiError, ApiResult, Params, Prompt};
use super::endpoint::Endpoint;
use super::http::{body_object, check_ids, offload, ready, Ready, Shared};
use axum::body::Body;
use axum::http::StatusCode;
use kvgpt_core::engine::{Events, Request, SubmitError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// A request split into sequences: prompt `i`, choice `j` is `seqs[i * n + j]`.
pub struct Job {
    pub ep: Endpoint,
    pub id: String,
    pub params: Params,
    pub prompt_ids: Vec<Vec<u32>>,
    pub prompt_texts: Vec<String>,
    pub seqs: Vec<Events>,
    pub started: Instant,
    /// What the request's log line reports, filled in as its sequences finish.
    pub tally: Arc<Tally>,
}

/// A parsed request whose prompts are tokenized as the engine will see them: `(ids, text)` each.
pub struct Prepared {
    pub params: Params,
    pub prompts: Vec<(Vec<u32>, String)>,
}

/// Parses the body, checks the model it names, and tokenizes its prompts (an empty prompt is
/// `<|endoftext|>`, as in `kvgpt generate`). Routers ask for exactly this (`/…/render`).
pub async fn prepare(app: &Shared, body: Body, ep: Endpoint) -> ApiResult<Prepared> {
    let r = ready(app)?;
    let mut params = ep.params(&body_object(app, body).await?)?;
    if let Some(m) = &params.model {
        if m != &r.name && !r.aliases.contains(m) {
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
    let prompts = std::mem::take(&mut params.prompts);
    let app_ = app.clone();
    let mut prompts: Vec<(Vec<u32>, String)> =
        offload(move || prompts.into_iter().map(|p| tokenize(ready(&app_)?, p)).collect()).await?;
    for (ids, _) in &mut prompts {
        if ids.is_empty() {
            ids.push(r.eos);
        }
    }
    Ok(Prepared { params, prompts })
}

/// Parses, checks every limit, and submits the sequences.
pub async fn start(app: &Shared, body: Body, ep: Endpoint, tally: Arc<Tally>) -> ApiResult<Job> {
    let Prepared { params, prompts } = prepare(app, body, ep).await?;
    let r = ready(app)?;
    let mut prompt_ids = vec![];
    let mut prompt_texts = vec![];
    let mut reqs = vec![];
    for (ids, text) in prompts {
        let max_tokens = context(&params, ep, ids.len(), r.n_positions)?;
        for j in 0..params.n {
            reqs.push(Request {
                prompt: ids.clone(),
                max_new_tokens: max_tokens,
                // Choice `j` samples with seed `seed + j`, so choices differ and each is reproducible.
                sampling: kvgpt_core::Sampling { seed: params.sampling.seed.wrapping_add(j as u64), ..params.sampling },
                stop_at_eos: !params.ignore_eos,
                logprobs: params.logprobs,
                speculative: params.speculative,
            });
        }
        prompt_ids.push(ids);
        prompt_texts.push(text);
    }
    let now = Instant::now();
    let seqs = r.engine.submit_all(reqs).map_err(|e| match e {
        SubmitError::Busy { .. } => {
            let mut err = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "queue_full", e.to_string());
            err.retry_after = Some(1);
            err
        }
        SubmitError::TooMany { .. } => ApiError::bad("n", e.to_string()),
        SubmitError::Invalid(e) => ApiError::bad("", e.to_string()),
        SubmitError::Stopped => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "shutting_down", "the engine has stopped")
        }
    })?;
    let id = format!("{}-{}-{}", ep.id_prefix(), app.started, app.next_id.fetch_add(1, Ordering::Relaxed));
    Ok(Job { ep, id, params, prompt_ids, prompt_texts, seqs, started: now, tally })
}

/// A prompt's ids and text (the text given, or the ids' decoding).
fn tokenize(r: &Ready, p: Prompt) -> ApiResult<(Vec<u32>, String)> {
    match p {
        Prompt::Text(t) => Ok((r.tok.encode(&t).map_err(|e| ApiError::bad("prompt", e.to_string()))?, t)),
        Prompt::Ids(ids) => {
            check_ids(r, &ids, "prompt")?;
            let text = r.tok.decode(&ids);
            Ok((ids, text))
        }
    }
}

/// The completion tokens of a prompt of `len` tokens, by OpenAI's rule: stricter by one than
/// `generate`'s (which does not count the last token, never fed), prompt + max_tokens ≤ the
/// context length, as OpenAI clients expect.
fn context(params: &Params, ep: Endpoint, len: usize, n_positions: usize) -> ApiResult<usize> {
    let room = n_positions.saturating_sub(len);
    let max_tokens = params.max_tokens.unwrap_or(ep.default_max_tokens(room));
    if max_tokens == 0 || len + max_tokens > n_positions {
        let (prompt, limit) = (ep.prompt_param(), params.max_tokens_param);
        let param = if params.max_tokens.is_some() && len < n_positions { limit } else { prompt };
        return Err(ApiError::bad(
            param,
            format!(
                "this model's maximum context length is {n_positions} tokens, but {len} prompt tokens + {max_tokens} \
                 completion tokens were asked for; shorten `{prompt}` or lower `{limit}` to at most {room}"
            ),
        )
        .with_code("context_length_exceeded"));
    }
    Ok(max_tokens)
}
