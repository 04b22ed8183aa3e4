//! What a model is, without running it: its config, parameter count, the bytes its weights take
//! in each storage type, the KV cache's bytes, its tokenizer and the kernels' instruction set.
//! Reads the config, the weights file's header and the tokenizer; not the weights.

use kvgpt_core::error::Result;
use kvgpt_core::units::{bytes, count};
use kvgpt_core::weights::{self, Weights};
use kvgpt_core::{KvCache, KvType, Model, ModelFiles, Tokenizer, WeightType};
use kvgpt_kernels::Isa;
use serde::Serialize;
use std::fmt::{self, Write as _};

#[derive(Clone, Debug, Serialize)]
pub struct Info {
    pub name: String,
    pub files: Files,
    pub config: ConfigFacts,
    /// Learned parameters (the tensors the config implies: `wte` counted once, it is tied).
    pub parameters: usize,
    /// Bytes the weights take in memory, per `--dtype`.
    pub weight_bytes: Vec<DtypeBytes>,
    pub kv_cache: KvFacts,
    pub tokenizer: TokenizerFacts,
    pub kernels: KernelFacts,
    /// For a GGUF file: its version, architecture, tensor types and metadata (null otherwise).
    pub gguf: Option<weights::gguf::GgufFacts>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Files {
    pub config: String,
    pub weights: String,
    pub weights_file_bytes: u64,
    pub tokenizer: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConfigFacts {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub head_dim: usize,
    pub n_inner: usize,
    /// The context length: GPT-2's learned positions.
    pub n_positions: usize,
    pub vocab_size: usize,
    pub layer_norm_epsilon: f32,
    pub scale_attn_weights: bool,
    pub scale_attn_by_inverse_layer_idx: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DtypeBytes {
    pub dtype: &'static str,
    pub bytes: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct KvFacts {
    /// K and V of every layer for one position, f32.
    pub bytes_per_token: usize,
    /// The same at the full context (`n_positions` positions).
    pub bytes_full_context: usize,
    /// Bytes per position in each `--kv-dtype`.
    pub bytes_per_token_by_kv_dtype: Vec<KvDtypeBytes>,
}

#[derive(Clone, Debug, Serialize)]
pub struct KvDtypeBytes {
    pub kv_dtype: &'static str,
    pub bytes: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct TokenizerFacts {
    pub vocab_size: usize,
    pub bos_token_id: u32,
    pub eos_token_id: u32,
    pub eos_token: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct KernelFacts {
    /// The instruction set the kernels will use (the best this CPU has).
    pub isa: &'static str,
    /// Every instruction set usable here (all give the same bits).
    pub available: Vec<&'static str>,
    pub cpu_features: Vec<&'static str>,
}

/// Learned parameters of a `cfg` model: the tensors the config implies, `wte` counted once (tied).
pub fn parameters(cfg: &kvgpt_core::Config) -> usize {
    weights::parameter_count(cfg)
}

/// Describes the model in `files`, checking its weights file's header against its config.
pub fn describe(files: &ModelFiles) -> Result<Info> {
    let (cfg, weights) = Weights::open(&files.config, &files.weights)?;
    let gguf = match &weights {
        Weights::Gguf(g) => Some(g.facts()),
        _ => None,
    };
    let tokenizer = Tokenizer::from_files(&files.tokenizer)?;
    let weights_file_bytes = std::fs::metadata(&files.weights).map(|m| m.len()).unwrap_or(0);
    let parameters = parameters(&cfg);
    let per_token = KvCache::bytes_per_position(&cfg);
    Ok(Info {
        name: files.name.clone(),
        files: Files {
            config: files.config.display().to_string(),
            weights: files.weights.display().to_string(),
            weights_file_bytes,
            tokenizer: files.tokenizer.paths().iter().map(|p| p.display().to_string()).collect(),
        },
        config: ConfigFacts {
            n_layer: cfg.n_layer,
            n_head: cfg.n_head,
            n_embd: cfg.n_embd,
            head_dim: cfg.head_dim(),
            n_inner: cfg.n_inner,
            n_positions: cfg.n_positions,
            vocab_size: cfg.vocab_size,
            layer_norm_epsilon: cfg.layer_norm_epsilon,
            scale_attn_weights: cfg.scale_attn_weights,
            scale_attn_by_inverse_layer_idx: cfg.scale_attn_by_inverse_layer_idx,
        },
        parameters,
        weight_bytes: WeightType::ALL
            .iter()
            .map(|&ty| DtypeBytes { dtype: ty.name(), bytes: Model::weight_bytes_for(&cfg, ty) })
            .collect(),
        kv_cache: KvFacts {
            bytes_per_token: per_token,
            bytes_full_context: per_token * cfg.n_positions,
            bytes_per_token_by_kv_dtype: KvType::ALL
                .iter()
                .map(|&ty| KvDtypeBytes { kv_dtype: ty.name(), bytes: KvCache::bytes_per_position_as(&cfg, ty) })
                .collect(),
        },
        tokenizer: TokenizerFacts {
            vocab_size: tokenizer.vocab_size(),
            bos_token_id: cfg.bos_token_id,
            eos_token_id: cfg.eos_token_id,
            eos_token: tokenizer.token_text(cfg.eos_token_id),
        },
        kernels: KernelFacts {
            isa: Isa::detect().name(),
            available: Isa::available().iter().map(|i| i.name()).collect(),
            cpu_features: kvgpt_kernels::cpu_features(),
        },
        gguf,
    })
}

impl Info {
    /// What `kvgpt info` prints: the files, the shape, the bytes of the weights per type (`dtype`
    /// marked as the one asked for, else the file's own), the KV cache, the tokens, the kernels.
    pub fn text(&self, dtype: Option<WeightType>) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = self
            .files_text(&mut out)
            .and_then(|()| self.shape_text(&mut out))
            .and_then(|()| self.weights_text(&mut out, dtype))
            .and_then(|()| self.rest_text(&mut out));
        out
    }

    fn files_text(&self, out: &mut String) -> fmt::Result {
        writeln!(out, "model      {}", self.name)?;
        match &self.gguf {
            // One file holds the weights, the config and the tokenizer: said once, with its header.
            Some(g) => {
                let types: Vec<String> = g.tensor_types.iter().map(|(t, n)| format!("{n} {t}")).collect();
                writeln!(
                    out,
                    "file       {} ({}): GGUF version {}, architecture {}, {} ({}), {}",
                    self.files.weights,
                    bytes(g.file_bytes as usize),
                    g.version,
                    g.architecture.as_deref().unwrap_or("not given"),
                    count(g.tensors, "tensor"),
                    types.join(", "),
                    count(g.metadata_keys, "metadata key")
                )?;
                for (i, (k, v)) in g.metadata.iter().enumerate() {
                    writeln!(out, "{:<10} {k} = {v}", if i == 0 { "metadata" } else { "" })?;
                }
            }
            None => {
                writeln!(
                    out,
                    "files      {} ({}), {}",
                    self.files.weights,
                    bytes(self.files.weights_file_bytes as usize),
                    self.files.config
                )?;
                writeln!(out, "tokenizer  {}", self.files.tokenizer.join(", "))?;
            }
        }
        Ok(())
    }

    fn shape_text(&self, out: &mut String) -> fmt::Result {
        let c = &self.config;
        writeln!(
            out,
            "shape      {} layers, {} heads × {} = {} channels, MLP {}, vocabulary {}, context {} positions",
            c.n_layer, c.n_head, c.head_dim, c.n_embd, c.n_inner, c.vocab_size, c.n_positions
        )?;
        let scale = match (c.scale_attn_weights, c.scale_attn_by_inverse_layer_idx) {
            (true, false) => format!("× 1/√{}", c.head_dim),
            (true, true) => format!("× 1/√{} / (layer + 1)", c.head_dim),
            (false, true) => "× 1 / (layer + 1)".to_string(),
            (false, false) => "unscaled".to_string(),
        };
        writeln!(out, "           LayerNorm eps {:e}; attention scores {scale}", c.layer_norm_epsilon)?;
        writeln!(
            out,
            "parameters {} ({:.1} M; wte is tied to the vocabulary projection)",
            self.parameters,
            self.parameters as f64 / 1e6
        )?;
        Ok(())
    }

    fn weights_text(&self, out: &mut String, dtype: Option<WeightType>) -> fmt::Result {
        let c = &self.config;
        // The type the weights would be held as: --dtype's, else the GGUF's own, else f32.
        let stored = self.gguf.as_ref().and_then(|g| g.main_type);
        let (chosen, why) = match (dtype, stored) {
            (Some(ty), _) => (ty, "(--dtype)"),
            (None, Some(ty)) => (ty, "(as the file stores it; the default)"),
            (None, None) => (WeightType::F32, "(the default)"),
        };
        writeln!(out, "weights    held in memory, per --dtype:")?;
        for d in &self.weight_bytes {
            let mark = if d.dtype == chosen.name() { format!("  {why}") } else { String::new() };
            writeln!(out, "             {:<5} {:>10}{mark}", d.dtype, bytes(d.bytes))?;
        }
        writeln!(
            out,
            "KV cache   {} per token (K and V, {} layers × {} floats each), {} at the full {} positions",
            bytes(self.kv_cache.bytes_per_token),
            c.n_layer,
            c.n_embd,
            bytes(self.kv_cache.bytes_full_context),
            c.n_positions
        )?;
        let per: Vec<String> = self
            .kv_cache
            .bytes_per_token_by_kv_dtype
            .iter()
            .map(|d| format!("{} {}", d.kv_dtype, bytes(d.bytes)))
            .collect();
        writeln!(out, "           per token by --kv-dtype: {}", per.join(", "))?;
        Ok(())
    }

    fn rest_text(&self, out: &mut String) -> fmt::Result {
        let t = &self.tokenizer;
        writeln!(
            out,
            "tokens     {} ids, byte-level BPE; {:?} = {} ends a text (eos){}",
            t.vocab_size,
            t.eos_token,
            t.eos_token_id,
            if t.bos_token_id == t.eos_token_id {
                " and starts an empty prompt (bos)".to_string()
            } else {
                format!(", bos {}", t.bos_token_id)
            }
        )?;
        let k = &self.kernels;
        writeln!(
            out,
            "kernels    {} (available here: {}; CPU: {})",
            k.isa,
            k.available.join(", "),
            k.cpu_features.join(" ")
        )?;
        Ok(())
    }
}
