//! `Model.kv_cache`: the lesson of the KV cache in code. A prompt is prefilled once; each
//! `step(token)` computes only that token's Q, K and V and reads the cached history.

use crate::errors::py_err;
use crate::model::{ids_of, Engine, Model};
use kvgpt_core::{KvPart, Sampling, Scratch, Sequence};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

/// The sequence (its ids, its KV cache, the logits of its last position) and the forward's
/// buffers.
struct State {
    seq: Sequence,
    scratch: Scratch,
}

/// A sequence's K and V, layer by layer, as kvgpt holds them while it decodes.
#[pyclass(frozen, module = "kvgpt")]
pub struct KvCache {
    e: Arc<Engine>,
    s: Mutex<State>,
}

impl KvCache {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.s.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Feeds `new` after what the cache holds; the last position's logits are kept. The state
    /// is locked only once the GIL is released, so a thread reading it while holding the GIL
    /// cannot wait on a feed that waits for the GIL.
    fn feed(&self, py: Python<'_>, new: &[u32]) -> PyResult<()> {
        let cfg = &self.e.model().config;
        let n = cfg.n_positions;
        py.detach(|| {
            let mut s = self.state();
            let held = s.seq.ids().len();
            if held + new.len() > n {
                return Err(PyValueError::new_err(format!(
                    "the cache is full: it holds {held} of the model's {n} positions, and {} more do not fit",
                    new.len()
                )));
            }
            let State { seq, scratch } = &mut *s;
            self.e
                .install(|l| {
                    seq.append_prompt(new)?;
                    let fed = seq.feed(&l.model, scratch);
                    if fed.is_err() {
                        seq.truncate(held); // nothing of a failed feed stays
                    }
                    fed
                })
                .map_err(py_err)
        })
    }

    fn part<'py>(&self, py: Python<'py>, layer: usize, part: KvPart) -> PyResult<Bound<'py, PyAny>> {
        let cfg = &self.e.model().config;
        if layer >= cfg.n_layer {
            return Err(PyIndexError::new_err(format!("layer {layer}: the model has layers 0 to {}", cfg.n_layer - 1)));
        }
        let s = self.state();
        let cache = s.seq.cache();
        let data = cache.gather(layer, part);
        Ok(PyArray1::from_vec(py, data).reshape([cfg.n_head, cache.len(), cfg.head_dim()])?.into_any())
    }
}

#[pymethods]
impl KvCache {
    /// Positions held.
    #[getter]
    fn length(&self) -> usize {
        self.state().seq.cache().len()
    }

    fn __len__(&self) -> usize {
        self.length()
    }

    /// The ids whose K and V are held.
    #[getter]
    fn ids(&self) -> Vec<u32> {
        self.state().seq.ids().to_vec()
    }

    /// The logits after the last position fed, `[V]`.
    #[getter]
    fn logits<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        PyArray1::from_slice(py, self.state().seq.logits())
    }

    /// Layer `layer`'s keys, `[NH, length, HS]` (as Hugging Face's `past_key_values` hold them,
    /// without the batch): a copy of what the cache holds now.
    fn k<'py>(&self, py: Python<'py>, layer: usize) -> PyResult<Bound<'py, PyAny>> {
        self.part(py, layer, KvPart::K)
    }

    /// Layer `layer`'s values, `[NH, length, HS]`.
    fn v<'py>(&self, py: Python<'py>, layer: usize) -> PyResult<Bound<'py, PyAny>> {
        self.part(py, layer, KvPart::V)
    }

    /// Decodes one token (an id, or a text of one token): its Q, K and V are computed, its K and
    /// V appended, and it attends over every cached position. Returns its logits, `[V]`.
    fn step<'py>(&self, py: Python<'py>, token: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let ids = if token.is_instance_of::<pyo3::types::PyInt>() {
            let vocab = self.e.model().config.vocab_size;
            match token.extract::<i64>() {
                Ok(id) if (0..vocab as i64).contains(&id) => vec![id as u32],
                _ => return Err(PyValueError::new_err(format!("token {token}: ids go from 0 to {}", vocab - 1))),
            }
        } else {
            ids_of(&self.e, token)?
        };
        if ids.len() != 1 {
            return Err(PyValueError::new_err(format!(
                "step takes one token; this is {} ({ids:?}): feed them one at a time",
                ids.len()
            )));
        }
        self.feed(py, &ids)?;
        Ok(self.logits(py))
    }

    fn __repr__(&self) -> String {
        let s = self.state();
        let cfg = &self.e.model().config;
        format!(
            "<kvgpt.KvCache {} positions × {} layers × 2 × {} floats>",
            s.seq.cache().len(),
            cfg.n_layer,
            cfg.n_embd
        )
    }
}

#[pymethods]
impl Model {
    /// A KV cache holding `input` (a text or token ids), prefilled in one forward pass.
    fn kv_cache(&self, py: Python<'_>, input: &Bound<'_, PyAny>) -> PyResult<KvCache> {
        let ids = ids_of(&self.e, input)?;
        let cfg = &self.e.model().config;
        let state = State {
            seq: Sequence::open(self.e.model(), Sampling::GREEDY),
            scratch: Scratch::new(cfg, kvgpt_core::model::CHUNK_ROWS.min(cfg.n_positions)),
        };
        let kv = KvCache { e: self.e.clone(), s: Mutex::new(state) };
        kv.feed(py, &ids)?;
        Ok(kv)
    }
}
