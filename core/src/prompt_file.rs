//! `--prompt-cache FILE`: a prompt's K/V saved across runs of the CLI (llama.cpp's flag), so that
//! the next run with the same prefix computes only the rest, with the bits of a cold run.
//!
//! Layout (little-endian): `KVGPTPC1`, a u32 header length, the header as JSON (format version,
//! the model's K/V fingerprint — every weight byte as held, the config's numbers, the K/V layout —
//! its shape, the weights' dtype, the token count), the token ids (u32),
//! the K/V (`[L, 2, NH, N, HS]` f32), and an FNV-1a 64 checksum of everything before it. A file of
//! another model or dtype, a truncated or corrupt one, is refused with an error that says which.
//! Writing goes to a temporary file in the same folder that is renamed over the target, so a
//! failed write never leaves a half file behind.

use crate::error::{Error, Result};
use crate::kv_cache::{KvCache, KvSpan};
use crate::model::Model;
use serde::{Deserialize, Serialize};
use std::path::Path;

const MAGIC: &[u8; 8] = b"KVGPTPC1";
/// 2: the model's fingerprint covers every weight byte as held (1: a sample of them).
const VERSION: u32 = 2;

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Header {
    version: u32,
    /// [`fingerprint`].
    model: String,
    dtype: String,
    n_layer: usize,
    n_head: usize,
    head_dim: usize,
    tokens: usize,
}

/// A saved prompt: its ids and their K/V.
pub struct SavedPrompt {
    pub ids: Vec<u32>,
    pub kv: KvSpan,
}

/// FNV-1a, 64 bits.
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// What a prompt cache file records of the model that wrote it, to refuse another's K/V: the
/// model's K/V fingerprint ([`Model::kv_fingerprint`]: every weight byte as held, the config's
/// numbers and the K/V's layout), as hex.
pub fn fingerprint(model: &Model) -> String {
    model.kv_fingerprint().to_string()
}

fn header_for(model: &Model, tokens: usize) -> Header {
    let cfg = &model.config;
    Header {
        version: VERSION,
        model: fingerprint(model),
        dtype: model.weights_dtype().to_string(),
        n_layer: cfg.n_layer,
        n_head: cfg.n_head,
        head_dim: cfg.head_dim(),
        tokens,
    }
}

fn corrupt(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("{}: not a usable prompt cache file ({why}); delete it to start a new one", path.display()))
}

/// The most bytes a prompt cache file of `model` can take: a full context's ids and K/V, and a
/// header of at most 64 KiB.
pub fn max_bytes(model: &Model) -> u64 {
    let c = &model.config;
    let per_position = 4 + 4 * 2 * c.n_layer * c.n_embd;
    (12 + (64 << 10) + c.n_positions * per_position + 8) as u64
}

/// Reads and checks a prompt cache file against `model`: a regular file no larger than
/// [`max_bytes`].
pub fn load(path: &Path, model: &Model) -> Result<SavedPrompt> {
    let bytes = crate::files::read(path, "a prompt cache file", max_bytes(model), crate::files::Kinds::RegularOnly)?;
    parse(&bytes, model, path)
}

/// Checks the bytes of a prompt cache file (named `path` in errors) against `model`.
pub fn parse(bytes: &[u8], model: &Model, path: &Path) -> Result<SavedPrompt> {
    if bytes.len() < 8 + 4 + 8 || &bytes[..8] != MAGIC {
        return Err(corrupt(path, "it does not start with kvgpt's prompt cache header"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if fnv1a(FNV_OFFSET, body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(corrupt(path, "its checksum does not match: it is truncated or was changed"));
    }
    let hlen = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes")) as usize;
    let hjson = body.get(12..12 + hlen).ok_or_else(|| corrupt(path, "its header is cut short"))?;
    let h: Header =
        serde_json::from_slice(hjson).map_err(|e| corrupt(path, format!("its header is not valid: {e}")))?;
    if h.version != VERSION {
        return Err(corrupt(path, format!("format version {} (this kvgpt reads {VERSION})", h.version)));
    }
    let want = header_for(model, h.tokens);
    if h.dtype != want.dtype {
        return Err(Error::Invalid(format!(
            "{}: this prompt cache was made with {} weights, this run holds them as {}; the K/V differ, so it \
             cannot be reused: use the same dtype or delete the file",
            path.display(),
            h.dtype,
            want.dtype
        )));
    }
    if h.model != want.model || (h.n_layer, h.n_head, h.head_dim) != (want.n_layer, want.n_head, want.head_dim) {
        return Err(Error::Invalid(format!(
            "{}: this prompt cache was made by another model (fingerprint {}, this model's is {}); use a file of \
             this model's or delete it",
            path.display(),
            h.model,
            want.model
        )));
    }
    let n = h.tokens;
    let rest = &body[12 + hlen..];
    // The shape equals the model's (checked above) and n is within its context, so these
    // products are bounded by the model's own cache size.
    let floats = (n <= model.config.n_positions).then(|| h.n_layer * 2 * h.n_head * n * h.head_dim);
    if floats.is_none_or(|f| rest.len() != 4 * n + 4 * f) {
        return Err(corrupt(path, format!("its data does not hold the {n} tokens its header promises")));
    }
    let (ids_b, kv_b) = rest.split_at(4 * n);
    let ids: Vec<u32> = ids_b.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= model.config.vocab_size) {
        return Err(corrupt(path, format!("it holds token id {id}, outside the vocabulary")));
    }
    let data = kv_b.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
    let kv = KvSpan { len: n, n_layer: h.n_layer, n_head: h.n_head, head_dim: h.head_dim, data };
    Ok(SavedPrompt { ids, kv })
}

/// Saves the K/V of `ids` (positions `0..ids.len()` of `cache`) to `path`, atomically.
pub fn save(path: &Path, model: &Model, ids: &[u32], cache: &KvCache) -> Result<()> {
    let kv = cache.span(0, ids.len());
    let header = serde_json::to_vec(&header_for(model, ids.len())).expect("a header serializes");
    let mut out = Vec::with_capacity(12 + header.len() + 4 * ids.len() + kv.bytes() + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    ids.iter().for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
    kv.data.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    let sum = fnv1a(FNV_OFFSET, &out);
    out.extend_from_slice(&sum.to_le_bytes());
    crate::export::write_atomic(path, &out)
}

/// How many leading tokens of `prompt` a saved prompt can supply: the common prefix, at most
/// `prompt.len() - 1` (the last position is computed, for its logits).
pub fn reusable(saved: &SavedPrompt, prompt: &[u32]) -> usize {
    let common = saved.ids.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    common.min(prompt.len().saturating_sub(1))
}
