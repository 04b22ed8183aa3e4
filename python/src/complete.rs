//! `Model.complete`: an OpenAI-shaped completion through the core's `openai` module, the code
//! `kvgpt serve` answers with: the body parsed and checked by the server's rules, its sequences
//! run in the model's serving engine (batched with every other completion running meanwhile,
//! from any thread), and the answer in the server's shapes, whole or chunk by chunk.

use crate::errors::api_err;
use crate::model::{Engine, Model};
use kvgpt_core::engine::block_on;
use kvgpt_core::openai::{self, ChoiceChunks, Chunk, Endpoint, Job};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// Numbers the completions' ids.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What a streaming completion's thread hands the iterator.
enum Msg {
    Chunk(String),
    Failed(String),
}

/// A streamed completion's chunks, each the JSON text of one chunk (the server's `data:` lines
/// without `[DONE]`); the last carries the usage when `stream_options.include_usage` asked.
#[pyclass(module = "kvgpt")]
pub struct Chunks {
    rx: Mutex<Receiver<Msg>>,
}

#[pymethods]
impl Chunks {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        match py.detach(|| self.rx.lock().ok().and_then(|rx| rx.recv().ok())) {
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
        if job.params.stream {
            let rx = stream(self.e.clone(), job);
            return Ok(Py::new(py, Chunks { rx: Mutex::new(rx) })?.into_any());
        }
        let e = &self.e;
        let (answer, _) = py.detach(|| block_on(e.served()?.collect(job)).map_err(api_err))?;
        Ok(answer.to_string().into_pyobject(py)?.into_any().unbind())
    }
}

/// Parses, tokenizes, fits and submits `body`.
fn submit(e: &Engine, ep: Endpoint, body: &str) -> PyResult<Job> {
    let served = e.served()?;
    let params = ep.params(&openai::object(body.as_bytes()).map_err(api_err)?).map_err(api_err)?;
    let prepared = served.prepare(params).map_err(api_err)?;
    let id = format!("{}-{}", ep.id_prefix(), NEXT_ID.fetch_add(1, Ordering::Relaxed));
    served.submit(ep, prepared, id).map_err(api_err)
}

/// Streams `job` from a thread of its own, each choice from one more: chunks go out as they
/// come; once every choice has ended, the usage chunk (when asked for). A reader that drops the
/// iterator cancels the choices still running.
fn stream(e: Arc<Engine>, job: Job) -> Receiver<Msg> {
    // Unbounded: a stream kept but no longer read must not park a thread in a send.
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let Ok(served) = e.served() else { return };
        let (head, seqs) = job.split();
        let ended = std::thread::scope(|s| {
            let choices: Vec<_> = seqs
                .into_iter()
                .enumerate()
                .map(|(k, events)| {
                    let (tx, head) = (tx.clone(), head.clone());
                    s.spawn(move || send_choice(&tx, ChoiceChunks::new(served, head, k, events)))
                })
                .collect();
            choices.into_iter().map(|c| c.join().ok().flatten()).collect::<Option<Vec<_>>>()
        });
        if let Some(usage) = ended.and_then(|ended| head.usage_chunk(&served.tok, &ended)) {
            let _ = tx.send(Msg::Chunk(usage.to_string()));
        }
    });
    rx
}

/// Sends one choice's chunks; its ending, unless it failed or the reader left.
fn send_choice(tx: &Sender<Msg>, mut chunks: ChoiceChunks) -> Option<kvgpt_core::engine::Ended> {
    loop {
        match block_on(chunks.next())? {
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
