//! One error type for the library: every variant says what was wrong and what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // `err`, not `source`: the message already holds it, so an error chain does not repeat it.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },

    #[error("{path} not found; {hint}")]
    MissingFile { path: PathBuf, hint: String },

    #[error("{file}: tensor `{name}` is missing (looked for it with and without the `transformer.` prefix)")]
    MissingTensor { name: String, file: PathBuf },

    #[error(
        "{file}: tensor `{name}` has shape {got:?}, but config.json ({keys}) makes it {want:?}; \
         use the config.json that belongs to these weights"
    )]
    WrongShape { name: String, file: PathBuf, got: Vec<usize>, want: Vec<usize>, keys: String },

    #[error(
        "{file}: config.json says n_layer = {n_layer}, but the file holds {blocks} transformer blocks \
         (h.0 … h.{}); set n_layer to {blocks}, or use the config.json that belongs to these weights",
        blocks - 1
    )]
    ExtraBlocks { file: PathBuf, n_layer: usize, blocks: usize },

    #[error(
        "{file}: config.json says n_layer = {n_layer}, but the file holds only {blocks} transformer blocks; set \
         n_layer to {blocks}, or use the config.json that belongs to these weights"
    )]
    TooFewBlocks { file: PathBuf, n_layer: usize, blocks: usize },

    #[error(
        "{file}: tensor `{name}` holds {value} at {index:?}; the weights are damaged (re-download or re-save them)"
    )]
    NonFinite { file: PathBuf, name: String, index: Vec<usize>, value: f32 },

    #[error(
        "the logits at position {position} are not finite ({value}): the activations overflowed f32 on this \
         input, so the weights hold values too large for it"
    )]
    NonFiniteLogits { position: usize, value: f32 },

    #[error("{path} is a directory, not a file")]
    NotAFile { path: PathBuf },

    #[error("{file}: tensor `{name}` has dtype {got}; kvgpt reads F32, F16 and BF16 tensors")]
    WrongDtype { name: String, file: PathBuf, got: String },

    #[error("{file} is not a valid safetensors file ({reason}); re-download or re-save it")]
    CorruptWeights { file: PathBuf, reason: String },

    #[error("{file} is not a valid GGUF file ({reason}); re-download it or convert it again")]
    CorruptGguf { file: PathBuf, reason: String },

    #[error("{file}: {reason}")]
    UnsupportedGguf { file: PathBuf, reason: String },

    #[error("{file}: `{key}` = {value} is not supported: {why}")]
    UnsupportedConfig { file: PathBuf, key: String, value: String, why: String },

    #[error("{file}: {reason}")]
    BadConfig { file: PathBuf, reason: String },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error(
        "prompt of {prompt} tokens + {new} new tokens exceeds the model's {n_positions} positions \
         (room for {room} new tokens after this prompt)"
    )]
    ContextOverflow { prompt: usize, new: usize, n_positions: usize, room: usize },

    #[error("KV cache overflow: {len} cached + {new} new positions exceed its {capacity} positions")]
    CacheOverflow { len: usize, new: usize, capacity: usize },

    #[error(
        "the K/V pool is full: {need} more blocks are needed and {free} of its {total} are free (blocks of {block} \
         positions); give it more memory (--kv-mb) or ask for fewer tokens"
    )]
    KvPoolFull { need: usize, free: usize, total: usize, block: usize },

    #[error("token id {id} is outside the model's vocabulary of {vocab}")]
    BadTokenId { id: u32, vocab: usize },

    #[error("{0}")]
    Hub(String),

    #[error(
        "there is no folder `{id}` here, so it was taken as a Hugging Face Hub id: {id}/{file} is not in the \
         local Hugging Face cache ({}) and offline mode is on; go online once, or use a local model folder \
         (config.json, model.safetensors, tokenizer.json)",
        cache_dir.display()
    )]
    NotCached { id: String, file: String, cache_dir: PathBuf },

    #[error(
        "there is no folder `{id}` here, so it was taken as a Hugging Face Hub id: could not fetch {id}/{file} \
         from {from} ({reason}); without the Hub, use a local model folder (config.json, model.safetensors, \
         tokenizer.json)"
    )]
    HubFetch { id: String, file: String, from: String, reason: String },

    #[error(
        "the download of {file} from {url} was truncated (got {got} of the {want} bytes the server announced); {next}"
    )]
    HubTruncated { file: String, url: String, got: u64, want: u64, next: String },

    #[error("{spec} is not a model: {why}")]
    NotAModel { spec: String, why: String },

    #[error("{file} holds {} tensors; name the one to compare ({})", names.len(), names.join(", "))]
    WhichTensor { file: PathBuf, names: Vec<String> },

    #[error("could not write to {what}")]
    Write { what: String, source: std::io::Error },

    #[error("stopped before {} was complete; nothing was written", .0.display())]
    Stopped(PathBuf),

    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { path: path.into(), err: source }
    }
}
