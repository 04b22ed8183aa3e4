//! A submitted request: what its answer is made of besides the choices' text.

use super::endpoint::Endpoint;
use super::request::Params;
use crate::engine::Events;
use std::sync::Arc;

/// A submitted request: prompt `i`, choice `j` is `seqs[i * n + j]`.
pub struct Job {
    pub ep: Endpoint,
    pub id: String,
    pub created: u64,
    /// The model's name, as responses carry it.
    pub model: String,
    pub params: Params,
    pub prompt_ids: Vec<Vec<u32>>,
    pub prompt_texts: Vec<String>,
    pub seqs: Vec<Events>,
}

impl Job {
    /// What every chunk of the answer shares, and each choice's events.
    pub fn split(self) -> (Arc<StreamHead>, Vec<Events>) {
        let Job { ep, id, created, model, params, prompt_ids, prompt_texts, seqs } = self;
        (Arc::new(StreamHead { ep, id, created, model, params, prompt_ids, prompt_texts }), seqs)
    }
}

/// A request's answer apart from its choices: its header, its parameters and its prompts.
pub struct StreamHead {
    pub ep: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub params: Params,
    pub prompt_ids: Vec<Vec<u32>>,
    pub prompt_texts: Vec<String>,
}
