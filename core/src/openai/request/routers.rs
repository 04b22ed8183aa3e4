//! Fields that the routers people put in front of servers add to every request they forward:
//! vllm-router and sglang-router parse a body into SGLang's request types and send it on
//! re-serialized, with their defaults filled in. Each is accepted at the value that means what
//! kvgpt does anyway, and refused, naming what kvgpt does instead, at any other: a client that
//! asks for something kvgpt cannot do is told so, not silently served something else.

use super::{boolean, field, int, ApiError, ApiResult};
use serde_json::{Map, Value};

/// The fields, for the list of fields an endpoint takes.
pub const FIELDS: &[&str] = &[
    "no_stop_trim",
    "skip_special_tokens",
    "return_hidden_states",
    "continue_final_message",
    "separate_reasoning",
    "stream_reasoning",
    "include_reasoning",
    "data_parallel_rank",
];

/// The one value each boolean field may take, and why.
const FIXED: &[(&str, bool, &str)] = &[
    ("no_stop_trim", false, "kvgpt always cuts a stop sequence out of the text"),
    ("skip_special_tokens", true, "kvgpt never writes <|endoftext|> into the text"),
    ("return_hidden_states", false, "hidden states are not sent over HTTP; `kvgpt inspect` exports them"),
    ("continue_final_message", false, "the chat template always starts a new `Assistant:` turn"),
];

/// Reasoning fields: GPT-2 writes no separate reasoning, so either value changes nothing.
const NO_EFFECT: &[&str] = &["separate_reasoning", "stream_reasoning", "include_reasoning"];

pub fn check(m: &Map<String, Value>) -> ApiResult<()> {
    for &(key, value, why) in FIXED {
        if field(m, key).is_some() && boolean(m, key)? != value {
            return Err(ApiError::bad(key, format!("`{key}` can only be {value} here: {why}")));
        }
    }
    for key in NO_EFFECT {
        boolean(m, key)?;
    }
    // sglang-router --dp-aware names the data-parallel rank; kvgpt is one.
    int(m, "data_parallel_rank", 0, 0)?;
    Ok(())
}
