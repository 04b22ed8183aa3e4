//! The `kvgpt` object of a request body: kvgpt's own options, where OpenAI's fields have no name.

use super::{boolean, field, kind, ApiError, ApiResult};
use serde_json::{Map, Value};

/// The keys of the `kvgpt` object (kvgpt's own options, where OpenAI's fields have no name).
const KVGPT_FIELDS: &[&str] = &["cache_diagnosis"];

/// The `kvgpt` object's options: `cache_diagnosis`.
pub(super) fn options(m: &Map<String, Value>) -> ApiResult<bool> {
    let o = match field(m, "kvgpt") {
        None => return Ok(false),
        Some(Value::Object(o)) => o,
        Some(v) => return Err(ApiError::bad("kvgpt", format!("`kvgpt` must be an object, got {}", kind(v)))),
    };
    if let Some(k) = o.keys().find(|k| !KVGPT_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad(
            &format!("kvgpt.{k}"),
            format!("unknown field `kvgpt.{k}`; `kvgpt` takes {}", KVGPT_FIELDS.join(", ")),
        ));
    }
    boolean(o, "cache_diagnosis").map_err(|mut e| {
        e.param = Some("kvgpt.cache_diagnosis".into());
        e
    })
}
