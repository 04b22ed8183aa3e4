//! A submitted request: what its answer is made of besides the choices' text, and the choices'
//! events.

use super::endpoint::Endpoint;
use super::request::Params;
use crate::engine::Events;
use std::sync::Arc;

/// A submitted request: prompt `i`, choice `j` is `seqs[i * n + j]`.
pub struct Job {
    pub head: StreamHead,
    pub seqs: Vec<Events>,
}

impl Job {
    /// What every chunk of the answer shares, and each choice's events.
    pub fn split(self) -> (Arc<StreamHead>, Vec<Events>) {
        (Arc::new(self.head), self.seqs)
    }
}

/// A request's answer apart from its choices: its header, its parameters and its prompts.
pub struct StreamHead {
    pub ep: Endpoint,
    pub id: String,
    /// When it was submitted.
    pub created: u64,
    /// The model's name, as responses carry it.
    pub model: String,
    pub params: Params,
    pub prompt_ids: Vec<Vec<u32>>,
    pub prompt_texts: Vec<String>,
}
