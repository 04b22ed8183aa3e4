//! GPT-2 GGUF files as llama.cpp writes them (F32, F16, BF16 and the block types Q8_0, Q4_0,
//! Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; versions 2 and 3): the config and the tokenizer from the
//! metadata, the tensors under their Hugging Face names and layouts, so the model loads through
//! the same path as safetensors.
//!
//! The converter stores each Conv1D weight transposed (`[out, in]` rows, ggml's `ne = [in, out]`);
//! they are transposed back here, or, for a block type held as it is, streamed as rows of blocks
//! ([`Gguf::block_rows`]: a row is a column of kvgpt's packed matrix). Widened to f32, a block
//! type gives ggml's values exactly; an F32 GGUF gives the safetensors source's bits.

mod facts;
pub use super::gguf_header::Value;
use super::gguf_header::{describe, Bad, Header, Kind, TensorInfo, HEADER_READ, MAGIC};
use super::names;
use super::read::read_at;
use crate::config::Config;
use crate::error::{Error, Result};
pub use facts::GgufFacts;
use half::{bf16, f16};
use kvgpt_kernels::{widen_blocks, WeightType};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// config.json's keys and the metadata keys that hold them.
const CONFIG_KEYS: [(&str, &str); 9] = [
    ("n_layer", "gpt2.block_count"),
    ("n_embd", "gpt2.embedding_length"),
    ("n_head", "gpt2.attention.head_count"),
    ("n_inner", "gpt2.feed_forward_length"),
    ("n_positions", "gpt2.context_length"),
    ("vocab_size", "tokenizer.ggml.tokens"),
    ("layer_norm_epsilon", "gpt2.attention.layer_norm_epsilon"),
    ("bos_token_id", "tokenizer.ggml.bos_token_id"),
    ("eos_token_id", "tokenizer.ggml.eos_token_id"),
];

/// Whether `path` starts like a GGUF file.
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path).and_then(|f| read_at(&f, &mut magic, 0)).is_ok() && &magic == MAGIC
}

/// An open GGUF file: its metadata and where its tensors are.
pub struct Gguf {
    file: PathBuf,
    /// The GGUF version (2 or 3).
    version: u32,
    file_bytes: u64,
    f: File,
    pub meta: BTreeMap<String, Value>,
    tensors: BTreeMap<String, TensorInfo>,
    data_start: u64,
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Gguf> {
        let f = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut head = vec![0u8; len.min(HEADER_READ) as usize];
        read_at(&f, &mut head, 0).map_err(|e| Error::io(path, e))?;
        let h = Header::parse(&head, len).map_err(|e| match e {
            Bad::Corrupt(reason) => Error::CorruptGguf { file: path.into(), reason },
            Bad::Unsupported(reason) => Error::UnsupportedGguf { file: path.into(), reason },
        })?;
        let (version, meta, tensors, data_start) = (h.version, h.meta, h.tensors, h.data_start);
        Ok(Gguf { file: path.into(), version, file_bytes: len, f, meta, tensors, data_start })
    }

    fn int(&self, key: &str) -> Result<usize> {
        match self.meta.get(key) {
            Some(Value::Int(v)) if *v >= 0 && *v <= u32::MAX as i128 => Ok(*v as usize),
            other => Err(self.bad(format!("{key} is {}, not a count", describe(other)))),
        }
    }

    /// A token id the metadata may leave out (GPT-2's 50256 then); one it gives must be one
    /// (the config checks it is inside the vocabulary).
    fn token_id(&self, key: &str) -> Result<usize> {
        match self.meta.get(key) {
            None => Ok(50256),
            Some(Value::Int(v)) if (0..=u32::MAX as i128).contains(v) => Ok(*v as usize),
            other => Err(self.bad(format!("{key} is {}; it must be a token id", describe(other)))),
        }
    }

    fn bad(&self, reason: String) -> Error {
        Error::BadConfig { file: self.file.clone(), reason }
    }

    fn strings(&self, key: &str) -> Result<Vec<&str>> {
        match self.meta.get(key) {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::Str(s) => Ok(s.as_str()),
                    _ => Err(self.bad(format!("{key} holds a value that is not a string"))),
                })
                .collect(),
            _ => Err(self.bad(format!("{key} is missing; it is not a GGUF with a tokenizer"))),
        }
    }

    /// `tokenizer.ggml.token_type`, when the file holds one of `n` integers.
    pub fn token_types(&self, n: usize) -> Option<Vec<i32>> {
        let Some(Value::Array(a)) = self.meta.get("tokenizer.ggml.token_type") else { return None };
        let types: Option<Vec<i32>> =
            a.iter().map(|v| if let Value::Int(t) = v { i32::try_from(*t).ok() } else { None }).collect();
        types.filter(|t| t.len() == n)
    }

    /// `general.name`, when the file names its model.
    pub fn name(&self) -> Option<&str> {
        match self.meta.get("general.name") {
            Some(Value::Str(s)) if !s.trim().is_empty() => Some(s),
            _ => None,
        }
    }

    /// The GPT-2 config the metadata describes (checked as config.json is).
    pub fn config(&self) -> Result<Config> {
        match self.meta.get("general.architecture") {
            Some(Value::Str(a)) if a == "gpt2" => {}
            Some(Value::Str(a)) => {
                return Err(Error::UnsupportedGguf {
                    file: self.file.clone(),
                    reason: format!(
                        "this GGUF holds a `{a}` model (general.architecture); kvgpt runs GPT-2 models (gpt2)"
                    ),
                })
            }
            _ => return Err(self.bad("general.architecture is missing or not a string; kvgpt runs gpt2".into())),
        }
        let mut json = serde_json::json!({ "model_type": "gpt2" });
        for (cfg_key, key) in CONFIG_KEYS {
            json[cfg_key] = match key {
                "tokenizer.ggml.tokens" => self.strings(key)?.len().into(),
                "gpt2.attention.layer_norm_epsilon" => match self.meta.get(key) {
                    // JSON has no NaN or infinity: the config would take them for a missing key.
                    Some(Value::Float(e)) if e.is_finite() => (*e).into(),
                    other => return Err(self.bad(format!("{key} is {}, not a finite number", describe(other)))),
                },
                "tokenizer.ggml.bos_token_id" | "tokenizer.ggml.eos_token_id" => self.token_id(key)?.into(),
                _ => self.int(key)?.into(),
            };
        }
        // The config checks the values; its errors name the keys as they are in this file.
        Config::from_json(&json, &self.file).map_err(|e| match e {
            Error::UnsupportedConfig { file, key, value, why } => {
                let key = CONFIG_KEYS.iter().find(|(c, _)| *c == key).map_or(key, |(_, g)| g.to_string());
                Error::UnsupportedConfig { file, key, value, why }
            }
            e => e,
        })
    }

    /// The tokenizer's vocabulary and merges as a tokenizer.json document (GPT-2's byte-level
    /// BPE), for [`crate::Tokenizer::from_json_bytes`].
    pub fn tokenizer_json(&self) -> Result<Vec<u8>> {
        match self.meta.get("tokenizer.ggml.model") {
            Some(Value::Str(m)) if m == "gpt2" => {}
            other => {
                return Err(
                    self.bad(format!("tokenizer.ggml.model is {}; kvgpt reads gpt2 (byte-level BPE)", describe(other)))
                )
            }
        }
        let tokens = self.strings("tokenizer.ggml.tokens")?;
        let merges = self.strings("tokenizer.ggml.merges")?;
        let vocab: serde_json::Map<String, serde_json::Value> =
            tokens.iter().enumerate().map(|(i, t)| (t.to_string(), serde_json::Value::from(i))).collect();
        let eos = self.token_id("tokenizer.ggml.eos_token_id")?;
        let special: Vec<serde_json::Value> = tokens
            .iter()
            .enumerate()
            .filter(|&(i, t)| i == eos || (t.starts_with("<|") && t.ends_with("|>")))
            .map(|(i, t)| {
                serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let doc = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": special, "normalizer": null,
            "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges},
        });
        Ok(serde_json::to_vec(&doc).expect("a JSON document serializes"))
    }

    /// The GGUF tensor behind HF name `hf`: its GGUF name, whether it is stored transposed, its
    /// entry and its shape in HF's layout.
    fn lookup(&self, hf: &str) -> Result<(String, bool, &TensorInfo, Vec<usize>)> {
        let (name, transposed) =
            names::gguf_name(hf).ok_or_else(|| Error::MissingTensor { name: hf.into(), file: self.file.clone() })?;
        let t = self
            .tensors
            .get(&name)
            .ok_or_else(|| Error::MissingTensor { name: name.clone(), file: self.file.clone() })?;
        // HF shape [a, b] (row-major) is ggml ne = [b, a]; a transposed weight is ne = [a, b].
        let mut hf_shape: Vec<usize> = t.dims.iter().rev().copied().collect();
        if transposed {
            hf_shape.reverse();
        }
        Ok((name, transposed, t, hf_shape))
    }

    /// The GGUF tensor behind `hf`, which must have shape `want` in HF's layout.
    fn checked(&self, hf: &str, want: &[usize]) -> Result<(String, bool, &TensorInfo)> {
        let (name, transposed, t, hf_shape) = self.lookup(hf)?;
        if hf_shape != want {
            return Err(Error::WrongShape {
                name,
                file: self.file.clone(),
                got: hf_shape,
                want: want.to_vec(),
                keys: "the metadata's sizes".into(),
            });
        }
        Ok((name, transposed, t))
    }

    /// Elements `at..at + n` of tensor `t` (named `name` in errors) widened to f32; for Q8_0 both
    /// are whole blocks. A non-finite value is an error naming the tensor and the element.
    fn read(&self, name: &str, t: &TensorInfo, at: usize, n: usize) -> Result<Vec<f32>> {
        let skip = t.kind.bytes(at).expect("whole blocks");
        let mut bytes = vec![0u8; t.kind.bytes(n).expect("whole blocks")];
        read_at(&self.f, &mut bytes, self.data_start + t.offset + skip as u64).map_err(|e| Error::io(&self.file, e))?;
        let data: Vec<f32> = match t.kind {
            Kind::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect(),
            Kind::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Kind::Bf16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Kind::Blocks(ty) => {
                let mut out = vec![0.0f32; n];
                widen_blocks(ty, &bytes, &mut out).map_err(|e| self.corrupt_tensor(name, e))?;
                out
            }
        };
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(Error::NonFinite {
                file: self.file.clone(),
                name: name.into(),
                index: vec![at + i],
                value: data[i],
            });
        }
        Ok(data)
    }

    /// Tensor `hf` (a Hugging Face name, without `transformer.`) as f32 in HF's layout, which
    /// must have shape `want`. Returns its values and its stored type's name.
    pub fn tensor(&self, hf: &str, want: &[usize]) -> Result<(Vec<f32>, &'static str)> {
        let (name, transposed, t) = self.checked(hf, want)?;
        let n: usize = want.iter().product();
        let data = self.read(&name, t, 0, n)?;
        let data = if transposed && want.len() == 2 {
            // Stored [out, in] rows: back to HF's [in, out].
            let (k, m) = (want[0], want[1]);
            let mut out = vec![0.0f32; n];
            for o in 0..m {
                for i in 0..k {
                    out[i * m + o] = data[o * k + i];
                }
            }
            out
        } else {
            data
        };
        Ok((data, t.kind.name()))
    }

    fn corrupt_tensor(&self, name: &str, reason: String) -> Error {
        Error::CorruptGguf { file: self.file.clone(), reason: format!("tensor `{name}`: {reason}") }
    }

    /// The type tensor `hf` is stored as, held as kvgpt holds it.
    pub fn held_type(&self, hf: &str) -> Result<WeightType> {
        Ok(self.lookup(hf)?.2.kind.held())
    }

    /// The type most of the model's matrices are stored as (its first MLP's), as kvgpt holds it.
    pub fn main_type(&self) -> Option<WeightType> {
        self.tensors.get("blk.0.ffn_up.weight").map(|t| t.kind.held())
    }

    /// Streams the rows of a block-type tensor as the file holds them (row `r`, its `ne0`
    /// elements' blocks) to `f`: a Conv1D weight's column `r`, or token `r`'s embedding.
    pub fn block_rows(&self, hf: &str, want: &[usize], mut f: impl FnMut(usize, &[u8]) -> Result<()>) -> Result<()> {
        let (name, _, t) = self.checked(hf, want)?;
        let (ne0, rows) = (t.dims[0], t.dims.iter().skip(1).product::<usize>());
        let row_bytes = t.kind.bytes(ne0).expect("checked at open: whole blocks");
        let block = ((1 << 20) / row_bytes.max(1)).max(1);
        let mut buf = Vec::new();
        for r0 in (0..rows).step_by(block) {
            let r1 = (r0 + block).min(rows);
            buf.resize((r1 - r0) * row_bytes, 0);
            let at = self.data_start + t.offset + (r0 * row_bytes) as u64;
            read_at(&self.f, &mut buf, at).map_err(|e| Error::io(&self.file, e))?;
            for (i, row) in buf.chunks_exact(row_bytes).enumerate() {
                f(r0 + i, row).map_err(|e| match e {
                    Error::Invalid(reason) => self.corrupt_tensor(&name, reason),
                    e => e,
                })?;
            }
        }
        Ok(())
    }

    /// Streams tensor `hf`'s rows (HF's layout, shape `want`) to `f`, about 1 MiB of the file at
    /// a time where the rows lie in the file as they are (`wte`, the largest, does), so it never
    /// sits in memory whole as f32. Returns its stored type's name.
    pub fn tensor_rows(&self, hf: &str, want: &[usize], mut f: impl FnMut(usize, &[f32])) -> Result<&'static str> {
        let (name, transposed, t) = self.checked(hf, want)?;
        let row: usize = want.iter().skip(1).product();
        let rows = want.first().copied().unwrap_or(1);
        let row_bytes = t.kind.bytes(row).filter(|&b| b > 0 && !transposed);
        let Some(row_bytes) = row_bytes else {
            let (data, kind) = self.tensor(hf, want)?;
            data.chunks(row.max(1)).enumerate().for_each(|(i, r)| f(i, r));
            return Ok(kind);
        };
        let block = (1 << 20) / row_bytes + 1;
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + block).min(rows);
            let data = self.read(&name, t, r0 * row, (r1 - r0) * row)?;
            data.chunks(row).enumerate().for_each(|(i, r)| f(r0 + i, r));
            r0 = r1;
        }
        Ok(t.kind.name())
    }

    /// Every tensor the config implies is present with its shape, and nothing beyond `n_layer`.
    pub fn check(&self, cfg: &Config) -> Result<()> {
        let blocks = names::blocks_held(self.tensors.keys().map(String::as_str), "blk.");
        if cfg.n_layer > blocks {
            return Err(Error::CorruptGguf {
                file: self.file.clone(),
                reason: format!(
                    "its metadata's block_count is {}, but it holds tensors of only {blocks} blocks",
                    cfg.n_layer
                ),
            });
        }
        for (name, dims) in names::expected(cfg) {
            let (g, _, _, got) = self.lookup(&name)?;
            let want: Vec<usize> = dims.iter().map(|d| d.1).collect();
            if got != want {
                let keys = dims.iter().map(|d| d.0).collect::<Vec<_>>().join(" × ");
                return Err(Error::WrongShape { name: g, file: self.file.clone(), got, want, keys });
            }
        }
        if let Some(extra) = self.tensors.keys().find(|n| {
            n.strip_prefix("blk.")
                .and_then(|r| r.split('.').next()?.parse::<usize>().ok())
                .is_some_and(|i| i >= cfg.n_layer)
        }) {
            return Err(Error::CorruptGguf {
                file: self.file.clone(),
                reason: format!("it holds `{extra}`, a block beyond the metadata's block_count of {}", cfg.n_layer),
            });
        }
        Ok(())
    }
}
