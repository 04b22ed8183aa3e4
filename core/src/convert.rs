//! A model written as the GGUF llama.cpp's tools read (`kvgpt convert`), with no torch and no
//! llama.cpp checkout: the metadata, tensor names, order and layouts llama.cpp's converter
//! (`convert_hf_to_gguf.py`) writes for GPT-2, and its rule for types (every matrix but the
//! position embedding in the type asked for; vectors and `position_embd` in f32). The block types
//! are quantized by ggml's reference quantizers, so a file is what the converter (f32, f16, bf16,
//! q8_0) or `llama-quantize --pure` (q4_0, q4_1, q5_0, q5_1) writes from the same weights.
//! Written to a hidden file beside the output and renamed into place: a run that fails or is
//! stopped (the caller's flag, set on SIGINT or SIGTERM by the CLI) leaves nothing.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::hub::ModelFiles;
use crate::tokenizer::{GgufVocab, Tokenizer};
use crate::weights::gguf_write::{padding, Layout, Put, Slot};
use crate::weights::{expected, names, parameter_count, Weights};
use kvgpt_kernels::{f32_to_bf16_bits, f32_to_f16_bits, quantize_blocks, WeightType};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The types `kvgpt convert` writes, each as llama.cpp writes it.
pub const TYPES: [WeightType; 8] = [
    WeightType::F32,
    WeightType::F16,
    WeightType::Bf16,
    WeightType::Q8_0,
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q5_1,
];

/// What to write: the file, the type of its matrices, the model's name in its metadata (None: a
/// GGUF's own `general.name`, else the folder's or repository's name, or the file's stem), and a
/// flag that stops the run (set from a signal handler: the run then removes what it wrote).
pub struct Target<'a> {
    pub path: &'a Path,
    pub ty: WeightType,
    pub name: Option<&'a str>,
    pub stop: &'a AtomicBool,
}

/// What was written.
pub struct Converted {
    pub file_bytes: u64,
    /// How many tensors of each type, the most common first.
    pub types: Vec<(&'static str, usize)>,
    /// The tensors whose source held another block type, now quantized again: (name, its type).
    pub requantized: Vec<(String, WeightType)>,
}

/// One tensor to write: its Hugging Face name and shape, and whether the GGUF stores it
/// transposed (GGUF row `j` is then column `j` of Hugging Face's `[K, N]`).
struct Source {
    hf: String,
    gguf: String,
    shape: Vec<usize>,
    transposed: bool,
}

/// Writes the model `files` name as `to` asks.
pub fn convert(files: &ModelFiles, to: &Target) -> Result<Converted> {
    check_type(to.ty)?;
    let out = output_path(to.path)?;
    files.inputs("the model's").refuse_as_output(&out)?;
    let (cfg, weights) = Weights::open(&files.config, &files.weights)?;
    let mut vocab = Tokenizer::from_files(&files.tokenizer)?.gguf_vocab()?;
    if let Weights::Gguf(g) = &weights {
        // The source's own types: the tokenizer built from it keeps only which tokens are special.
        vocab.types = g.token_types(vocab.tokens.len()).unwrap_or(vocab.types);
    }
    let name = to.name.map_or_else(|| default_name(files, &weights), str::to_string);
    let (layout, sources) = plan(&cfg, vocab, to.ty, &name)?;
    let requantized = requantized(&weights, &layout, &sources)?;
    let partial = partial_path(&out);
    let written = write(&partial, &layout, &sources, &weights, to.stop)
        .map_err(|e| match e {
            Error::Io { err, .. } => Error::io(&out, err),
            Error::Stopped(_) => Error::Stopped(out.clone()),
            e => e,
        })
        .and_then(|()| std::fs::rename(&partial, &out).map_err(|e| Error::io(&out, e)));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    let file_bytes = std::fs::metadata(&out).map_err(|e| Error::io(&out, e))?.len();
    let mut types = std::collections::BTreeMap::<&'static str, usize>::new();
    layout.tensors.iter().for_each(|t| *types.entry(t.ty.name()).or_default() += 1);
    let mut types: Vec<_> = types.into_iter().collect();
    types.sort_by_key(|t| std::cmp::Reverse(t.1));
    Ok(Converted { file_bytes, types, requantized })
}

fn check_type(ty: WeightType) -> Result<()> {
    if TYPES.contains(&ty) {
        return Ok(());
    }
    let names: Vec<&str> = TYPES.iter().map(|t| t.name()).collect();
    let why = match ty {
        WeightType::Q8 | WeightType::W8A8 => "it is kvgpt's own layout, which llama.cpp does not read",
        _ => {
            "llama.cpp's quantizer for the k-quants searches for scales that kvgpt's does not; \
             use llama-quantize on an f32 GGUF for those"
        }
    };
    Err(Error::Invalid(format!("a GGUF is written as one of {}, not {} ({why})", names.join(", "), ty.name())))
}

/// Where the file goes: through a symlink to its target; refused when it is a folder or its
/// folder does not exist, before any work.
fn output_path(path: &Path) -> Result<PathBuf> {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let out = if is_link { std::fs::canonicalize(path).unwrap_or_else(|_| path.into()) } else { path.into() };
    if out.is_dir() {
        let example = out.join("model.gguf");
        return Err(Error::Invalid(format!(
            "{} is a folder; name the GGUF file to write (e.g. {})",
            path.display(),
            example.display()
        )));
    }
    let folder = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !folder.is_dir() {
        return Err(Error::Invalid(format!(
            "the folder {} does not exist; make it first, or write {} elsewhere",
            folder.display(),
            path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
        )));
    }
    Ok(out)
}

/// The tensors that will be quantized again: a block type written from another block type.
fn requantized(weights: &Weights, layout: &Layout, sources: &[Source]) -> Result<Vec<(String, WeightType)>> {
    let Weights::Gguf(g) = weights else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (slot, src) in layout.tensors.iter().zip(sources) {
        let held = g.held_type(&src.hf)?;
        if slot.ty.ggml_block().is_some() && held.ggml_block().is_some() && held != slot.ty {
            out.push((slot.name.clone(), held));
        }
    }
    Ok(out)
}

/// The name a GGUF of `files` gets by default: a GGUF's own `general.name`, else the folder's
/// or Hub repository's name, or the file's without its extension.
fn default_name(files: &ModelFiles, weights: &Weights) -> String {
    if let Some(n) = match weights {
        Weights::Gguf(g) => g.name(),
        Weights::Safetensors(_) => None,
    } {
        return n.to_string();
    }
    let given = Path::new(&files.name);
    let path = std::fs::canonicalize(given).unwrap_or_else(|_| given.into());
    let name = if path.is_file() { path.file_stem() } else { path.file_name() };
    name.map(|s| s.to_string_lossy().into_owned()).filter(|s| !s.is_empty()).unwrap_or_else(|| "gpt2".into())
}

/// The metadata and tensor entries of the file, and where each tensor comes from.
fn plan(cfg: &Config, mut vocab: GgufVocab, ty: WeightType, name: &str) -> Result<(Layout, Vec<Source>)> {
    if vocab.tokens.len() > cfg.vocab_size {
        return Err(Error::Invalid(format!(
            "the tokenizer has {} tokens and the model's embedding {} rows; they must agree",
            vocab.tokens.len(),
            cfg.vocab_size
        )));
    }
    // Rows of the embedding no token uses, as the converter names them (type 5: unused).
    for i in vocab.tokens.len()..cfg.vocab_size {
        vocab.tokens.push(format!("[PAD{i}]"));
        vocab.types.push(5);
    }
    let mut l = Layout::default();
    metadata(&mut l, cfg, vocab, ty, name);
    // The converter's order: the checkpoint's, whose names are sorted.
    let mut sources: Vec<Source> = expected(cfg)
        .map(|(hf, dims)| {
            let (gguf, transposed) = names::gguf_name(&hf).expect("every expected tensor has a GGUF name");
            Source { hf, gguf, shape: dims.iter().map(|d| d.1).collect(), transposed }
        })
        .collect();
    sources.sort_by(|a, b| a.hf.cmp(&b.hf));
    for s in &sources {
        // ggml's shape lists a row's length first.
        let mut dims = s.shape.clone();
        if !s.transposed {
            dims.reverse();
        }
        let matrix = dims.len() == 2 && s.hf != names::WPE;
        l.tensor(&s.gguf, &dims, if matrix { ty } else { WeightType::F32 }).map_err(Error::Invalid)?;
    }
    Ok((l, sources))
}

/// The metadata, in the order the converter writes it.
fn metadata(l: &mut Layout, cfg: &Config, vocab: GgufVocab, ty: WeightType, name: &str) {
    let u32_of = |n: usize| Put::U32(n as u32);
    l.meta("general.architecture", Put::Str("gpt2".into()));
    l.meta("general.type", Put::Str("model".into()));
    l.meta("general.name", Put::Str(name.into()));
    l.meta("general.size_label", Put::Str(size_label(parameter_count(cfg))));
    l.meta("gpt2.block_count", u32_of(cfg.n_layer));
    l.meta("gpt2.context_length", u32_of(cfg.n_positions));
    l.meta("gpt2.embedding_length", u32_of(cfg.n_embd));
    l.meta("gpt2.feed_forward_length", u32_of(cfg.n_inner));
    l.meta("gpt2.attention.head_count", u32_of(cfg.n_head));
    l.meta("gpt2.attention.layer_norm_epsilon", Put::F32(cfg.layer_norm_epsilon));
    l.meta("general.file_type", Put::U32(file_type(ty)));
    l.meta("general.quantization_version", Put::U32(2));
    l.meta("tokenizer.ggml.model", Put::Str("gpt2".into()));
    l.meta("tokenizer.ggml.pre", Put::Str("gpt-2".into()));
    l.meta("tokenizer.ggml.tokens", Put::Strs(vocab.tokens));
    l.meta("tokenizer.ggml.token_type", Put::I32s(vocab.types));
    l.meta("tokenizer.ggml.merges", Put::Strs(vocab.merges));
    l.meta("tokenizer.ggml.bos_token_id", Put::U32(cfg.bos_token_id));
    l.meta("tokenizer.ggml.eos_token_id", Put::U32(cfg.eos_token_id));
    l.meta("tokenizer.ggml.unknown_token_id", Put::U32(cfg.eos_token_id));
    l.meta("tokenizer.ggml.add_bos_token", Put::Bool(false));
    l.meta("tokenizer.ggml.add_eos_token", Put::Bool(false));
}

/// llama.cpp's `llama_ftype` of a file whose matrices are `ty`.
fn file_type(ty: WeightType) -> u32 {
    match ty {
        WeightType::F16 => 1,
        WeightType::Q4_0 => 2,
        WeightType::Q4_1 => 3,
        WeightType::Q8_0 => 7,
        WeightType::Q5_0 => 8,
        WeightType::Q5_1 => 9,
        WeightType::Bf16 => 32,
        _ => 0,
    }
}

/// gguf-py's size label of `n` parameters ("82M", "3.3M"): two significant digits at least.
fn size_label(n: usize) -> String {
    let n = n as f64;
    let (x, suffix) = match n {
        n if n > 1e12 => (n * 1e-12, "T"),
        n if n > 1e9 => (n * 1e-9, "B"),
        n if n > 1e6 => (n * 1e-6, "M"),
        n => (n * 1e-3, "K"),
    };
    let digits = format!("{}", x.round_ties_even() as u64).trim_start_matches('0').len();
    format!("{x:.prec$}{suffix}", prec = 2usize.saturating_sub(digits))
}

/// A hidden file beside `out` (the same file system, so the rename is atomic).
fn partial_path(out: &Path) -> PathBuf {
    let name = out.file_name().map_or_else(|| "out.gguf".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

fn write(path: &Path, layout: &Layout, sources: &[Source], weights: &Weights, stop: &AtomicBool) -> Result<()> {
    let io = |e| Error::io(path, e);
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path).map_err(io)?);
    w.write_all(&layout.header()).map_err(io)?;
    for (slot, src) in layout.tensors.iter().zip(sources) {
        // Checked at every row: a row is at most a few KiB of work.
        tensor_data(weights, src, slot, &mut |b| {
            if stop.load(Ordering::Relaxed) {
                return Err(Error::Stopped(path.into()));
            }
            w.write_all(b).map_err(io)
        })?;
        w.write_all(&[0u8; 32][..padding(slot.bytes)]).map_err(io)?;
    }
    w.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)
}

/// Tensor `src`'s data as `slot` stores it, row by row to `put`: a GGUF source's blocks as they
/// are when they are the type asked for, anything else widened to f32 and encoded.
fn tensor_data(weights: &Weights, src: &Source, slot: &Slot, put: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
    if let Weights::Gguf(g) = weights {
        if slot.ty.ggml_block().is_some() && g.held_type(&src.hf)? == slot.ty {
            return g.block_rows(&src.hf, &src.shape, |_, raw| put(raw));
        }
    }
    let mut buf = vec![0u8; slot.row_bytes()];
    let mut row_out = |row: &[f32]| -> Result<()> {
        encode(slot.ty, row, &mut buf).map_err(|e| Error::Invalid(format!("`{}`: {e}", slot.name)))?;
        put(&buf)
    };
    if src.shape.len() == 1 {
        return row_out(&weights.tensor(&src.hf, &src.shape)?);
    }
    if src.transposed {
        let (k, n) = (src.shape[0], src.shape[1]);
        let t = weights.tensor(&src.hf, &src.shape)?;
        let mut row = vec![0.0f32; k];
        for j in 0..n {
            row.iter_mut().enumerate().for_each(|(i, x)| *x = t[i * n + j]);
            row_out(&row)?;
        }
        return Ok(());
    }
    let mut failed = None;
    weights.tensor_rows(&src.hf, &src.shape, |_, row| {
        if failed.is_none() {
            failed = row_out(row).err();
        }
    })?;
    failed.map_or(Ok(()), Err)
}

/// One row of f32 weights as type `ty` stores it.
fn encode(ty: WeightType, row: &[f32], out: &mut [u8]) -> std::result::Result<(), String> {
    match ty {
        WeightType::F32 => {
            row.iter().zip(out.chunks_exact_mut(4)).for_each(|(x, b)| b.copy_from_slice(&x.to_le_bytes()))
        }
        WeightType::F16 | WeightType::Bf16 => {
            let half = if ty == WeightType::F16 { f32_to_f16_bits } else { f32_to_bf16_bits };
            row.iter().zip(out.chunks_exact_mut(2)).for_each(|(x, b)| b.copy_from_slice(&half(*x).to_le_bytes()));
        }
        _ => quantize_blocks(ty, row, out)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::size_label;

    /// gguf-py's `model_weight_count_rounded_notation`, at the values its rules turn on.
    #[test]
    fn size_labels_are_gguf_pys() {
        for (n, want) in [(3_324_736, "3.3M"), (81_912_576, "82M"), (999, "1.0K"), (124_439_808, "124M"), (950, "1.0K")]
        {
            assert_eq!(size_label(n), want, "{n}");
        }
    }
}
