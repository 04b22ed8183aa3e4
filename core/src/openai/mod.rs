//! The OpenAI API's shapes and rules, without any transport: request bodies parsed and checked
//! (`request`), prompts tokenized and fitted to the context and submitted to the engine
//! (`served`), and the answers — whole, or chunk by chunk — in the shapes the API gives them
//! (`response`, `endpoint`). The HTTP server (`kvgpt-serve`) and the Python package's
//! `create_completion` and `create_chat_completion` both answer through here, so the two give
//! the same fields from the same code (as mistral.rs's core holds its response types apart from
//! its server).

mod endpoint;
mod error;
mod job;
mod request;
mod response;
mod served;

pub use endpoint::Endpoint;
pub use error::{ApiError, ApiResult, Status};
pub use job::{Job, StreamHead};
pub use request::{
    chat, chat_template, completion, object, text_field, tokens_field, Message, Params, Prompt, MAX_LOGPROBS, MAX_N,
    MAX_STOP,
};
pub use response::{ChoiceChunks, Chunk};
pub use served::{Prepared, Served};

/// Seconds since the Unix epoch (a response's `created`).
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The name a model is served under unless given one: a local folder's or file's name (without
/// `.gguf`), a hub id as it is (the path is the server's, which clients need not see).
pub fn served_name(spec: &str) -> String {
    let path = std::path::Path::new(spec);
    if !path.exists() {
        return spec.to_string();
    }
    let name = if path.is_file() { path.file_stem() } else { path.file_name() };
    name.map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned())
}
