//! Admission: read the body, parse and tokenize it off the async threads (the core's
//! [`Served::prepare`]), then check every prompt against the context and submit every sequence
//! (prompt × choice) to the engine at once ([`Served::submit`]).

use super::access::Tally;
use super::api::ApiResult;
use super::http::{body_object, offload, ready, Shared};
use axum::body::Body;
use kvgpt_core::openai::{Endpoint, Prepared, Served};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// A submitted request, with what the server keeps of it beside the core's job.
pub struct Job {
    pub job: kvgpt_core::openai::Job,
    pub started: Instant,
    /// What the request's log line reports, filled in as its sequences finish.
    pub tally: Arc<Tally>,
}

/// Parses the body, checks the model it names, and tokenizes its prompts. Routers ask for
/// exactly this (`/…/render`).
pub async fn prepare(app: &Shared, body: Body, ep: Endpoint) -> ApiResult<Prepared> {
    ready(app)?;
    let params = ep.params(&body_object(app, body).await?)?;
    let app = app.clone();
    offload(move || Ok(served(&app)?.prepare(params)?)).await
}

/// Parses, checks every limit, and submits the sequences.
pub async fn start(app: &Shared, body: Body, ep: Endpoint, tally: Arc<Tally>) -> ApiResult<Job> {
    let prepared = prepare(app, body, ep).await?;
    let started = Instant::now();
    let id = || format!("{}-{}-{}", ep.id_prefix(), app.started, app.next_id.fetch_add(1, Ordering::Relaxed));
    let job = served(app)?.submit(ep, prepared, id)?;
    Ok(Job { job, started, tally })
}

fn served(app: &Shared) -> ApiResult<&Served> {
    Ok(&ready(app)?.served)
}
