//! `Model.generate` and `Model.stream`: `kvgpt generate`'s loop (`kvgpt_core::generate_from`) and its
//! text (`kvgpt_core::stop::TextStream`), so the same settings give the same bits as the CLI. Both
//! take the same keywords, parsed once ([`Model::ask`]).

use crate::errors::{arg, py_err};
use crate::model::{ids_of, Engine, Model};
use kvgpt_core::stop::TextStream;
use kvgpt_core::{GenerateOptions, Generation, Sampling, Sequence, Step};
use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};

/// What a generation was asked for.
#[derive(Clone)]
struct Ask {
    ids: Vec<u32>,
    opts: GenerateOptions,
    stop: Vec<String>,
}

/// Runs the CLI's generation over `ask` ([`kvgpt_core::generate_text`]), handing each token and the
/// text it shows to `emit` (false: the caller stopped listening), and at the end any text held
/// back (no token); returns the generation and its whole text.
fn run(
    l: &Engine,
    ask: &Ask,
    emit: &mut dyn FnMut(Option<u32>, &str) -> bool,
) -> kvgpt_core::Result<(Generation, String)> {
    let mut seq = Sequence::new(&l.model, &ask.ids, ask.opts.max_new_tokens, ask.opts.sampling)?;
    let eos = ask.opts.stop_at_eos.then_some(l.model.config.eos_token_id);
    let stream = TextStream::new(&l.tokenizer, eos, ask.stop.clone());
    kvgpt_core::generate_text(&l.model, &mut seq, &ask.opts, stream, &mut |token, t| {
        Ok(if emit(token.map(|(id, _)| id), t) { Step::Go } else { Step::Stop })
    })
}

fn result<'py>(py: Python<'py>, g: &Generation, text: &str) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("text", text)?;
    d.set_item("ids", &g.generated_ids)?;
    d.set_item("prompt_ids", &g.prompt_ids)?;
    d.set_item("finish_reason", g.finish_reason.as_str())?;
    Ok(d)
}

/// One message from a generation running in the model's threads to the Python iterator.
enum Msg {
    Token(Option<u32>, String),
    End(kvgpt_core::Result<(Generation, String)>),
}

/// Tokens as they are generated: each `next()` gives `{"id": …, "text": …}` (the text it makes
/// visible, possibly empty; a last `{"id": None, "text": …}` carries text held back to the end,
/// if any); then `result` holds what `generate` returns.
#[pyclass(module = "kvgpt")]
pub struct Stream {
    rx: Mutex<Receiver<Msg>>,
    result: Option<Py<PyDict>>,
    /// The generation raised an error (then there is no result).
    failed: bool,
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        if self.result.is_some() || self.failed {
            return Ok(None);
        }
        let msg = py.detach(|| self.rx.lock().ok().and_then(|rx| rx.recv().ok()));
        match msg {
            Some(Msg::Token(id, text)) => {
                let d = PyDict::new(py);
                d.set_item("id", id)?;
                d.set_item("text", text)?;
                Ok(Some(d))
            }
            Some(Msg::End(Ok((g, text)))) => {
                self.result = Some(result(py, &g, &text)?.unbind());
                Ok(None)
            }
            Some(Msg::End(Err(e))) => {
                self.failed = true; // the next `next()` stops
                Err(py_err(e))
            }
            None => Err(pyo3::exceptions::PyRuntimeError::new_err("the generation's thread ended without a result")),
        }
    }

    /// What `generate` returns, once the stream is exhausted (None before).
    #[getter]
    fn result<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyDict>> {
        self.result.as_ref().map(|r| r.bind(py).clone())
    }
}

/// The keywords `generate` and `stream` take, with their defaults.
const KEYWORDS: [&str; 10] = [
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "stop",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "ignore_eos",
];

/// `kw[key]` (None or missing: `default`), as `T`; a wrong type names the keyword.
fn kw<'py, T: FromPyObjectOwned<'py>>(kw: Option<&Bound<'py, PyDict>>, key: &str, default: T) -> PyResult<T> {
    match kw.map(|d| d.get_item(key)).transpose()?.flatten() {
        Some(v) if !v.is_none() => arg(&v, key),
        _ => Ok(default),
    }
}

impl Model {
    /// What `generate` and `stream` were asked for: the prompt and the keywords, checked. The
    /// sampler is the CLI's: greedy unless a temperature, top-k or top-p is given (then
    /// temperature 1 unless given), with the CLI's ranges.
    fn ask(&self, prompt: &Bound<'_, PyAny>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Ask> {
        if let Some(d) = kwargs {
            for k in d.keys() {
                let k: String = k.extract()?;
                if !KEYWORDS.contains(&k.as_str()) {
                    return Err(PyTypeError::new_err(format!(
                        "unexpected keyword {k:?}; generate and stream take {}",
                        KEYWORDS.join(", ")
                    )));
                }
            }
        }
        let max_tokens: usize = kw(kwargs, "max_tokens", 16)?;
        if max_tokens == 0 {
            return Err(PyValueError::new_err("max_tokens must be at least 1"));
        }
        let (temperature, top_k, top_p): (Option<f32>, Option<usize>, Option<f32>) =
            (kw(kwargs, "temperature", None)?, kw(kwargs, "top_k", None)?, kw(kwargs, "top_p", None)?);
        let sampling = Sampling {
            temperature: Sampling::temperature_of(temperature, top_k, top_p),
            top_k,
            top_p,
            seed: kw(kwargs, "seed", 0)?,
            repetition_penalty: kw(kwargs, "repetition_penalty", 1.0)?,
            presence_penalty: kw(kwargs, "presence_penalty", 0.0)?,
            frequency_penalty: kw(kwargs, "frequency_penalty", 0.0)?,
        };
        sampling.check().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let ids = ids_of(&self.e, prompt)?;
        kvgpt_core::generate::check_context(self.e.model(), ids.len(), max_tokens).map_err(py_err)?;
        let stop: Vec<String> = kw(kwargs, "stop", Vec::new())?;
        if stop.iter().any(String::is_empty) {
            return Err(PyValueError::new_err("a stop sequence is empty: give text, or leave it out"));
        }
        let ignore_eos: bool = kw(kwargs, "ignore_eos", false)?;
        let opts = GenerateOptions { max_new_tokens: max_tokens, sampling, stop_at_eos: !ignore_eos, use_cache: true };
        Ok(Ask { ids, opts, stop })
    }
}

fn spawn(e: Arc<Engine>, ask: Ask) -> Receiver<Msg> {
    // Unbounded: a stream kept but no longer read must not park one of the model's threads in
    // a send (the tokens it can hold are at most the context).
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let end = e.install(|l| {
            run(l, &ask, &mut |id, t| {
                // A stream dropped by its reader stops the generation.
                tx.send(Msg::Token(id, t.to_string())).is_ok()
            })
        });
        let _ = tx.send(Msg::End(end));
    });
    rx
}

#[pymethods]
impl Model {
    /// Generates after `prompt` (a text or token ids) as `kvgpt generate` does. Keywords:
    /// `max_tokens` (16), `temperature`, `top_k`, `top_p` (greedy unless one is given), `seed`
    /// (0), `stop` (sequences the text is cut before), `repetition_penalty`, `presence_penalty`,
    /// `frequency_penalty`, `ignore_eos`. Generation ends at the end-of-text token (unless
    /// `ignore_eos`), a stop sequence or `max_tokens`. Returns `{"text", "ids", "prompt_ids",
    /// "finish_reason"}`.
    #[pyo3(signature = (prompt, **kwargs))]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt: &Bound<'py, PyAny>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let ask = self.ask(prompt, kwargs)?;
        let (g, text) = self.e.run(py, |l| run(l, &ask, &mut |_, _| true))?;
        result(py, &g, &text)
    }

    /// As `generate` (the same keywords), token by token: an iterator of `{"id", "text"}`,
    /// computed in the model's threads while Python reads; its `result` is `generate`'s once it
    /// ends.
    #[pyo3(signature = (prompt, **kwargs))]
    fn stream(&self, prompt: &Bound<'_, PyAny>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Stream> {
        let ask = self.ask(prompt, kwargs)?;
        Ok(Stream { rx: Mutex::new(spawn(self.e.clone(), ask)), result: None, failed: false })
    }
}
