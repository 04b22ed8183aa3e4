//! Locating a model: a local folder, or a Hugging Face Hub id resolved through the standard HF
//! cache (downloaded with hf-hub when online, with a progress bar on a terminal).

use crate::error::{Error, Result};
use std::io::IsTerminal;
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

/// How to find a model named on the command line.
#[derive(Clone, Debug)]
pub struct Locate {
    /// Use only the local HF cache, never the network.
    pub offline: bool,
    /// The HF hub cache folder (`…/huggingface/hub`).
    pub cache_dir: PathBuf,
}

impl Locate {
    /// Reads the standard variables: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`; offline when `offline` or `HF_HUB_OFFLINE` is 1/true/yes/on.
    pub fn from_env(offline: bool) -> Locate {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let cache_dir = env("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| {
            env("HF_HOME")
                .map(|h| PathBuf::from(h).join("hub"))
                .unwrap_or_else(|| hf_hub::Cache::default().path().clone())
        });
        let env_offline = std::env::var("HF_HUB_OFFLINE")
            .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
            .unwrap_or(false);
        Locate { offline: offline || env_offline, cache_dir }
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

    /// The files of hub model `id`, from the cache or (online) downloaded into it.
    fn hub(&self, id: &str) -> Result<ModelFiles> {
        let cache = hf_hub::Cache::new(self.cache_dir.clone()).model(id.to_string());
        let api = if self.offline {
            None
        } else {
            let api = hf_hub::api::sync::ApiBuilder::new()
                .with_cache_dir(self.cache_dir.clone())
                .with_progress(false)
                .build()
                .map_err(|e| Error::Hub(format!("could not set up the Hugging Face Hub client: {e}")))?;
            Some(api.model(id.to_string()))
        };
        let fetch = |file: &str| -> Result<PathBuf> {
            if let Some(p) = cache.get(file) {
                return Ok(p);
            }
            let Some(repo) = &api else {
                return Err(Error::NotCached { id: id.into(), file: file.into(), cache_dir: self.cache_dir.clone() });
            };
            let progress = std::io::stderr().is_terminal().then(DownloadBar::default);
            let got = match progress {
                Some(bar) => repo.download_with_progress(file, bar),
                None => repo.download_with_progress(file, ()),
            };
            got.map_err(|e| Error::HubFetch { id: id.into(), file: file.into(), reason: e.to_string() })
        };
        assemble(id.to_string(), fetch)
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
        } else {
            Err(Error::MissingFile {
                path: p,
                hint: "a model folder needs config.json, model.safetensors and tokenizer.json (or vocab.json + merges.txt)".into(),
            })
        }
    };
    assemble(dir.display().to_string(), need)
}

/// Download progress on stderr.
#[derive(Default)]
struct DownloadBar(Option<indicatif::ProgressBar>);

impl hf_hub::api::Progress for DownloadBar {
    fn init(&mut self, size: usize, filename: &str) {
        let bar = indicatif::ProgressBar::new(size as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(filename.to_string());
        self.0 = Some(bar);
    }
    fn update(&mut self, size: usize) {
        if let Some(b) = &self.0 {
            b.inc(size as u64);
        }
    }
    fn finish(&mut self) {
        if let Some(b) = self.0.take() {
            b.finish();
        }
    }
}
