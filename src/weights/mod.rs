//! Where a model's tensors come from: a safetensors checkpoint or a GGUF file, seen through the
//! same names (the table in [`names`]) and layouts, each tensor converted to f32 and checked.

pub mod gguf;
mod gguf_header;
pub mod names;
mod read;
pub mod safetensors;

pub use gguf::{is_gguf, Gguf};
pub use names::expected;
pub use safetensors::{parse_header, Checkpoint, Stored};

use crate::config::Config;
use crate::error::Result;
use std::path::Path;

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

    /// Streams the rows of tensor `name` to `f`; returns the stored type's name.
    pub fn tensor_rows(&self, name: &str, want: &[usize], f: impl FnMut(usize, &[f32])) -> Result<&'static str> {
        match self {
            Weights::Safetensors(ck) => ck.tensor_rows(name, want, f).map(Stored::name),
            Weights::Gguf(g) => g.tensor_rows(name, want, f),
        }
    }
}
