//! Where a model's tensors come from: a safetensors checkpoint or a GGUF file, seen through the
//! same names (the table in [`names`]) and layouts, each tensor converted to f32 and checked.

pub mod gguf;
mod gguf_header;
pub mod gguf_write;
pub mod names;
mod read;
pub mod safetensors;

pub use gguf::{is_gguf, Gguf};
pub use names::expected;
pub use safetensors::{parse_header, Checkpoint, Stored};

use crate::config::Config;
use crate::error::{Error, Result};
use kvgpt_kernels::{PackedMatrix, WeightType, Q8_BLOCK};
use std::path::Path;

/// The type most of a GGUF's matrices are stored as; None for a safetensors checkpoint (or a
/// file that cannot be read: loading it says why).
pub fn gguf_main_type(weights: &Path) -> Option<WeightType> {
    is_gguf(weights).then(|| Gguf::open(weights).ok()?.main_type()).flatten()
}

/// Where a model's tensors come from: a safetensors checkpoint or a GGUF file, seen through the
/// same names (Hugging Face's, without `transformer.`) and layouts.
pub enum Weights {
    Safetensors(Checkpoint),
    Gguf(Gguf),
}

impl Weights {
    /// Opens `weights` (GGUF when its first bytes say so) and returns it with the config: from
    /// `config` for safetensors, from the GGUF's metadata otherwise. Checked against each other.
    pub fn open(config: &Path, weights: &Path) -> Result<(Config, Weights)> {
        if is_gguf(weights) {
            let g = Gguf::open(weights)?;
            let cfg = g.config()?;
            g.check(&cfg)?;
            return Ok((cfg, Weights::Gguf(g)));
        }
        let cfg = Config::from_file(config)?;
        let ck = Checkpoint::open(weights)?;
        ck.check(&cfg)?;
        Ok((cfg, Weights::Safetensors(ck)))
    }

    pub fn tensor(&self, name: &str, want: &[usize]) -> Result<Vec<f32>> {
        match self {
            Weights::Safetensors(ck) => ck.tensor(name, want),
            Weights::Gguf(g) => Ok(g.tensor(name, want)?.0),
        }
    }

    /// The type a matrix is held as: `dtype` when one is asked for, else as the file stores it
    /// (a GGUF tensor's own type; f32 for safetensors, as Hugging Face's checkpoints of GPT-2 are).
    pub fn held_type(&self, name: &str, dtype: Option<WeightType>) -> Result<WeightType> {
        match (dtype, self) {
            (Some(ty), _) => Ok(ty),
            (None, Weights::Safetensors(_)) => Ok(WeightType::F32),
            (None, Weights::Gguf(g)) => g.held_type(name),
        }
    }

    /// Weight matrix `name` held as `ty`, packed `[K, N]`: a Conv1D weight (`[K, N]` as Hugging
    /// Face stores it), or with `embedding` the token embedding `[N, K]` held transposed. A GGUF
    /// tensor of the same block type keeps the file's blocks; anything else is widened to f32
    /// (exactly) and converted. Streamed: the f32 matrix never exists whole.
    pub fn matrix(&self, name: &str, k: usize, n: usize, embedding: bool, ty: WeightType) -> Result<PackedMatrix> {
        let mut m = PackedMatrix::zeros(k, n, ty);
        let want = if embedding { [n, k] } else { [k, n] };
        if let Weights::Gguf(g) = self {
            if ty.ggml_block().is_some() && g.held_type(name)? == ty {
                // GGUF row r is column r of the packed matrix either way.
                g.block_rows(name, &want, |r, raw| m.set_col_blocks(r, raw).map_err(Error::Invalid))?;
                return Ok(m);
            }
        }
        if embedding {
            // Blocks of Q8_BLOCK rows (columns of the packed matrix), each converted in turn.
            let mut block = Vec::with_capacity(Q8_BLOCK * k);
            self.tensor_rows(name, &want, |r, row| {
                block.extend_from_slice(row);
                if block.len() == Q8_BLOCK * k || r + 1 == n {
                    m.set_cols(r + 1 - block.len() / k, &block);
                    block.clear();
                }
            })?;
        } else {
            self.tensor_rows(name, &want, |i, row| m.set_row(i, row))?;
        }
        Ok(m)
    }

    /// Streams the rows of tensor `name` to `f`; returns the stored type's name.
    pub fn tensor_rows(&self, name: &str, want: &[usize], f: impl FnMut(usize, &[f32])) -> Result<&'static str> {
        match self {
            Weights::Safetensors(ck) => ck.tensor_rows(name, want, f).map(Stored::name),
            Weights::Gguf(g) => g.tensor_rows(name, want, f),
        }
    }
}

/// Learned parameters of a model of `cfg`: the tensors it implies, `wte` counted once (it is tied).
pub fn parameter_count(cfg: &Config) -> usize {
    expected(cfg).map(|(_, dims)| dims.iter().map(|d| d.1).product::<usize>()).sum()
}
