//! A request from its body to the engine: the model it names checked, its prompts tokenized as
//! the engine will see them (an empty prompt is `<|endoftext|>`, as in `kvgpt generate`), each
//! fitted to the context by OpenAI's rule, and every sequence (prompt × choice) submitted at
//! once.

use super::endpoint::Endpoint;
use super::error::{ApiError, ApiResult, Status};
use super::job::{Job, StreamHead};
use super::request::{Params, Prompt};
use crate::engine::{EngineHandle, Request, SubmitError};
use crate::sampler::Sampling;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// A model served through the API: its tokenizer, its names and its engine.
pub struct Served {
    pub tok: Arc<Tokenizer>,
    /// The name responses carry.
    pub name: String,
    /// Other names a request's `model` may give.
    pub aliases: Vec<String>,
    pub engine: EngineHandle,
}

/// A parsed request whose prompts are tokenized: `(ids, text)` each.
pub struct Prepared {
    pub params: Params,
    pub prompts: Vec<(Vec<u32>, String)>,
}

impl Served {
    pub fn n_positions(&self) -> usize {
        self.engine.model().config.n_positions
    }

    pub fn vocab(&self) -> usize {
        self.engine.model().config.vocab_size
    }

    /// Checks the model `params` names, and tokenizes its prompts.
    pub fn prepare(&self, mut params: Params) -> ApiResult<Prepared> {
        self.check_model(&params)?;
        let eos = self.engine.model().config.eos_token_id;
        let mut prompts = vec![];
        for p in std::mem::take(&mut params.prompts) {
            let (mut ids, text) = self.tokenize(p, params.prompt_param)?;
            if ids.is_empty() {
                ids.push(eos);
            }
            prompts.push((ids, text));
        }
        Ok(Prepared { params, prompts })
    }

    fn check_model(&self, params: &Params) -> ApiResult<()> {
        match &params.model {
            Some(m) if m != &self.name && !self.aliases.contains(m) => {
                let mut e = ApiError::new(
                    Status::NOT_FOUND,
                    "invalid_request_error",
                    "model_not_found",
                    format!("the model `{m}` does not exist here; this server serves `{}`", self.name),
                );
                e.param = Some("model".into());
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// A prompt's ids and text (the text given, or the ids' decoding). A text with more bytes than
    /// the context's tokens could hold is refused before it is encoded (its encoding's time grows
    /// with a long word's length squared: an 8 MB word took seconds of a core).
    fn tokenize(&self, p: Prompt, param: &str) -> ApiResult<(Vec<u32>, String)> {
        match p {
            Prompt::Text(t) if self.tok.fewest_tokens(&t) > self.n_positions() => {
                let (n, longest) = (self.n_positions(), self.tok.longest_token());
                let msg = format!(
                    "this model's maximum context length is {n} tokens, and `{param}` is {} bytes: at least {} \
                     tokens, since no token holds more than {longest} bytes: shorten it",
                    t.len(),
                    self.tok.fewest_tokens(&t),
                );
                Err(ApiError::bad(param, msg).with_code("context_length_exceeded"))
            }
            Prompt::Text(t) => Ok((self.tok.encode(&t).map_err(|e| ApiError::bad(param, e.to_string()))?, t)),
            Prompt::Ids(ids) => {
                self.check_ids(&ids, "prompt")?;
                let text = self.tok.decode(&ids);
                Ok((ids, text))
            }
        }
    }

    /// Token ids given in field `param` must be in the vocabulary.
    pub fn check_ids(&self, ids: &[u32], param: &str) -> ApiResult<()> {
        let vocab = self.vocab();
        match ids.iter().find(|&&i| i as usize >= vocab) {
            Some(&id) => Err(ApiError::bad(param, format!("token id {id} is outside the vocabulary of {vocab}"))),
            None => Ok(()),
        }
    }

    /// Checks every prompt against the context and submits the sequences (prompt `i`, choice
    /// `j` is `seqs[i * n + j]`); a submitted job is named by `id()` (a refused one uses no name).
    pub fn submit(&self, ep: Endpoint, p: Prepared, id: impl FnOnce() -> String) -> ApiResult<Job> {
        let Prepared { params, prompts } = p;
        let mut reqs = vec![];
        for (ids, _) in &prompts {
            let max_tokens = context(&params, ep, ids.len(), self.n_positions())?;
            for j in 0..params.n {
                reqs.push(Request {
                    prompt: ids.clone(),
                    max_new_tokens: max_tokens,
                    // Choice `j` samples with seed `seed + j`, so choices differ and each is reproducible.
                    sampling: Sampling { seed: params.sampling.seed.wrapping_add(j as u64), ..params.sampling },
                    stop_at_eos: !params.ignore_eos,
                    logprobs: params.logprobs,
                    speculative: params.speculative,
                });
            }
        }
        let seqs = self.engine.submit_all(reqs).map_err(submit_error)?;
        let (prompt_ids, prompt_texts) = prompts.into_iter().unzip();
        let created = super::now_secs();
        let head = StreamHead { ep, id: id(), created, model: self.name.clone(), params, prompt_ids, prompt_texts };
        Ok(Job { head, seqs })
    }
}

fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::Busy { .. } => {
            let mut err = ApiError::new(Status::SERVICE_UNAVAILABLE, "server_error", "queue_full", e.to_string());
            err.retry_after = Some(1);
            err
        }
        SubmitError::TooMany { .. } => ApiError::bad("n", e.to_string()),
        SubmitError::Invalid(e) => ApiError::bad("", e.to_string()),
        SubmitError::TooBig { .. } => ApiError::bad("max_tokens", e.to_string()),
        SubmitError::Stopped => {
            ApiError::new(Status::SERVICE_UNAVAILABLE, "server_error", "shutting_down", "the engine has stopped")
        }
    }
}

/// The completion tokens of a prompt of `len` tokens, by OpenAI's rule: stricter by one than
/// `generate`'s (which does not count the last token, never fed), prompt + max_tokens ≤ the
/// context length, as OpenAI clients expect. An error says what must shrink and by how much: the prompt, when it leaves no room for one
/// completion token; else the completion tokens asked for (or the default, when none were).
fn context(params: &Params, ep: Endpoint, len: usize, n_positions: usize) -> ApiResult<usize> {
    let room = n_positions.saturating_sub(len);
    let max_tokens = params.max_tokens.unwrap_or(ep.default_max_tokens(room));
    if max_tokens > 0 && len + max_tokens <= n_positions {
        return Ok(max_tokens);
    }
    let (prompt, limit) = (ep.prompt_param(), params.max_tokens_param);
    let head = format!("this model's maximum context length is {n_positions} tokens, prompt and completion together");
    let over = len + max_tokens.max(1) - n_positions;
    let (param, message) = if room == 0 {
        let (most, over) = (n_positions - 1, len + 1 - n_positions);
        let m = format!(
            "{head}, and the prompt alone is {len} tokens: shorten `{prompt}` by at least {over} tokens, to {most} \
             or fewer (a completion needs room for one token)"
        );
        (prompt, m)
    } else {
        // Shortening the prompt is advice only where it could be enough.
        let or = if over < len { format!(", or shorten `{prompt}` by {over} tokens") } else { String::new() };
        let m = if params.max_tokens.is_some() {
            format!(
                "{head}, but {len} prompt tokens + {max_tokens} completion tokens were asked for: lower `{limit}` \
                 to at most {room}{or}"
            )
        } else {
            format!(
                "{head}: the {len}-token prompt leaves room for {room} completion tokens, fewer than the default \
                 {max_tokens}: give `{limit}` of at most {room}{or}"
            )
        };
        (limit, m)
    };
    Err(ApiError::bad(param, message).with_code("context_length_exceeded"))
}
