//! What a model is, without running it: its config, parameter count, the bytes its weights take
//! in each storage type, the KV cache's bytes, its tokenizer and the kernels' instruction set.
//! Reads the config, the weights file's header and the tokenizer; not the weights.

use kvgpt_core::error::Result;
use kvgpt_core::weights::{self, Weights};
use kvgpt_core::{KvCache, Model, ModelFiles, Tokenizer, WeightType};
use kvgpt_kernels::Isa;
use serde::Serialize;

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
    weights::expected(cfg).iter().map(|(_, dims)| dims.iter().map(|d| d.1).product::<usize>()).sum()
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
        kv_cache: KvFacts { bytes_per_token: per_token, bytes_full_context: per_token * cfg.n_positions },
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
