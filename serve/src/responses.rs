//! Responses: the core's answer (one JSON object, or its chunks) over HTTP, the chunks as
//! server-sent events; the request's tally and duration once it is done.

use super::admission::Job;
use super::api::{ApiError, ApiResult};
use super::http::{ready, Shared};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use kvgpt_core::openai::{ChoiceChunks, Chunk};
use serde_json::Value;
use tokio::sync::mpsc::unbounded_channel;

/// Waits for every choice and answers with one JSON object.
pub async fn collect(app: &Shared, job: Job) -> ApiResult<Value> {
    let r = ready(app)?;
    let Job { job, started, tally } = job;
    let (body, usages) = r.served.collect(job).await.map_err(ApiError)?;
    tally.add(&usages);
    app.metrics.request_seconds(started.elapsed());
    Ok(body)
}

/// Streams every choice as server-sent events, then `data: [DONE]`.
pub fn stream(app: Shared, job: Job) -> Response {
    let (tx, rx) = unbounded_channel::<SseEvent>();
    tokio::spawn(async move {
        let Some(r) = app.ready.get() else { return };
        let Job { job, started, tally } = job;
        let (head, seqs) = job.split();
        let mut tasks = vec![];
        for (k, events) in seqs.into_iter().enumerate() {
            let (tx, head, app) = (tx.clone(), head.clone(), app.clone());
            tasks.push(tokio::spawn(async move {
                let r = app.ready.get()?;
                let mut chunks = ChoiceChunks::new(&r.served, head, k, events);
                loop {
                    // The stream's body going away (the client left) cancels this choice too,
                    // while it still waits for a slot or its prompt.
                    let next = tokio::select! {
                        c = chunks.next() => c?,
                        () = tx.closed() => return Some(Err(chunks.so_far())),
                    };
                    match next {
                        Chunk::Data(v) => {
                            if tx.send(SseEvent::default().data(v.to_string())).is_err() {
                                return Some(Err(chunks.so_far()));
                            }
                        }
                        Chunk::Failed(e) => {
                            let _ = tx.send(SseEvent::default().data(e.to_string()));
                            return None;
                        }
                        Chunk::End(end) => return Some(Ok((end, chunks.so_far()))),
                    }
                }
            }));
        }
        let (mut ended, mut so_far, mut left) = (vec![], vec![], false);
        for t in tasks {
            match t.await {
                Ok(Some(Ok((e, used)))) => {
                    ended.push(e);
                    so_far.push(used);
                }
                Ok(Some(Err(used))) => {
                    so_far.push(used);
                    left = true;
                }
                _ => return, // a choice failed: no usage, no [DONE]
            }
        }
        if left {
            // No usage chunk, no [DONE]: nobody reads them. The log says what was consumed.
            tally.add(&so_far);
            tally.client_left();
            return;
        }
        tally.add(&head.usages(&ended));
        if let Some(usage) = head.usage_chunk(&r.served.tok, &ended) {
            let _ = tx.send(SseEvent::default().data(usage.to_string()));
        }
        let _ = tx.send(SseEvent::default().data("[DONE]"));
        app.metrics.request_seconds(started.elapsed());
    });
    let body = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    let body = tokio_stream::StreamExt::map(body, Ok::<_, std::convert::Infallible>);
    Sse::new(body).keep_alive(KeepAlive::default()).into_response()
}
