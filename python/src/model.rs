//! `kvgpt.load` and the `Model` it returns: tokens in and out, and the loss of a text.

use crate::errors::{arg, py_err};
use kvgpt_core::engine::{self, EngineConfig, NoMonitor};
use kvgpt_core::openai::Served;
use kvgpt_core::{KvSpec, KvType, LoadSpec, Loaded, ModelFiles, Scratch, Tap, Tokenizer, WeightType};
use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::{Arc, Mutex, OnceLock};

/// A loaded model and the threads that run it, shared by everything made from it.
pub(crate) struct Engine {
    pub(crate) model: Arc<kvgpt_core::Model>,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) files: ModelFiles,
    /// The name completions answer with: the server's for this model, decided at load.
    served_name: String,
    pool: rayon::ThreadPool,
    /// The serving engine the OpenAI-shaped completions run in (batched with each other),
    /// started on the first one; `starting` lets one thread start it.
    served: OnceLock<Served>,
    starting: Mutex<()>,
}

/// Sequences the completions run at once, and wait for a slot.
const PARALLEL: usize = 8;
const MAX_QUEUE: usize = 256;
/// The completions' prompt cache.
const CACHE_BYTES: usize = 64 << 20;

impl Engine {
    fn new(loaded: Loaded, pool: rayon::ThreadPool) -> Engine {
        let Loaded { model, tokenizer, files } = loaded;
        let (model, tokenizer) = (Arc::new(model), Arc::new(tokenizer));
        let served_name = kvgpt_core::openai::served_name(&files.name);
        Engine { model, tokenizer, files, served_name, pool, served: OnceLock::new(), starting: Mutex::new(()) }
    }

    /// Runs `f` in the model's pool with the GIL released.
    pub(crate) fn run<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Engine) -> kvgpt_core::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| self.install(f)).map_err(py_err)
    }

    /// Runs `f` in the model's pool (from a thread that holds no GIL).
    pub(crate) fn install<T: Send>(&self, f: impl FnOnce(&Engine) -> T + Send) -> T {
        self.pool.install(|| f(self))
    }

    pub(crate) fn model(&self) -> &kvgpt_core::Model {
        &self.model
    }

    /// The serving engine, started on its own thread (and its own pool of the model's size) the
    /// first time it is asked for; the name it answers with is the server's for this model.
    pub(crate) fn served(&self) -> PyResult<&Served> {
        if let Some(s) = self.served.get() {
            return Ok(s);
        }
        let _one = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = self.served.get() {
            return Ok(s); // another thread started it meanwhile
        }
        let threads = self.pool.current_num_threads();
        let pool = kvgpt_core::threads::pool(Some(threads), "kvgpt-serving").map_err(py_err)?;
        let cfg = EngineConfig {
            parallel: PARALLEL,
            batch_tokens: 256,
            cache_bytes: CACHE_BYTES,
            max_queue: MAX_QUEUE,
            draft: None,
            kv_events: false,
            kv_bytes: None,
            store: None,
        };
        let spawned = engine::spawn(self.model.clone(), cfg, Box::new(NoMonitor), Some(pool))
            .map_err(|e| PyRuntimeError::new_err(format!("the engine could not start: {e}")))?;
        let served = Served {
            tok: self.tokenizer.clone(),
            name: self.served_name.clone(),
            aliases: vec!["kvgpt".into(), self.files.name.clone()],
            engine: spawned.handle,
        };
        Ok(self.served.get_or_init(|| served))
    }

    /// One forward pass over `ids` from an empty cache, observed by `tap`: the logits of its last
    /// `rows` positions (`[rows, V]`), and the tap.
    pub(crate) fn tapped<T: Tap + Send>(
        &self,
        py: Python<'_>,
        ids: &[u32],
        mut tap: T,
        rows: usize,
    ) -> PyResult<(Vec<f32>, T)> {
        kvgpt_core::generate::check_context(self.model(), ids.len(), 0).map_err(py_err)?;
        self.run(py, |l| {
            let cfg = &l.model.config;
            let mut cache = l.model.new_cache(ids.len());
            let mut scratch = Scratch::new(cfg, ids.len());
            let mut logits = vec![0.0f32; rows * cfg.vocab_size];
            l.model.forward(ids, &mut cache, &mut scratch, &mut tap, &mut logits)?;
            Ok((logits, tap))
        })
    }
}

/// A GPT-2 loaded by kvgpt: immutable, shared by the caches and streams made from it.
#[pyclass(frozen, module = "kvgpt")]
pub struct Model {
    pub(crate) e: Arc<Engine>,
}

/// The input of most methods: a text, or token ids (not bytes).
pub(crate) fn ids_of(e: &Engine, input: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if let Ok(text) = input.extract::<String>() {
        if text.is_empty() {
            return Err(PyValueError::new_err("the text is empty: give at least one character"));
        }
        return input.py().detach(|| e.tokenizer.encode(&text)).map_err(py_err);
    }
    if input.is_instance_of::<pyo3::types::PyBytes>() || input.is_instance_of::<pyo3::types::PyByteArray>() {
        return Err(PyTypeError::new_err("expected a str or a list of token ids, got bytes: decode it to a str first"));
    }
    match token_ids(e, input) {
        Ok(ids) if !ids.is_empty() => Ok(ids),
        Ok(_) => Err(PyValueError::new_err("the token ids are empty: give at least one")),
        Err(e) if e.is_instance_of::<PyValueError>(input.py()) => Err(e),
        Err(_) => Err(PyTypeError::new_err(format!(
            "expected a str or a list of token ids, got {}",
            input.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "an object".into())
        ))),
    }
}

/// A list of token ids: an int that cannot be an id (negative, or past u32) is a `ValueError`
/// as one past the vocabulary is; what is not a list of ints a `TypeError`.
fn token_ids(e: &Engine, input: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let vocab = e.model().config.vocab_size;
    let ids = input.extract::<Vec<u32>>().map_err(|err| match err.is_instance_of::<PyOverflowError>(input.py()) {
        true => {
            PyValueError::new_err(format!("{input} holds an int that is no token id: ids go from 0 to {}", vocab - 1))
        }
        false => PyTypeError::new_err(format!("expected a list of token ids: {err}")),
    })?;
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(&id) => Err(py_err(kvgpt_core::Error::BadTokenId { id, vocab })),
        None => Ok(ids),
    }
}

/// The `--dtype` names kvgpt can convert to.
fn weight_type(name: &str) -> PyResult<WeightType> {
    WeightType::ALL.into_iter().find(|t| t.name() == name).ok_or_else(|| {
        let names: Vec<&str> = WeightType::ALL.iter().map(|t| t.name()).collect();
        PyValueError::new_err(format!(
            "dtype {name:?} is not one kvgpt holds weights as; choose one of {}",
            names.join(", ")
        ))
    })
}

/// Loads a model folder, a GGUF file or a Hugging Face Hub id, as `kvgpt --model` finds them.
/// `dtype` converts the weight matrices (default: as the file stores them; f32 from
/// safetensors); `threads` sizes the model's thread pool (default: one per core); `offline`
/// uses only the local Hugging Face cache; `kv_block_size` is `--kv-block-size` (positions per
/// K/V block; the same bits for every size) and `kv_dtype` `--kv-dtype` (f32, f16, bf16, q8_0).
#[pyfunction]
#[pyo3(signature = (model, dtype=None, threads=None, offline=false, kv_block_size=None, kv_dtype=None))]
pub fn load(
    py: Python<'_>,
    model: &str,
    dtype: Option<&str>,
    threads: Option<Bound<'_, PyAny>>,
    offline: bool,
    kv_block_size: Option<Bound<'_, PyAny>>,
    kv_dtype: Option<&str>,
) -> PyResult<Model> {
    let dtype = dtype.map(weight_type).transpose()?;
    let threads: Option<usize> = threads.map(|t| arg(&t, "threads")).transpose()?;
    let block: Option<usize> = kv_block_size.map(|b| arg(&b, "kv_block_size")).transpose()?;
    let kv = block.map(KvSpec::new).transpose().map_err(py_err)?.unwrap_or_default();
    let kv = match kv_dtype {
        None => kv,
        Some(name) => kv.with_type(KvType::by_name(name).ok_or_else(|| {
            let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
            PyValueError::new_err(format!("kv_dtype {name:?} is not a K/V type; choose one of {}", names.join(", ")))
        })?),
    };
    let pool = kvgpt_core::threads::pool(threads, "kvgpt-kernel").map_err(py_err)?;
    let spec = LoadSpec { model: model.to_string(), offline, dtype, isa: None, kv };
    let loaded = py
        .detach(|| {
            pool.install(|| {
                spec.load(&mut |note| {
                    use std::io::Write as _;
                    let _ = writeln!(std::io::stderr(), "{note}");
                })
            })
        })
        .map_err(py_err)?;
    Ok(Model { e: Arc::new(Engine::new(loaded, pool)) })
}

#[pymethods]
impl Model {
    /// The model's text and token ids.
    fn tokenize(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        py.detach(|| self.e.tokenizer.encode(text)).map_err(py_err)
    }

    /// Text of token ids (bytes that are not whole characters become U+FFFD).
    fn detokenize(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids = token_ids(&self.e, ids)?;
        Ok(py.detach(|| self.e.tokenizer.decode(&ids)))
    }

    /// The config: layers, heads, widths, context, vocabulary, and how the weights are held.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (m, d) = (self.e.model(), PyDict::new(py));
        let c = &m.config;
        d.set_item("name", &self.e.files.name)?;
        d.set_item("n_layer", c.n_layer)?;
        d.set_item("n_head", c.n_head)?;
        d.set_item("n_embd", c.n_embd)?;
        d.set_item("d_head", c.head_dim())?;
        d.set_item("n_inner", c.n_inner)?;
        d.set_item("n_positions", c.n_positions)?;
        d.set_item("vocab_size", c.vocab_size)?;
        d.set_item("eos_token_id", c.eos_token_id)?;
        d.set_item("dtype", m.weights_dtype())?;
        d.set_item("isa", m.isa().name())?;
        d.set_item("kv_block_size", m.kv().block())?;
        d.set_item("kv_dtype", m.kv().kv_type().name())?;
        d.set_item("threads", self.e.pool.current_num_threads())?;
        Ok(d)
    }

    /// The mean loss of predicting each token of `text` from the ones before it (the first has
    /// no prediction), its perplexity, and every token's surprisal in nats, as `kvgpt score`
    /// computes them (windows of the whole context, stride half of it).
    fn score<'py>(&self, py: Python<'py>, text: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let ids = ids_of(&self.e, text)?;
        if ids.len() < 2 {
            return Err(PyValueError::new_err("score needs at least two tokens: the first has nothing before it"));
        }
        let n = self.e.model().config.n_positions;
        let s = self.e.run(py, |l| kvgpt_views::score::score(&l.model, &ids, n, n / 2))?;
        let d = PyDict::new(py);
        d.set_item("loss", s.mean_loss)?;
        d.set_item("perplexity", s.perplexity)?;
        d.set_item("ids", &ids)?;
        let surprisal: Vec<f64> = s.tokens.iter().map(|t| t.surprisal).collect();
        d.set_item("surprisal", PyList::new(py, surprisal)?)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let m = self.e.model();
        format!("<kvgpt.Model {} ({} layers, {})>", self.e.files.name, m.config.n_layer, m.weights_dtype())
    }
}
