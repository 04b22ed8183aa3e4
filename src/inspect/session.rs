//! What every view shares: the common flags, the session (the loaded model and the prompt's
//! ids) and writing files.

use crate::common::{load, prompt_ids, read_prompt, Input};
use anyhow::{bail, Result};
use clap::Args;
use kvgpt_core::export::{self, Named};
use kvgpt_core::Loaded;
use std::path::{Path, PathBuf};

#[derive(Args, Clone)]
pub struct Common {
    #[command(flatten)]
    pub io: Input,
    /// Write the tensors shown to FILE.safetensors (all) or FILE.npy (the main one), for numpy.
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct Select {
    /// Only this layer (0-based).
    #[arg(long)]
    pub layer: Option<usize>,
    /// Only this head (0-based).
    #[arg(long)]
    pub head: Option<usize>,
}

/// The loaded model, the prompt text and its ids.
pub struct Session {
    pub loaded: Loaded,
    pub ids: Vec<u32>,
}

impl Session {
    pub fn open(c: &Common) -> Result<Session> {
        let text = read_prompt(&c.io.prompt)?;
        let loaded = load(&c.io.model)?;
        let ids = prompt_ids(&loaded, &text)?;
        Ok(Session { loaded, ids })
    }

    pub fn labels(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&i| self.loaded.tokenizer.token_label(i)).collect()
    }

    pub fn label(&self, id: u32) -> String {
        self.loaded.tokenizer.token_label(id)
    }
}

pub use kvgpt_views::inspect::selected;

/// Checks an output path before any work, so a typo does not cost a long run.
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!("cannot write {}: the folder {} does not exist", path.display(), dir.display());
    }
    Ok(())
}

pub fn write_text(path: &Path, text: &str) -> Result<()> {
    Ok(export::write_atomic(path, text.as_bytes())?)
}

pub fn do_export(c: &Common, tensors: &[Named]) -> Result<()> {
    if let Some(path) = &c.export {
        let names = export::write(path, tensors)?;
        errln!("[kvgpt] wrote {} ({})", path.display(), names.join(", "));
    }
    Ok(())
}
