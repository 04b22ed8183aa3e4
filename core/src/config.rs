//! GPT-2 hyper-parameters from `config.json`: parsing, validation and derived sizes.

use crate::error::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// The hyper-parameters the forward pass needs. Dimension names: `L` = n_layer, `NH` = n_head,
/// `C` = n_embd, `HS` = head size, `F` = n_inner, `V` = vocab_size.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub n_positions: usize,
    pub n_inner: usize,
    pub vocab_size: usize,
    pub layer_norm_epsilon: f32,
    pub scale_attn_weights: bool,
    pub scale_attn_by_inverse_layer_idx: bool,
    pub bos_token_id: u32,
    pub eos_token_id: u32,
}

impl Config {
    /// Columns of the fused QKV projection, `3·C` (checked not to overflow when the config is read).
    pub fn qkv_width(&self) -> usize {
        3 * self.n_embd
    }

    /// Head size `HS = C / NH`.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// The score multiplier of layer `layer`: `1/√HS` (if scaled), divided by `layer+1` (if asked).
    pub fn attn_scale(&self, layer: usize) -> f32 {
        let mut s = 1.0f32;
        if self.scale_attn_weights {
            s /= (self.head_dim() as f32).sqrt();
        }
        if self.scale_attn_by_inverse_layer_idx {
            s /= (layer + 1) as f32;
        }
        s
    }

    pub fn from_file(path: &Path) -> Result<Config> {
        let bytes = crate::files::read(path, "a config.json", 16 << 20, crate::files::Kinds::RegularOnly)?;
        let json: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::BadConfig { file: path.into(), reason: format!("not valid JSON: {e}") })?;
        Config::from_json(&json, path)
    }

    /// Reads the GPT-2 keys; unknown keys are ignored, unsupported values refused by name.
    pub fn from_json(json: &Value, path: &Path) -> Result<Config> {
        let obj = json
            .as_object()
            .ok_or_else(|| Error::BadConfig { file: path.into(), reason: "expected a JSON object".into() })?;
        let keys = Keys { obj, file: path };
        keys.check_architecture()?;
        let n_embd = keys.usize(&["n_embd", "hidden_size"], None)?;
        let n_head = keys.usize(&["n_head", "num_attention_heads"], None)?;
        if n_embd.checked_mul(4).is_none_or(|x| x > u32::MAX as usize) {
            return Err(keys.unsupported("n_embd", &n_embd.into(), "too large (at most 2^32 / 4)"));
        }
        if !n_embd.is_multiple_of(n_head) {
            let why = format!("n_embd ({n_embd}) must be a multiple of it");
            return Err(keys.unsupported("n_head", &n_head.into(), &why));
        }
        let layer_norm_epsilon = keys.epsilon()?;
        let cfg = Config {
            n_layer: keys.usize(&["n_layer", "num_hidden_layers"], None)?,
            n_head,
            n_embd,
            n_positions: keys.usize(&["n_positions", "n_ctx"], None)?,
            n_inner: keys.usize(&["n_inner"], Some(4 * n_embd))?,
            vocab_size: keys.usize(&["vocab_size"], None)?,
            layer_norm_epsilon,
            scale_attn_weights: keys.bool("scale_attn_weights", true)?,
            scale_attn_by_inverse_layer_idx: keys.bool("scale_attn_by_inverse_layer_idx", false)?,
            bos_token_id: keys.token_id("bos_token_id")?,
            eos_token_id: keys.token_id("eos_token_id")?,
        };
        for (key, id) in [("eos_token_id", cfg.eos_token_id), ("bos_token_id", cfg.bos_token_id)] {
            if id as usize >= cfg.vocab_size {
                let why = format!(
                    "outside the vocabulary of {} tokens{}",
                    cfg.vocab_size,
                    if obj.get(key).is_none() { " (50256 is GPT-2's default; set the key)" } else { "" }
                );
                return Err(keys.unsupported(key, &id.into(), &why));
            }
        }
        Ok(cfg)
    }
}

/// A config.json's keys, read one by one with the error that names a wrong one.
struct Keys<'a> {
    obj: &'a serde_json::Map<String, Value>,
    file: &'a Path,
}

impl Keys<'_> {
    fn unsupported(&self, key: &str, value: &Value, why: &str) -> Error {
        Error::UnsupportedConfig { file: self.file.into(), key: key.into(), value: value.to_string(), why: why.into() }
    }

    /// The first of `keys` present (null counts as absent), a positive integer; else `default`.
    fn usize(&self, keys: &[&str], default: Option<usize>) -> Result<usize> {
        for key in keys {
            match self.obj.get(*key) {
                None | Some(Value::Null) => continue,
                Some(v) => {
                    return v
                        .as_u64()
                        .filter(|&n| n > 0)
                        .map(|n| n as usize)
                        .ok_or_else(|| self.unsupported(key, v, "expected a positive integer"))
                }
            }
        }
        default.ok_or_else(|| Error::BadConfig { file: self.file.into(), reason: format!("missing key `{}`", keys[0]) })
    }

    fn bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.unsupported(key, v, "expected true or false")),
        }
    }

    fn epsilon(&self) -> Result<f32> {
        match self.obj.get("layer_norm_epsilon") {
            None | Some(Value::Null) => Ok(1e-5),
            Some(v) => v.as_f64().map(|e| e as f32).filter(|e| *e > 0.0 && e.is_finite()).ok_or_else(|| {
                self.unsupported("layer_norm_epsilon", v, "expected a positive number that fits in f32")
            }),
        }
    }

    fn token_id(&self, key: &str) -> Result<u32> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(50256),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.unsupported(key, v, "expected a token id")),
        }
    }

    /// Refuses what is not GPT-2 as kvgpt runs it.
    fn check_architecture(&self) -> Result<()> {
        if let Some(v) = self.obj.get("model_type") {
            if v.as_str() != Some("gpt2") {
                return Err(self.unsupported("model_type", v, "kvgpt runs GPT-2 checkpoints (model_type \"gpt2\")"));
            }
        }
        if let Some(v) = self.obj.get("activation_function") {
            if !matches!(v.as_str(), Some("gelu_new") | Some("gelu_pytorch_tanh")) {
                return Err(self.unsupported(
                    "activation_function",
                    v,
                    "kvgpt implements GPT-2's tanh GELU (\"gelu_new\" / \"gelu_pytorch_tanh\")",
                ));
            }
        }
        if self.bool("add_cross_attention", false)? {
            let why = "encoder-decoder GPT-2 is not supported";
            return Err(self.unsupported("add_cross_attention", &Value::Bool(true), why));
        }
        if !self.bool("tie_word_embeddings", true)? {
            let why = "GPT-2 ties the vocabulary projection to wte; an untied lm_head is not supported";
            return Err(self.unsupported("tie_word_embeddings", &Value::Bool(false), why));
        }
        // reorder_and_upcast_attn only changes precision in fp16 training; in f32 it is the same math.
        self.bool("reorder_and_upcast_attn", false)?;
        Ok(())
    }
}
