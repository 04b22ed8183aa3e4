//! Reading `model.safetensors` through a memory map: key layouts, dtype conversion, shape checks.
//!
//! Layouts in the wild: keys with the `transformer.` prefix (HF `GPT2LMHeadModel`, the fixture) or
//! without it (openai-community/gpt2); `h.{i}.attn.bias` / `attn.masked_bias` mask buffers (ignored);
//! `lm_head.weight` (ignored: GPT-2 ties it to `wte`). Conv1D weights are stored `[in, out]`.

use crate::config::Config;
use crate::error::{Error, Result};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// The tensors of one checkpoint, each converted to f32 and checked against the config.
pub struct Checkpoint {
    file: PathBuf,
    mmap: memmap2::Mmap,
    prefix: &'static str,
}

impl Checkpoint {
    pub fn open(file: &Path) -> Result<Checkpoint> {
        let f = std::fs::File::open(file).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::MissingFile {
                path: file.into(),
                hint: "a model folder needs config.json, model.safetensors and tokenizer.json".into(),
            },
            _ => Error::io(file, e),
        })?;
        let len = f.metadata().map_err(|e| Error::io(file, e))?.len();
        if len < 8 {
            return Err(Error::CorruptWeights { file: file.into(), reason: format!("only {len} bytes") });
        }
        let mmap = kvgpt_kernels::map_file(&f).map_err(|e| Error::io(file, e))?;
        let mut ck = Checkpoint { file: file.into(), mmap, prefix: "" };
        let st = ck.parse()?;
        if st.names().iter().any(|n| n.starts_with("transformer.")) {
            ck.prefix = "transformer.";
        }
        Ok(ck)
    }

    fn parse(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.mmap)
            .map_err(|e| Error::CorruptWeights { file: self.file.clone(), reason: e.to_string() })
    }

    /// The names of every tensor in the file.
    pub fn names(&self) -> Result<Vec<String>> {
        Ok(self.parse()?.names().into_iter().map(String::from).collect())
    }

    /// Tensor `name` (written without the `transformer.` prefix), which must have shape `want`.
    pub fn tensor(&self, name: &str, want: &[usize]) -> Result<Vec<f32>> {
        let mut data = Vec::with_capacity(want.iter().product());
        self.tensor_rows(name, want, |_, row| data.extend_from_slice(row))?;
        Ok(data)
    }

    /// Streams tensor `name` (shape `want`, rows along the first dimension) as f32 rows to `f`,
    /// converting a block of rows at a time and releasing the file's pages behind it, so that a
    /// large tensor (wte) never sits in memory twice. Returns the stored dtype.
    pub fn tensor_rows(&self, name: &str, want: &[usize], mut f: impl FnMut(usize, &[f32])) -> Result<Dtype> {
        let st = self.parse()?;
        let full = format!("{}{name}", self.prefix);
        let view =
            st.tensor(&full).map_err(|_| Error::MissingTensor { name: full.clone(), file: self.file.clone() })?;
        if view.shape() != want {
            return Err(Error::WrongShape {
                name: full,
                file: self.file.clone(),
                got: view.shape().to_vec(),
                want: want.to_vec(),
            });
        }
        let width: usize = match view.dtype() {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            other => return Err(Error::WrongDtype { name: full, file: self.file.clone(), got: format!("{other:?}") }),
        };
        let row_len: usize = want.iter().skip(1).product();
        let rows = want.first().copied().unwrap_or(1);
        let bytes = view.data();
        let base = bytes.as_ptr() as usize - self.mmap.as_ptr() as usize;
        let block_rows = (1 << 20) / (row_len * width).max(1) + 1; // about 1 MiB of file per block
        let mut buf: Vec<f32> = Vec::with_capacity(block_rows.min(rows) * row_len);
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + block_rows).min(rows);
            let chunk = &bytes[r0 * row_len * width..r1 * row_len * width];
            buf.clear();
            match view.dtype() {
                Dtype::F32 => buf.extend(chunk.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
                Dtype::F16 => buf.extend(chunk.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())),
                _ => buf.extend(chunk.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
            }
            for (i, row) in buf.chunks(row_len.max(1)).enumerate() {
                f(r0 + i, row);
            }
            kvgpt_kernels::release_map_range(&self.mmap, base + r0 * row_len * width, chunk.len());
            r0 = r1;
        }
        Ok(view.dtype())
    }

    /// Checks that every tensor the config implies is present, so that a missing one is reported
    /// before any large copy.
    pub fn check_names(&self, cfg: &Config) -> Result<()> {
        let names = self.names()?;
        for name in expected_names(cfg) {
            let full = format!("{}{name}", self.prefix);
            if !names.contains(&full) {
                return Err(Error::MissingTensor { name: full, file: self.file.clone() });
            }
        }
        Ok(())
    }
}

/// Every tensor name (without prefix) a GPT-2 checkpoint of this config must hold.
pub fn expected_names(cfg: &Config) -> Vec<String> {
    let mut v = vec!["wte.weight".to_string(), "wpe.weight".to_string()];
    for i in 0..cfg.n_layer {
        for part in [
            "ln_1.weight",
            "ln_1.bias",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias",
        ] {
            v.push(format!("h.{i}.{part}"));
        }
    }
    v.push("ln_f.weight".into());
    v.push("ln_f.bias".into());
    v
}
