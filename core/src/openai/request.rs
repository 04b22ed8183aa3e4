//! The OpenAI-compatible request bodies: parsed from JSON by hand, so that every wrong field gets
//! an OpenAI-style error naming it (`{"error": {"message", "type", "param", "code"}}`).

use super::error::{ApiError, ApiResult};
use crate::sampler::Sampling;
use serde_json::{Map, Value};

/// The prompt of a completion: text, or token ids.
#[derive(Clone, Debug)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// A parsed `/v1/completions` or `/v1/chat/completions` body.
#[derive(Clone, Debug)]
pub struct Params {
    pub model: Option<String>,
    pub prompts: Vec<Prompt>,
    /// The field that holds the prompts (`prompt`, or a chat's `messages`), as errors name it.
    pub prompt_param: &'static str,
    pub max_tokens: Option<usize>,
    /// The field that set (or would set) `max_tokens`, as errors name it.
    pub max_tokens_param: &'static str,
    /// The sampler of the first choice; choice `j` samples with seed `seed + j`.
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub echo: bool,
    /// Alternatives per token (completions: `logprobs: N`; chat: `top_logprobs` with `logprobs: true`).
    pub logprobs: Option<usize>,
    pub n: usize,
    pub ignore_eos: bool,
    /// kvgpt's `speculative`: decode with the server's draft (`--draft`), on by default; the
    /// answer is the same either way.
    pub speculative: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// kvgpt's `kvgpt.cache_diagnosis`: the usage's `prompt_cache` adds the text around where
    /// reuse stopped and a sentence saying it.
    pub cache_diagnosis: bool,
}

pub const MAX_N: usize = 16;
pub const MAX_LOGPROBS: usize = 20;
pub const MAX_STOP: usize = 4;

/// Parses a request body into a JSON object.
pub fn object(body: &[u8]) -> ApiResult<Map<String, Value>> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad("", format!("the body is not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad("", format!("the body must be a JSON object, got {}", kind(&other)))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A field, absent when missing or null.
fn field<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn int(m: &Map<String, Value>, key: &str, lo: i64, hi: i64) -> ApiResult<Option<i64>> {
    let Some(v) = field(m, key) else { return Ok(None) };
    let n = v.as_i64().filter(|_| v.is_i64() || v.is_u64()).ok_or_else(|| {
        ApiError::bad(key, format!("`{key}` must be an integer between {lo} and {hi}, got {}", kind(v)))
    })?;
    if n < lo || n > hi {
        return Err(ApiError::bad(key, format!("`{key}` must be between {lo} and {hi}, got {n}")));
    }
    Ok(Some(n))
}

/// A number (its range is the sampler's to check), as an f32.
fn num(m: &Map<String, Value>, key: &str) -> ApiResult<Option<f32>> {
    let Some(v) = field(m, key) else { return Ok(None) };
    let x = v.as_f64().ok_or_else(|| ApiError::bad(key, format!("`{key}` must be a number, got {}", kind(v))))?;
    Ok(Some(x as f32))
}

/// A share in (0, 1] (`top_p`), as the sampler holds it: a positive value too small for an f32
/// is the smallest positive f32, not a 0 the range refuses (`top_p` 1e-300 keeps the top token).
fn share(m: &Map<String, Value>, key: &str) -> ApiResult<Option<f32>> {
    let held = num(m, key)?;
    let sent = field(m, key).and_then(Value::as_f64).unwrap_or(0.0);
    Ok(held.map(|p| if p == 0.0 && sent > 0.0 { f32::from_bits(1) } else { p }))
}

/// A seed from the process's random hasher keys (std's per-instance random state), below 2^53:
/// a JSON number every reader holds exactly (JavaScript's and any double-based parser's largest
/// exact integer is 2^53 − 1), so a client can send it back as it came.
fn draw_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish() >> 11
}

/// Levenshtein distance: the fewest characters inserted, removed or replaced to turn `a` into `b`.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1).min(row[j] + 1).min(diag + usize::from(ca != cb));
            (diag, row[j + 1]) = (row[j + 1], next);
        }
    }
    row[b.len()]
}

/// The fields both endpoints take; `user` (OpenAI's end-user tag) and `cache_prompt` (llama.cpp's;
/// the prompt cache is always on) are accepted and change nothing.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "speculative",
    "user",
    "cache_prompt",
    "kvgpt",
];

/// Refuses a field neither endpoint nor `extra` knows, as OpenAI does: a misspelt `max_token`
/// must not silently leave the default in place.
/// The error names the closest of the endpoint's own fields and lists them (the fields routers
/// add, which are accepted too, are not a client's to send).
fn known_fields(m: &Map<String, Value>, extra: &[&str]) -> ApiResult<()> {
    let known = |k: &str| COMMON_FIELDS.contains(&k) || extra.contains(&k) || routers::FIELDS.contains(&k);
    if let Some(k) = m.keys().find(|k| !known(k)) {
        let mut own: Vec<&str> = COMMON_FIELDS.iter().chain(extra).copied().collect();
        own.sort_unstable();
        // A field can only be suggested within a third of its length: longer keys are not compared
        // (the distance costs both lengths multiplied; a key may be a megabyte long).
        let near = own.iter().filter(|f| f.len().abs_diff(k.len()) <= f.len().max(k.len()) / 3 && k.len() <= 64);
        let closest = near.map(|f| (edits(k, f), *f)).min().filter(|&(d, f)| d <= f.len().max(k.len()) / 3);
        let guess = closest.map_or(String::new(), |(_, f)| format!("did you mean `{f}`? "));
        let shown: String =
            if k.chars().count() > 64 { k.chars().take(64).chain(['…']).collect() } else { k.clone() };
        let all = own.join(", ");
        return Err(ApiError::bad(&shown, format!("unknown field `{shown}`; {guess}this endpoint takes {all}")));
    }
    Ok(())
}

/// The sampler the fields ask for, checked by the library's one rule ([`Sampling::check`]).
fn sampling(m: &Map<String, Value>) -> ApiResult<Sampling> {
    let s = Sampling {
        temperature: num(m, "temperature")?.unwrap_or(1.0),
        top_p: share(m, "top_p")?.filter(|&p| p != 1.0),
        // vLLM's convention: -1 (or 0) means no top-k.
        top_k: int(m, "top_k", -1, i64::from(u32::MAX))?.filter(|&k| k > 0).map(|k| k as usize),
        // No seed: one drawn for this request (reported in the response, so it can be repeated).
        seed: int(m, "seed", 0, i64::MAX)?.map_or_else(draw_seed, |s| s as u64),
        // HF's repetition penalty, as vLLM and TGI accept it beside the OpenAI fields.
        repetition_penalty: num(m, "repetition_penalty")?.unwrap_or(1.0),
        presence_penalty: num(m, "presence_penalty")?.unwrap_or(0.0),
        frequency_penalty: num(m, "frequency_penalty")?.unwrap_or(0.0),
    };
    s.check().map_err(|e| {
        // The value as the client sent it, not as an f32 holds it.
        let param = e.setting.param();
        let rule = match (e.rule.rsplit_once(", got "), field(m, param)) {
            (Some((rule, _)), Some(sent)) => format!("{rule}, got {sent}"),
            _ => e.rule,
        };
        ApiError::bad(param, format!("`{param}` {rule}"))
    })?;
    Ok(s)
}

fn boolean(m: &Map<String, Value>, key: &str) -> ApiResult<bool> {
    boolean_or(m, key, false)
}

fn boolean_or(m: &Map<String, Value>, key: &str, default: bool) -> ApiResult<bool> {
    match field(m, key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::bad(key, format!("`{key}` must be true or false, got {}", kind(v)))),
    }
}

fn ids(v: &Value, key: &str) -> ApiResult<Vec<u32>> {
    let arr = v.as_array().ok_or_else(|| ApiError::bad(key, format!("`{key}` must be token ids, got {}", kind(v))))?;
    arr.iter()
        .map(|x| {
            x.as_u64()
                .filter(|&n| n <= u32::MAX as u64)
                .map(|n| n as u32)
                .ok_or_else(|| ApiError::bad(key, format!("`{key}` holds {x}, which is not a token id")))
        })
        .collect()
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of lists of ids.
fn prompts(m: &Map<String, Value>) -> ApiResult<Vec<Prompt>> {
    let v = field(m, "prompt").ok_or_else(|| ApiError::bad("prompt", "`prompt` is required"))?;
    let err =
        || ApiError::bad("prompt", "`prompt` must be a string, a list of strings, token ids or lists of token ids");
    let out = match v {
        Value::String(s) => vec![Prompt::Text(s.clone())],
        Value::Array(a) if a.is_empty() => return Err(ApiError::bad("prompt", "`prompt` is an empty list")),
        Value::Array(a) if a[0].is_string() => a
            .iter()
            .map(|x| x.as_str().map(|s| Prompt::Text(s.to_string())).ok_or_else(err))
            .collect::<ApiResult<_>>()?,
        Value::Array(a) if a[0].is_number() => vec![Prompt::Ids(ids(v, "prompt")?)],
        Value::Array(a) if a[0].is_array() => {
            a.iter().map(|x| ids(x, "prompt").map(Prompt::Ids)).collect::<ApiResult<_>>()?
        }
        _ => return Err(err()),
    };
    if out.len() > MAX_N {
        return Err(ApiError::bad("prompt", format!("at most {MAX_N} prompts per request, got {}", out.len())));
    }
    Ok(out)
}

fn stop(m: &Map<String, Value>) -> ApiResult<Vec<String>> {
    let list = match field(m, "stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(|| ApiError::bad("stop", "`stop` must hold strings")))
            .collect::<ApiResult<_>>()?,
        Some(v) => {
            return Err(ApiError::bad("stop", format!("`stop` must be a string or a list of strings, got {}", kind(v))))
        }
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::bad("stop", format!("at most {MAX_STOP} stop sequences, got {}", list.len())));
    }
    if list.iter().any(|s| s.is_empty()) {
        return Err(ApiError::bad("stop", "a stop sequence is empty"));
    }
    Ok(list)
}

/// Fields both endpoints share.
fn common(
    m: &Map<String, Value>,
    (prompt_param, prompts): (&'static str, Vec<Prompt>),
    max_tokens_key: &'static str,
) -> ApiResult<Params> {
    let model = match field(m, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(ApiError::bad("model", format!("`model` must be a string, got {}", kind(v)))),
    };
    int(m, "best_of", 1, 1)?; // only the default
    routers::check(m)?;
    let stream_options = match field(m, "stream_options") {
        None => None,
        Some(Value::Object(o)) => Some(o),
        Some(v) => {
            return Err(ApiError::bad("stream_options", format!("`stream_options` must be an object, got {}", kind(v))))
        }
    };
    let stream = boolean(m, "stream")?;
    if stream_options.is_some() && !stream {
        return Err(ApiError::bad("stream_options", "`stream_options` is only allowed with `stream: true`"));
    }
    let include_usage = match stream_options {
        Some(o) => boolean(o, "include_usage").map_err(|mut e| {
            e.param = Some("stream_options.include_usage".into());
            e
        })?,
        None => false,
    };
    // Chat takes `max_completion_tokens`, or the older `max_tokens`; errors name the one given.
    let (max_tokens, max_tokens_param) = match int(m, max_tokens_key, 1, i64::from(u32::MAX))? {
        Some(n) => (Some(n as usize), max_tokens_key),
        None if max_tokens_key == "max_completion_tokens" => match int(m, "max_tokens", 1, i64::from(u32::MAX))? {
            Some(n) => (Some(n as usize), "max_tokens"),
            None => (None, max_tokens_key), // neither: errors name the current field
        },
        None => (None, max_tokens_key),
    };
    Ok(Params {
        model,
        prompts,
        prompt_param,
        max_tokens,
        max_tokens_param,
        sampling: sampling(m)?,
        stop: stop(m)?,
        echo: false,
        logprobs: None,
        n: int(m, "n", 1, MAX_N as i64)?.unwrap_or(1) as usize,
        ignore_eos: boolean(m, "ignore_eos")?,
        speculative: boolean_or(m, "speculative", true)?,
        stream,
        include_usage,
        cache_diagnosis: kvgpt_field::options(m)?,
    })
}

/// `/v1/completions`.
pub fn completion(m: &Map<String, Value>) -> ApiResult<Params> {
    known_fields(m, &["prompt", "echo", "logprobs"])?;
    let mut p = common(m, ("prompt", prompts(m)?), "max_tokens")?;
    p.echo = boolean(m, "echo")?;
    p.logprobs = int(m, "logprobs", 0, MAX_LOGPROBS as i64)?.map(|k| k as usize);
    if p.echo && p.logprobs.is_some() {
        return Err(ApiError::bad(
            "echo",
            "`echo` together with `logprobs` (prompt log-probabilities) is not supported",
        ));
    }
    Ok(p)
}

/// One chat message.
#[derive(Clone, Debug)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// `/v1/chat/completions`: the messages rendered with [`chat_template`].
pub fn chat(m: &Map<String, Value>) -> ApiResult<Params> {
    known_fields(m, &["messages", "max_completion_tokens", "logprobs", "top_logprobs"])?;
    let msgs = field(m, "messages").ok_or_else(|| ApiError::bad("messages", "`messages` is required"))?;
    let arr = msgs
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ApiError::bad("messages", "`messages` must be a non-empty list of {role, content}"))?;
    let mut messages = vec![];
    for (i, msg) in arr.iter().enumerate() {
        let param = format!("messages[{i}]");
        let o = msg.as_object().ok_or_else(|| ApiError::bad(&param, format!("{param} must be an object")))?;
        let role = o.get("role").and_then(Value::as_str).unwrap_or_default();
        let got = match o.get("role") {
            Some(Value::String(r)) => format!("{r:?}"),
            Some(v) => kind(v).to_string(),
            None => "nothing".to_string(),
        };
        if !crate::chat::ROLES.contains(&role) {
            return Err(ApiError::bad(
                &format!("{param}.role"),
                format!("{param}.role must be system, developer, user or assistant, got {got}"),
            ));
        }
        let content = match o.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => Ok(t.to_string()),
                    _ => Err(ApiError::bad(&format!("{param}.content"), "only text content parts are supported")),
                })
                .collect::<ApiResult<Vec<_>>>()?
                .join(""),
            _ => return Err(ApiError::bad(&format!("{param}.content"), format!("{param}.content must be a string"))),
        };
        messages.push(Message { role: role.to_string(), content });
    }
    let mut p = common(m, ("messages", vec![Prompt::Text(chat_template(&messages))]), "max_completion_tokens")?;
    if boolean(m, "logprobs")? {
        p.logprobs = Some(int(m, "top_logprobs", 0, MAX_LOGPROBS as i64)?.unwrap_or(0) as usize);
    } else if field(m, "top_logprobs").is_some() {
        return Err(ApiError::bad("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
    }
    p.stop.insert(0, CHAT_STOP.to_string());
    Ok(p)
}

use crate::chat::CHAT_STOP;

/// The chat template (`crate::chat::template`, documented in README.md) over the messages.
pub fn chat_template(messages: &[Message]) -> String {
    crate::chat::template(messages.iter().map(|m| (m.role.as_str(), m.content.as_str())))
}

/// `/tokenize`: `{"content": text}` (llama.cpp) or `{"prompt": text}`.
pub fn text_field(m: &Map<String, Value>) -> ApiResult<String> {
    match field(m, "content").or_else(|| field(m, "prompt")) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(ApiError::bad("content", format!("`content` must be a string, got {}", kind(v)))),
        None => Err(ApiError::bad("content", "`content` is required")),
    }
}

/// `/detokenize`: `{"tokens": [ids]}`.
pub fn tokens_field(m: &Map<String, Value>) -> ApiResult<Vec<u32>> {
    ids(field(m, "tokens").ok_or_else(|| ApiError::bad("tokens", "`tokens` is required"))?, "tokens")
}

mod kvgpt_field;
mod routers;

#[cfg(test)]
mod tests;
