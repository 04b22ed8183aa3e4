//! The one table of GPT-2's tensors: their Hugging Face names (without `transformer.`), their
//! shapes in config keys, and what llama.cpp's converter calls them in a GGUF. The model loads by
//! these names, each checkpoint format checks against them, and `info` counts parameters from them.

use crate::config::Config;

/// A size of a tensor, named by the config key it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    Embd,
    Qkv,
    Inner,
    Vocab,
    Positions,
}

impl Dim {
    /// The config key, as errors name it.
    pub fn key(self) -> &'static str {
        match self {
            Dim::Embd => "n_embd",
            Dim::Qkv => "3·n_embd",
            Dim::Inner => "n_inner",
            Dim::Vocab => "vocab_size",
            Dim::Positions => "n_positions",
        }
    }

    pub fn size(self, cfg: &Config) -> usize {
        match self {
            Dim::Embd => cfg.n_embd,
            Dim::Qkv => cfg.qkv_width(),
            Dim::Inner => cfg.n_inner,
            Dim::Vocab => cfg.vocab_size,
            Dim::Positions => cfg.n_positions,
        }
    }
}

/// One tensor: its Hugging Face name (for a block's tensor, the part after `h.{i}.`), its shape,
/// its GGUF name (after `blk.{i}.` for a block's) and whether the GGUF stores it transposed.
pub struct Entry {
    pub hf: &'static str,
    pub dims: &'static [Dim],
    pub gguf: &'static str,
    pub gguf_transposed: bool,
}

// The modules of a block, as the model names them (`{module}.weight`, `{module}.bias`).
pub const LN_1: &str = "ln_1";
pub const C_ATTN: &str = "attn.c_attn";
pub const ATTN_C_PROJ: &str = "attn.c_proj";
pub const LN_2: &str = "ln_2";
pub const C_FC: &str = "mlp.c_fc";
pub const MLP_C_PROJ: &str = "mlp.c_proj";
// The model's other tensors.
pub const WTE: &str = "wte.weight";
pub const WPE: &str = "wpe.weight";
pub const LN_F: &str = "ln_f";

const fn e(hf: &'static str, dims: &'static [Dim], gguf: &'static str, gguf_transposed: bool) -> Entry {
    Entry { hf, dims, gguf, gguf_transposed }
}

use Dim::*;

/// The tensors outside the blocks.
pub const GLOBAL: [Entry; 4] = [
    e("wte.weight", &[Vocab, Embd], "token_embd.weight", false),
    e("wpe.weight", &[Positions, Embd], "position_embd.weight", false),
    e("ln_f.weight", &[Embd], "output_norm.weight", false),
    e("ln_f.bias", &[Embd], "output_norm.bias", false),
];

/// The tensors of block `i`, after `h.{i}.` (HF) and `blk.{i}.` (GGUF).
pub const BLOCK: [Entry; 12] = [
    e("ln_1.weight", &[Embd], "attn_norm.weight", false),
    e("ln_1.bias", &[Embd], "attn_norm.bias", false),
    e("attn.c_attn.weight", &[Embd, Qkv], "attn_qkv.weight", true),
    e("attn.c_attn.bias", &[Qkv], "attn_qkv.bias", false),
    e("attn.c_proj.weight", &[Embd, Embd], "attn_output.weight", true),
    e("attn.c_proj.bias", &[Embd], "attn_output.bias", false),
    e("ln_2.weight", &[Embd], "ffn_norm.weight", false),
    e("ln_2.bias", &[Embd], "ffn_norm.bias", false),
    e("mlp.c_fc.weight", &[Embd, Inner], "ffn_up.weight", true),
    e("mlp.c_fc.bias", &[Inner], "ffn_up.bias", false),
    e("mlp.c_proj.weight", &[Inner, Embd], "ffn_down.weight", true),
    e("mlp.c_proj.bias", &[Embd], "ffn_down.bias", false),
];

/// The full name of `module` in block `i` (`h.{i}.{module}`).
pub fn block(i: usize, module: &str) -> String {
    format!("h.{i}.{module}")
}

/// Every tensor (without prefix) a GPT-2 checkpoint of this config must hold, with its shape as
/// (config key, size) pairs.
pub fn expected(cfg: &Config) -> impl Iterator<Item = (String, Vec<(&'static str, usize)>)> + '_ {
    // An iterator: a config that claims 2^32 layers costs nothing until a file is checked
    // against it, which stops at the first block it lacks.
    let shape = move |dims: &[Dim]| dims.iter().map(|d| (d.key(), d.size(cfg))).collect::<Vec<_>>();
    let global = |range: std::ops::Range<usize>| GLOBAL[range].iter().map(move |t| (t.hf.to_string(), shape(t.dims)));
    let blocks = (0..cfg.n_layer).flat_map(move |i| BLOCK.iter().map(move |t| (block(i, t.hf), shape(t.dims))));
    global(0..2).chain(blocks).chain(global(2..GLOBAL.len()))
}

/// The blocks a file's tensor names hold (`h.{i}.…` or `blk.{i}.…`): the highest index + 1.
pub fn blocks_held<'a>(names: impl Iterator<Item = &'a str>, prefix: &str) -> usize {
    names.filter_map(|n| n.strip_prefix(prefix)?.split('.').next()?.parse::<usize>().ok()).max().map_or(0, |b| b + 1)
}

/// The GGUF name of Hugging Face name `hf`, and whether the GGUF stores it transposed.
pub fn gguf_name(hf: &str) -> Option<(String, bool)> {
    if let Some(t) = GLOBAL.iter().find(|t| t.hf == hf) {
        return Some((t.gguf.to_string(), t.gguf_transposed));
    }
    let (i, part) = hf.strip_prefix("h.")?.split_once('.')?;
    let t = BLOCK.iter().find(|t| t.hf == part)?;
    Some((format!("blk.{i}.{}", t.gguf), t.gguf_transposed))
}
