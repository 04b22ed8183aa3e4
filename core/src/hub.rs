//! Locating a model: a local folder, a GGUF file, or a Hugging Face Hub id resolved through the
//! standard HF cache (downloaded with hf-hub when online, from `HF_ENDPOINT` if set, with a
//! progress bar on a terminal: `hub/download.rs`).

mod download;
mod env;

use crate::error::{Error, Result};
use crate::files::Inputs;
use std::path::{Path, PathBuf};

/// The default model.
pub const DEFAULT_MODEL: &str = "distilbert/distilgpt2";

/// Where a model's files are.
#[derive(Clone, Debug)]
pub struct ModelFiles {
    /// What the user named: a folder path or a hub id.
    pub name: String,
    pub config: PathBuf,
    pub weights: PathBuf,
    pub tokenizer: TokenizerFiles,
}

impl ModelFiles {
    /// These files as inputs of a run, each named as `whose` ("the model's", "the draft
    /// model's") config, weights or tokenizer.
    pub fn inputs(&self, whose: &str) -> Inputs {
        // A GGUF holds its config and tokenizer: it is named once, as the weights.
        let mut inputs = Inputs::default().with(&self.weights, &format!("{whose} weights"));
        if self.config != self.weights {
            inputs = inputs.with(&self.config, &format!("{whose} config"));
        }
        for p in self.tokenizer.paths().into_iter().filter(|p| *p != self.weights) {
            inputs = inputs.with(&p, &format!("{whose} tokenizer"));
        }
        inputs
    }
}

#[derive(Clone, Debug)]
pub enum TokenizerFiles {
    Json(PathBuf),
    VocabMerges {
        vocab: PathBuf,
        merges: PathBuf,
    },
    /// The vocabulary and merges in a GGUF file's metadata.
    Gguf(PathBuf),
}

impl TokenizerFiles {
    /// The files read.
    pub fn paths(&self) -> Vec<PathBuf> {
        match self {
            TokenizerFiles::Json(p) | TokenizerFiles::Gguf(p) => vec![p.clone()],
            TokenizerFiles::VocabMerges { vocab, merges } => vec![vocab.clone(), merges.clone()],
        }
    }
}

/// How to find a model named on the command line, and where to download a hub id from.
///
/// [`Locate::from_env`] fills it from huggingface_hub's environment variables (`HF_ENDPOINT`,
/// `HF_HUB_CACHE`, `HF_HOME`, `HF_TOKEN`, `HF_HUB_OFFLINE`, …; see `hub/env.rs`).
#[derive(Clone)]
pub struct Locate {
    /// Use only the local HF cache, never the network.
    pub offline: bool,
    /// The HF hub cache folder (`…/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// The Hub's base URL without a trailing slash (a mirror's, from `HF_ENDPOINT`); `None` for
    /// hf-hub's default, the public Hugging Face Hub.
    pub endpoint: Option<String>,
    /// The access token sent as `Authorization: Bearer …`.
    pub token: Option<String>,
    /// Draw a progress bar while downloading, when stderr is a terminal.
    pub progress: bool,
    /// Added to the user agent as `origin/…` (`HF_HUB_USER_AGENT_ORIGIN`).
    pub user_agent_origin: Option<String>,
}

impl std::fmt::Debug for Locate {
    // The token stays out of logs and error reports.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locate")
            .field("offline", &self.offline)
            .field("cache_dir", &self.cache_dir)
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("progress", &self.progress)
            .field("user_agent_origin", &self.user_agent_origin)
            .finish()
    }
}

impl Locate {
    /// Online, with the public Hub, no token and a progress bar, caching in `cache_dir`.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Locate {
        Locate {
            offline: false,
            cache_dir: cache_dir.into(),
            endpoint: None,
            token: None,
            progress: true,
            user_agent_origin: None,
        }
    }

    /// Resolves `spec`: an existing folder is used as it is; anything else is a hub id.
    pub fn resolve(&self, spec: &str) -> Result<ModelFiles> {
        let path = Path::new(spec);
        if path.is_dir() {
            return local_folder(path);
        }
        if path.is_file() && crate::weights::is_gguf(path) {
            // A GGUF holds the config, the weights and the tokenizer in one file.
            let p = path.to_path_buf();
            return Ok(ModelFiles {
                name: spec.into(),
                config: p.clone(),
                weights: p.clone(),
                tokenizer: TokenizerFiles::Gguf(p),
            });
        }
        if path.exists() {
            // Not opened: a FIFO would block the open for ever.
            crate::files::check(path, "a model file", u64::MAX, crate::files::Kinds::RegularOnly)?;
            return Err(Error::NotAModel {
                spec: spec.into(),
                why: "it is a file but not a GGUF; a model is a GGUF file or the folder that holds config.json, \
                      model.safetensors and tokenizer.json"
                    .into(),
            });
        }
        if spec.trim().is_empty() {
            return Err(Error::NotAModel {
                spec: format!("{spec:?}"),
                why: "the name is empty; a model is a folder (config.json, model.safetensors, tokenizer.json) or a \
                      hub id like distilbert/distilgpt2"
                    .into(),
            });
        }
        // A name that ends like a model file is a file, never a hub id.
        let lower = spec.to_ascii_lowercase();
        if [".gguf", ".safetensors"].iter().any(|ext| lower.ends_with(ext)) {
            return Err(Error::MissingFile {
                path: path.to_path_buf(),
                hint: "check the file's name and folder (a model is a GGUF file, a folder with config.json, \
                       model.safetensors and tokenizer.json, or a hub id like distilbert/distilgpt2)"
                    .into(),
            });
        }
        let hub_id = |s: &str| {
            let part = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            let mut it = s.split('/');
            it.next().is_some_and(part) && it.next().is_none_or(part) && it.next().is_none()
        };
        let looks_like_path = spec.starts_with(['.', '/', '~']) || spec.matches('/').count() > 1 || spec.contains('\\');
        if !looks_like_path && !hub_id(spec) {
            return Err(Error::NotAModel {
                spec: spec.into(),
                why: "no such folder, and not a hub id (letters, digits, '.', '_', '-', one '/': \
                      distilbert/distilgpt2)"
                    .into(),
            });
        }
        if looks_like_path {
            return Err(Error::NotAModel {
                spec: spec.into(),
                why: "not found; a model is a folder (config.json, model.safetensors, tokenizer.json) or a hub id \
                      like distilbert/distilgpt2"
                    .into(),
            });
        }
        self.hub(spec)
    }
}

/// The files of a model, each found by `find`: config, weights, and tokenizer.json or else
/// vocab.json + merges.txt (the error names tokenizer.json when neither is there).
fn assemble(name: String, find: impl Fn(&str) -> Result<PathBuf>) -> Result<ModelFiles> {
    let config = find("config.json")?;
    let weights = find("model.safetensors")?;
    let tokenizer = match find("tokenizer.json") {
        Ok(p) => TokenizerFiles::Json(p),
        Err(first) => match (find("vocab.json"), find("merges.txt")) {
            (Ok(vocab), Ok(merges)) => TokenizerFiles::VocabMerges { vocab, merges },
            _ => return Err(first),
        },
    };
    Ok(ModelFiles { name, config, weights, tokenizer })
}

/// A model folder on disk.
pub fn local_folder(dir: &Path) -> Result<ModelFiles> {
    let need = |f: &str| -> Result<PathBuf> {
        let p = dir.join(f);
        if p.is_file() {
            Ok(p)
        } else if p.is_dir() {
            Err(Error::NotAFile { path: p })
        } else if p.exists() {
            // A FIFO or a device, never opened (a FIFO would block the open for ever).
            crate::files::check(&p, &format!("{f} of a model folder"), u64::MAX, crate::files::Kinds::RegularOnly)?;
            Ok(p)
        } else {
            Err(Error::MissingFile {
                path: p,
                hint: "a model folder needs config.json, model.safetensors and tokenizer.json (or vocab.json + merges.txt)".into(),
            })
        }
    };
    assemble(dir.display().to_string(), need)
}
