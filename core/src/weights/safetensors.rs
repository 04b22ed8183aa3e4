//! Reading `model.safetensors`: the header parsed and checked (against the file's length and
//! against config.json) before anything is allocated, then each tensor read — not memory-mapped —
//! a block at a time, converted to f32 and checked for non-finite values.
//!
//! Layouts in the wild: keys with the `transformer.` prefix (HF `GPT2LMHeadModel`, the fixture) or
//! without it (openai-community/gpt2); `h.{i}.attn.bias` / `attn.masked_bias` mask buffers (ignored);
//! `lm_head.weight` (ignored: GPT-2 ties it to `wte`). Conv1D weights are stored `[in, out]`.
//!
//! Why read instead of map: a mapped file that another process truncates or rewrites while it is
//! mapped kills the reader with SIGBUS, without a word. Read with `pread`, a file that shrinks
//! under the loader is a short read, reported as such; the weights are copied into the model's own
//! memory anyway (converted, packed), so the map saved nothing after load.

use super::names;
use super::read::read_at;
use crate::config::Config;
use crate::error::{Error, Result};
use half::{bf16, f16};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The safetensors header may not be larger than this (the format's own limit).
const MAX_HEADER: u64 = 100 << 20;

/// How a tensor's elements are stored; the ones kvgpt reads are F32, F16 and BF16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    F32,
    F16,
    Bf16,
    /// A dtype the format knows but kvgpt does not read, with its element size in bytes.
    Other(&'static str, usize),
}

impl Stored {
    fn parse(s: &str) -> Option<Stored> {
        Some(match s {
            "F32" => Stored::F32,
            "F16" => Stored::F16,
            "BF16" => Stored::Bf16,
            "F64" => Stored::Other("F64", 8),
            "I64" => Stored::Other("I64", 8),
            "U64" => Stored::Other("U64", 8),
            "I32" => Stored::Other("I32", 4),
            "U32" => Stored::Other("U32", 4),
            "I16" => Stored::Other("I16", 2),
            "U16" => Stored::Other("U16", 2),
            "I8" => Stored::Other("I8", 1),
            "U8" => Stored::Other("U8", 1),
            "BOOL" => Stored::Other("BOOL", 1),
            "F8_E4M3" => Stored::Other("F8_E4M3", 1),
            "F8_E5M2" => Stored::Other("F8_E5M2", 1),
            _ => return None,
        })
    }

    fn width(self) -> usize {
        match self {
            Stored::F32 => 4,
            Stored::F16 | Stored::Bf16 => 2,
            Stored::Other(_, w) => w,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Stored::F32 => "f32",
            Stored::F16 => "f16",
            Stored::Bf16 => "bf16",
            Stored::Other(n, _) => n,
        }
    }
}

/// One entry of the header: where a tensor's bytes lie in the data section.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub dtype: Stored,
    pub shape: Vec<usize>,
    /// Byte range within the data section (after the 8-byte length and the header).
    pub start: u64,
    pub end: u64,
}

/// The parsed header: every tensor by name, and where the data section starts in the file.
#[derive(Debug)]
pub struct Header {
    pub tensors: HashMap<String, TensorInfo>,
    pub data_start: u64,
}

/// Parses and checks a safetensors header. `head` holds at least the file's first bytes (the
/// 8-byte length and the header itself; more is ignored) and `file_len` is the file's length.
/// Every fault is an error that names what is wrong, and the tensor where there is one.
pub fn parse_header(head: &[u8], file_len: u64) -> std::result::Result<Header, String> {
    let n = u64::from_le_bytes(
        head.get(..8).ok_or(format!("only {file_len} bytes, less than the 8-byte header length"))?.try_into().unwrap(),
    );
    if n > MAX_HEADER {
        return Err(format!("the header length field says {n} bytes (at most {MAX_HEADER} allowed)"));
    }
    let data_start = 8 + n;
    if data_start > file_len {
        return Err(format!("the header length field says {n} bytes but the file has only {file_len}: truncated?"));
    }
    let text = head.get(8..data_start as usize).ok_or("the header is cut short")?;
    let text = std::str::from_utf8(text).map_err(|e| format!("the header is not UTF-8 ({e})"))?;
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text.trim_end_matches(' '))
        .map_err(|e| format!("the header is not a JSON object ({e})"))?;
    let mut tensors = HashMap::with_capacity(map.len());
    for (name, v) in map {
        if name == "__metadata__" {
            continue;
        }
        let info = tensor_info(&name, &v)?;
        tensors.insert(name, info);
    }
    // The data section is the tensors back to back, in offset order, with no gap or overlap.
    let mut order: Vec<(&String, &TensorInfo)> = tensors.iter().collect();
    order.sort_by_key(|(_, t)| (t.start, t.end));
    let mut at = 0u64;
    let mut prev: Option<&str> = None;
    for (name, t) in &order {
        if t.start != at {
            let after = prev.map(|p| format!("`{p}` ends at {at}")).unwrap_or_else(|| "the data starts at 0".into());
            let what = if t.start < at { "overlaps the one before" } else { "leaves a gap" };
            return Err(format!("tensor `{name}`: data_offsets start at {} but {after}: it {what}", t.start));
        }
        at = t.end;
        prev = Some(name);
    }
    let have = file_len - data_start;
    if at != have {
        return Err(format!(
            "the header describes {at} bytes of tensor data but the file holds {have} after the header: {}",
            if at > have { "truncated" } else { "trailing bytes" }
        ));
    }
    Ok(Header { tensors, data_start })
}

fn tensor_info(name: &str, v: &serde_json::Value) -> std::result::Result<TensorInfo, String> {
    let bad = |what: &str| format!("tensor `{name}`: {what}");
    let o = v.as_object().ok_or_else(|| bad("expected an object with dtype, shape and data_offsets"))?;
    let dtype = o.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| bad("no dtype string"))?;
    let dtype = Stored::parse(dtype).ok_or_else(|| bad(&format!("unknown dtype {dtype:?}")))?;
    let shape: Vec<usize> = o
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or_else(|| bad("no shape array"))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("the shape must be a list of non-negative integers"))?;
    let offsets = o.get("data_offsets").and_then(|s| s.as_array()).ok_or_else(|| bad("no data_offsets"))?;
    let (start, end) = match offsets.as_slice() {
        [a, b] => (a.as_u64(), b.as_u64()),
        _ => (None, None),
    };
    let (start, end) = start.zip(end).ok_or_else(|| bad("data_offsets must be two non-negative integers"))?;
    let bytes = shape
        .iter()
        .try_fold(dtype.width(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| bad(&format!("shape {shape:?} is too large")))?;
    if end < start || end - start != bytes as u64 {
        return Err(bad(&format!(
            "shape {shape:?} of {} is {bytes} bytes but data_offsets [{start}, {end}] span {}",
            dtype.name(),
            end as i128 - start as i128
        )));
    }
    Ok(TensorInfo { dtype, shape, start, end })
}

/// The tensors of one checkpoint, each converted to f32 and checked against the config.
pub struct Checkpoint {
    file: PathBuf,
    f: File,
    header: Header,
    prefix: &'static str,
}

impl Checkpoint {
    pub fn open(file: &Path) -> Result<Checkpoint> {
        let f = File::open(file).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::MissingFile {
                path: file.into(),
                hint: "a model folder needs config.json, model.safetensors and tokenizer.json".into(),
            },
            _ => Error::io(file, e),
        })?;
        let meta = f.metadata().map_err(|e| Error::io(file, e))?;
        if meta.is_dir() {
            return Err(Error::NotAFile { path: file.into() });
        }
        let corrupt = |reason: String| Error::CorruptWeights { file: file.into(), reason };
        let len = meta.len();
        let mut first = [0u8; 8];
        read_at(&f, &mut first[..len.min(8) as usize], 0).map_err(|e| Error::io(file, e))?;
        let n = u64::from_le_bytes(first);
        // Only the header is read now: its length is checked before it is allocated.
        let mut head = first.to_vec();
        if len >= 8 && n <= MAX_HEADER && 8 + n <= len {
            head.resize(8 + n as usize, 0);
            read_at(&f, &mut head[8..], 8).map_err(|e| Error::io(file, e))?;
        }
        let header = parse_header(&head[..len.min(head.len() as u64) as usize], len).map_err(corrupt)?;
        let prefix = if header.tensors.keys().any(|n| n.starts_with("transformer.")) { "transformer." } else { "" };
        Ok(Checkpoint { file: file.into(), f, header, prefix })
    }

    fn info(&self, name: &str) -> Result<(String, &TensorInfo)> {
        let full = format!("{}{name}", self.prefix);
        match self.header.tensors.get(&full) {
            Some(t) => Ok((full, t)),
            None => Err(Error::MissingTensor { name: full, file: self.file.clone() }),
        }
    }

    /// Tensor `name` (written without the `transformer.` prefix), which must have shape `want`.
    pub fn tensor(&self, name: &str, want: &[usize]) -> Result<Vec<f32>> {
        let mut data = Vec::with_capacity(self.info(name)?.1.shape.iter().product());
        self.tensor_rows(name, want, |_, row| data.extend_from_slice(row))?;
        Ok(data)
    }

    /// Streams tensor `name` (shape `want`, rows along the first dimension) as f32 rows to `f`,
    /// reading and converting about 1 MiB of the file at a time, so that a large tensor (wte)
    /// never sits in memory twice. Returns the stored dtype. A non-finite value is an error that
    /// names the tensor and the element.
    pub fn tensor_rows(&self, name: &str, want: &[usize], mut f: impl FnMut(usize, &[f32])) -> Result<Stored> {
        let (full, t) = self.info(name)?;
        if t.shape != want {
            let keys = "its sizes".to_string();
            return Err(Error::WrongShape {
                name: full,
                file: self.file.clone(),
                got: t.shape.clone(),
                want: want.to_vec(),
                keys,
            });
        }
        if let Stored::Other(d, _) = t.dtype {
            return Err(Error::WrongDtype { name: full, file: self.file.clone(), got: d.into() });
        }
        let width = t.dtype.width();
        let row_len: usize = want.iter().skip(1).product();
        let rows = want.first().copied().unwrap_or(1);
        let block_rows = (1 << 20) / (row_len * width).max(1) + 1;
        let mut bytes = vec![0u8; block_rows.min(rows) * row_len * width];
        let mut buf: Vec<f32> = Vec::with_capacity(block_rows.min(rows) * row_len);
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + block_rows).min(rows);
            let chunk = &mut bytes[..(r1 - r0) * row_len * width];
            let at = self.header.data_start + t.start + (r0 * row_len * width) as u64;
            read_at(&self.f, chunk, at).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::CorruptWeights {
                    file: self.file.clone(),
                    reason: format!(
                        "it ended before tensor `{full}` did ({} bytes wanted at offset {at}): \
                         was it being written while kvgpt read it?",
                        chunk.len()
                    ),
                },
                _ => Error::io(&self.file, e),
            })?;
            buf.clear();
            match t.dtype {
                Stored::F32 => buf.extend(chunk.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
                Stored::F16 => buf.extend(chunk.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())),
                _ => buf.extend(chunk.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
            }
            if let Some(i) = buf.iter().position(|x| !x.is_finite()) {
                let flat = r0 * row_len + i;
                let index: Vec<usize> = unravel(flat, want);
                return Err(Error::NonFinite { file: self.file.clone(), name: full, index, value: buf[i] });
            }
            for (i, row) in buf.chunks(row_len.max(1)).enumerate() {
                f(r0 + i, row);
            }
            r0 = r1;
        }
        Ok(t.dtype)
    }

    /// Checks the file against the config before anything is allocated: every tensor the config
    /// implies is present with the shape it implies (the error names the config keys and both
    /// shapes) and a dtype kvgpt reads, and the file holds no transformer block beyond `n_layer`.
    pub fn check(&self, cfg: &Config) -> Result<()> {
        let prefix = format!("{}h.", self.prefix);
        let blocks = names::blocks_held(self.header.tensors.keys().map(String::as_str), &prefix);
        if cfg.n_layer > blocks {
            return Err(Error::TooFewBlocks { file: self.file.clone(), n_layer: cfg.n_layer, blocks });
        }
        for (name, dims) in names::expected(cfg) {
            let (full, t) = self.info(&name)?;
            let want: Vec<usize> = dims.iter().map(|d| d.1).collect();
            if t.shape != want {
                let keys = dims.iter().map(|d| d.0).collect::<Vec<_>>().join(" × ");
                return Err(Error::WrongShape {
                    name: full,
                    file: self.file.clone(),
                    got: t.shape.clone(),
                    want,
                    keys,
                });
            }
            if let Stored::Other(d, _) = t.dtype {
                return Err(Error::WrongDtype { name: full, file: self.file.clone(), got: d.into() });
            }
        }
        if blocks > cfg.n_layer {
            return Err(Error::ExtraBlocks { file: self.file.clone(), n_layer: cfg.n_layer, blocks });
        }
        Ok(())
    }
}

/// The multi-index of element `flat` of a row-major tensor of `shape`.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (i, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[i] = flat % d;
            flat /= d;
        }
    }
    idx
}
