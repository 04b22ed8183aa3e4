//! `Model.complete`: an OpenAI-shaped completion through the core's `openai` module, the code
//! `kvgpt serve` answers with: the body parsed and checked by the server's rules, its sequences
//! run in the model's serving engine (batched with every other completion running meanwhile,
//! from any thread), and the answer in the server's shapes, whole or chunk by chunk.

use crate::errors::api_err;
use crate::model::{Engine, Model};
use kvgpt_core::engine::{block_on, Ended};
use kvgpt_core::openai::{self, ChoiceChunks, Chunk, Endpoint, Job};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// What a streaming completion's thread hands the iterator.
enum Msg {
    Chunk(String),
    Failed(String),
}

/// A streamed completion's chunks, each the JSON text of one chunk (the server's `data:` lines
/// without `[DONE]`); the last carries the usage when `stream_options.include_usage` asked.
/// Dropping it cancels the choices still running.
#[pyclass(module = "kvgpt")]
pub struct Chunks {
    rx: Mutex<UnboundedReceiver<Msg>>,
}

#[pymethods]
impl Chunks {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        match py.detach(|| self.rx.lock().ok().and_then(|mut rx| rx.blocking_recv())) {
            Some(Msg::Chunk(c)) => Ok(Some(c)),
            Some(Msg::Failed(e)) => Err(PyRuntimeError::new_err(e)),
            None => Ok(None),
        }
    }
}

#[pymethods]
impl Model {
    /// An OpenAI-shaped completion: `body` is the JSON text of a `/v1/completions` body (or with
    /// `chat`, of a `/v1/chat/completions` one), checked as `kvgpt serve` checks it. Returns the
    /// response's JSON text, or with `"stream": true` an iterator of its chunks' JSON texts.
    #[pyo3(signature = (body, chat=false))]
    fn complete(&self, py: Python<'_>, body: &str, chat: bool) -> PyResult<Py<PyAny>> {
        let ep = if chat { Endpoint::Chat } else { Endpoint::Completions };
        let e = self.e.clone();
        let job = py.detach(|| submit(&e, ep, body))?;
        if job.head.params.stream {
            let rx = stream(self.e.clone(), job)?;
            return Ok(Py::new(py, Chunks { rx: Mutex::new(rx) })?.into_any());
        }
        let e = &self.e;
        let (answer, _) = py.detach(|| block_on(e.served()?.collect(job)).map_err(api_err))?;
        Ok(answer.to_string().into_pyobject(py)?.into_any().unbind())
    }
}

/// Parses, tokenizes, fits and submits `body`; the job is named as the server names its
/// answers (the process's start and a count), unique across runs.
fn submit(e: &Engine, ep: Endpoint, body: &str) -> PyResult<Job> {
    static STARTED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let served = e.served()?;
    let params = ep.params(&openai::object(body.as_bytes()).map_err(api_err)?).map_err(api_err)?;
    let prepared = served.prepare(params).map_err(api_err)?;
    let started = *STARTED.get_or_init(openai::now_secs);
    let id = || format!("{}-{started}-{}", ep.id_prefix(), NEXT.fetch_add(1, Ordering::Relaxed));
    served.submit(ep, prepared, id).map_err(api_err)
}

/// Streams `job` from one thread of its own: every choice's chunks as they come, then (once
/// every choice has ended) the usage chunk when asked for. A reader that drops the iterator
/// cancels every choice still running, waiting for a slot or not.
fn stream(e: Arc<Engine>, job: Job) -> PyResult<UnboundedReceiver<Msg>> {
    // Unbounded: a stream kept but no longer read must not park the thread in a send.
    let (tx, rx) = unbounded_channel();
    let run = move || {
        let Ok(served) = e.served() else { return };
        let (head, seqs) = job.split();
        let choices = seqs
            .into_iter()
            .enumerate()
            .map(|(k, events)| send_choice(&tx, ChoiceChunks::new(served, head.clone(), k, events)));
        let ended = block_on(unless(join_all(choices.collect()), tx.closed()));
        let ended: Option<Vec<Ended>> = ended.and_then(|all| all.into_iter().collect());
        if let Some(usage) = ended.and_then(|ended| head.usage_chunk(&served.tok, &ended)) {
            let _ = tx.send(Msg::Chunk(usage.to_string()));
        }
    };
    std::thread::Builder::new()
        .name("kvgpt-stream".into())
        .spawn(run)
        .map_err(|e| PyRuntimeError::new_err(format!("could not start the stream's thread: {e}")))?;
    Ok(rx)
}

/// Sends one choice's chunks; its ending, unless it failed or the reader left.
async fn send_choice(tx: &UnboundedSender<Msg>, mut chunks: ChoiceChunks<'_>) -> Option<Ended> {
    loop {
        match chunks.next().await? {
            Chunk::Data(v) => tx.send(Msg::Chunk(v.to_string())).ok()?,
            Chunk::Failed(e) => {
                let message = e["error"]["message"].as_str().unwrap_or("the engine failed").to_string();
                let _ = tx.send(Msg::Failed(message));
                return None;
            }
            Chunk::End(end) => return Some(end),
        }
    }
}

/// Every one of `futs` to its end, polled together (one thread waits on every choice).
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    poll_fn(move |cx| {
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    *o = Some(v);
                }
            }
        }
        if out.iter().any(Option::is_none) {
            return Poll::Pending;
        }
        Poll::Ready(out.iter_mut().filter_map(Option::take).collect())
    })
    .await
}

/// `f`'s output, or None if `gone` resolves first (dropping `f`).
async fn unless<F: Future>(f: F, gone: impl Future<Output = ()>) -> Option<F::Output> {
    let (mut f, mut gone) = (pin!(f), pin!(gone));
    poll_fn(move |cx| {
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        gone.as_mut().poll(cx).map(|()| None)
    })
    .await
}
