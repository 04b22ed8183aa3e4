//! The two OpenAI endpoints, `/v1/completions` and `/v1/chat/completions`: what differs between
//! them lives here, as methods of [`Endpoint`], and nowhere else.

use super::error::ApiResult;
use super::request::{self as api, Params};
use crate::logprobs::TokenLogprob;
use crate::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    /// Parses the endpoint's request body.
    pub fn params(self, body: &Map<String, Value>) -> ApiResult<Params> {
        match self {
            Endpoint::Completions => api::completion(body),
            Endpoint::Chat => api::chat(body),
        }
    }

    /// Completion tokens when the request gives no limit: OpenAI's 16 for completions, the rest
    /// of the context for chat.
    pub fn default_max_tokens(self, room: usize) -> usize {
        match self {
            Endpoint::Completions => 16,
            Endpoint::Chat => room,
        }
    }

    /// The field that holds the prompt, as errors name it.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Completions => "prompt",
            Endpoint::Chat => "messages",
        }
    }

    /// The prefix of response ids.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        }
    }

    /// The `object` of a whole response.
    pub fn object(self) -> &'static str {
        match self {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        }
    }

    /// The `object` of a streamed chunk.
    pub fn chunk_object(self) -> &'static str {
        match self {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        }
    }

    /// A choice of a whole response.
    pub fn choice(self, k: usize, text: &str, logprobs: Option<Value>, finish: &str) -> Value {
        match self {
            Endpoint::Completions => json!({"index": k, "text": text, "logprobs": logprobs, "finish_reason": finish}),
            Endpoint::Chat => json!({
                "index": k,
                "message": {"role": "assistant", "content": text.trim_start()},
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }

    /// A choice of a streamed chunk, carrying `delta` (see [`Endpoint::delta`]).
    pub fn chunk_choice(self, k: usize, delta: Value, logprobs: Value, finish: Value) -> Value {
        match self {
            Endpoint::Completions => json!({"index": k, "text": delta, "logprobs": logprobs, "finish_reason": finish}),
            Endpoint::Chat => json!({"index": k, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
        }
    }

    /// A chunk's new text (empty for the closing chunk).
    pub fn delta(self, text: &str) -> Value {
        match (self, text.is_empty()) {
            (Endpoint::Completions, _) => json!(text),
            (Endpoint::Chat, true) => json!({}),
            (Endpoint::Chat, false) => json!({"content": text}),
        }
    }

    /// The chunk a stream opens each choice with, if any (chat: the assistant's role).
    pub fn opening(self) -> Option<Value> {
        (self == Endpoint::Chat).then(|| json!({"role": "assistant", "content": ""}))
    }

    /// Whether the answer's leading white space is dropped (the chat template ends with
    /// "Assistant:"; the space after it is not content).
    pub fn trims_start(self) -> bool {
        self == Endpoint::Chat
    }

    /// One choice's logprobs in the endpoint's format, for the tokens of one delta; `offset` is
    /// the first token's byte offset in the choice's text.
    pub fn logprobs(self, tok: &Tokenizer, tokens: &[(u32, TokenLogprob)], offset: usize) -> Value {
        match self {
            Endpoint::Completions => {
                let mut off = offset;
                let mut offsets = vec![];
                for (id, _) in tokens {
                    offsets.push(off);
                    off += tok.token_text(*id).len();
                }
                json!({
                    "tokens": tokens.iter().map(|(id, _)| tok.token_label(*id)).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|(_, l)| l.logprob).collect::<Vec<_>>(),
                    "top_logprobs": tokens.iter().map(|(_, l)| {
                        l.top.iter().map(|(i, lp)| (tok.token_label(*i), json!(lp))).collect::<Map<_, _>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                    "token_ids": tokens.iter().map(|(id, _)| id).collect::<Vec<_>>(),
                })
            }
            Endpoint::Chat => {
                let entry = |id: u32, lp: f64| json!({"token": tok.token_label(id), "logprob": lp, "bytes": tok.token_bytes(id)});
                json!({"content": tokens.iter().map(|(id, l)| {
                    let mut e = entry(*id, l.logprob);
                    e["top_logprobs"] = l.top.iter().map(|(i, lp)| entry(*i, *lp)).collect();
                    e
                }).collect::<Vec<_>>()})
            }
        }
    }
}
