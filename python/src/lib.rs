//! `kvgpt` for Python: the engine behind the CLI, as a module built by maturin over pyo3 and the
//! numpy crate. Everything computes with the GIL released, inside the model's own thread pool;
//! tensors reach numpy without a copy where kvgpt already holds them in their shape (recorded
//! taps, logits), and errors become Python exceptions carrying kvgpt's message.

mod generate;
mod hooks;
mod kv;
mod model;
mod view;

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A kvgpt error as the Python exception that fits it: a missing model is `FileNotFoundError`,
/// a bad argument `ValueError` (a prompt past the context, a token id outside the vocabulary),
/// anything else `RuntimeError`; each with kvgpt's own message.
pub(crate) fn py_err(e: kvgpt::Error) -> PyErr {
    use kvgpt::Error as E;
    let msg = e.to_string();
    match e {
        E::MissingFile { .. } | E::NotAFile { .. } | E::NotCached { .. } | E::NotAModel { .. } => {
            PyFileNotFoundError::new_err(msg)
        }
        E::Io { .. } | E::Write { .. } => PyOSError::new_err(msg),
        E::ContextOverflow { .. } | E::CacheOverflow { .. } | E::BadTokenId { .. } | E::Invalid(_) => {
            PyValueError::new_err(msg)
        }
        _ => PyRuntimeError::new_err(msg),
    }
}

/// The prompt kvgpt's chat template makes of OpenAI-style messages (`{"role", "content"}`;
/// roles system, developer, user, assistant), as the server's chat endpoint renders them.
#[pyfunction]
fn chat_template(messages: Vec<std::collections::HashMap<String, String>>) -> PyResult<String> {
    let mut pairs = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let (Some(role), Some(content)) = (m.get("role"), m.get("content")) else {
            return Err(PyValueError::new_err(format!("message {i} needs a \"role\" and a \"content\"")));
        };
        if !["system", "developer", "user", "assistant"].contains(&role.as_str()) {
            return Err(PyValueError::new_err(format!(
                "message {i} has role {role:?}; kvgpt's template takes system, developer, user and assistant"
            )));
        }
        pairs.push((role.as_str(), content.as_str()));
    }
    Ok(kvgpt::chat::template(pairs.into_iter()))
}

#[pymodule]
fn _kvgpt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(model::load, m)?)?;
    m.add_function(wrap_pyfunction!(chat_template, m)?)?;
    m.add_class::<model::Model>()?;
    m.add_class::<kv::KvCache>()?;
    m.add_class::<generate::Stream>()?;
    m.add_class::<view::AttentionView>()?;
    Ok(())
}
