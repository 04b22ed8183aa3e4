//! `kvgpt` for Python: the engine behind the CLI, as a module built by maturin over pyo3 and the
//! numpy crate. Everything computes with the GIL released, inside the model's own thread pool;
//! tensors reach numpy without a copy where kvgpt already holds them in their shape (recorded
//! taps, logits), and errors become Python exceptions carrying kvgpt's message.

#![forbid(unsafe_code)]

mod complete;
mod errors;
mod generate;
mod hooks;
mod kv;
mod model;
mod view;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The prompt kvgpt's chat template makes of OpenAI-style messages (`{"role", "content"}`;
/// roles system, developer, user, assistant), as the server's chat endpoint renders them.
#[pyfunction]
fn chat_template(messages: Vec<std::collections::HashMap<String, String>>) -> PyResult<String> {
    let mut pairs = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let (Some(role), Some(content)) = (m.get("role"), m.get("content")) else {
            return Err(PyValueError::new_err(format!("message {i} needs a \"role\" and a \"content\"")));
        };
        if !kvgpt_core::chat::ROLES.contains(&role.as_str()) {
            return Err(PyValueError::new_err(format!(
                "message {i} has role {role:?}; kvgpt's template takes system, developer, user and assistant"
            )));
        }
        pairs.push((role.as_str(), content.as_str()));
    }
    Ok(kvgpt_core::chat::template(pairs.into_iter()))
}

#[pymodule]
fn _kvgpt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(model::load, m)?)?;
    m.add_function(wrap_pyfunction!(chat_template, m)?)?;
    m.add("CHAT_STOP", kvgpt_core::chat::CHAT_STOP)?;
    m.add_class::<model::Model>()?;
    m.add_class::<kv::KvCache>()?;
    m.add_class::<generate::Stream>()?;
    m.add_class::<complete::Chunks>()?;
    m.add_class::<view::AttentionView>()?;
    Ok(())
}
