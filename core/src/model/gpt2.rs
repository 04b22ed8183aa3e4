//! GPT-2's parts as they are held in memory, and how they are loaded by the tensor-name table.

use super::fingerprint::{self, Fingerprint, Part};
use crate::config::Config;
use crate::error::Result;
use crate::kv_cache::{KvCache, KvSpec};
use crate::weights::{names, Weights};
use kvgpt_kernels::{self as k, Isa, PackedMatrix, WeightType};
use rayon::prelude::*;
use std::path::Path;

#[derive(Clone)]
pub struct LayerNorm {
    pub weight: Vec<f32>, // [C]
    pub bias: Vec<f32>,   // [C]
}

/// GPT-2's Conv1D: `y = x @ weight + bias`, weight `[in, out]` packed into column panels.
pub struct Conv1D {
    pub weight: PackedMatrix, // [n_in, n_out]
    pub bias: Vec<f32>,       // [n_out]
}

pub struct Block {
    pub ln_1: LayerNorm,
    pub c_attn: Conv1D,      // [C, 3C]
    pub attn_c_proj: Conv1D, // [C, C]
    pub ln_2: LayerNorm,
    pub c_fc: Conv1D,       // [C, F]
    pub mlp_c_proj: Conv1D, // [F, C]
}

/// An immutable GPT-2. All state of a run lives in the [`KvCache`] and the [`Scratch`].
pub struct Model {
    pub config: Config,
    /// The token embedding `[V, C]`, held transposed as `[C, V]` panels: the tied vocabulary
    /// projection `x @ wteᵀ` then streams it like any other weight, and a token's embedding is
    /// column `id`.
    pub wte: PackedMatrix, // [C, V]
    pub wpe: Vec<f32>, // [n_positions, C]
    /// The vocabulary projection's bias: none (zeros, added exactly).
    pub(super) no_bias: Vec<f32>, // [V]
    pub h: Vec<Block>,
    pub ln_f: LayerNorm,
    /// How the matrices are held for computation (accumulation is always f32).
    pub dtype: WeightType,
    pub(super) isa: Isa,
    /// How the caches made for it ([`Model::new_cache`]) hold K/V.
    pub(super) kv: KvSpec,
    /// Every weight byte as held, hashed once at load ([`Model::fingerprint`]).
    pub(super) fingerprint: Fingerprint,
}

impl Conv1D {
    fn load(ck: &Weights, name: &str, n_in: usize, n_out: usize, dtype: Option<WeightType>) -> Result<Conv1D> {
        let w = format!("{name}.weight");
        let weight = ck.matrix(&w, n_in, n_out, false, ck.held_type(&w, dtype)?)?;
        Ok(Conv1D { weight, bias: ck.tensor(&format!("{name}.bias"), &[n_out])? })
    }

    /// `out[T, n_out] = inp[T, n_in] @ weight + bias`.
    pub(super) fn forward(&self, isa: Isa, out: &mut [f32], inp: &[f32], t: usize, acts: &mut k::QuantizedActs) {
        k::matmul_packed(isa, out, inp, &self.weight, &self.bias, t, acts);
    }
}

impl LayerNorm {
    fn load(ck: &Weights, name: &str, c: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: ck.tensor(&format!("{name}.weight"), &[c])?,
            bias: ck.tensor(&format!("{name}.bias"), &[c])?,
        })
    }

    /// `out[T, C] = layernorm(inp[T, C])`.
    pub(super) fn forward(&self, isa: Isa, out: &mut [f32], inp: &[f32], t: usize, eps: f32) {
        k::layernorm(isa, out, inp, &self.weight, &self.bias, t, self.weight.len(), eps);
    }
}

impl Model {
    /// Loads `config.json` and `model.safetensors`, holding the weights in f32.
    pub fn load(config_path: &Path, weights_path: &Path) -> Result<Model> {
        Model::load_as(config_path, weights_path, WeightType::F32)
    }

    /// Loads the model holding its matrices as `dtype` (converted or quantized at load time;
    /// LayerNorms, biases and `wpe` stay f32).
    pub fn load_as(config_path: &Path, weights_path: &Path, dtype: WeightType) -> Result<Model> {
        Model::load_holding(config_path, weights_path, Some(dtype))
    }

    /// Loads the model holding its matrices as `dtype`, or with None as the file stores each
    /// (a GGUF's own types; f32 from safetensors).
    pub fn load_holding(config_path: &Path, weights_path: &Path, dtype: Option<WeightType>) -> Result<Model> {
        let (config, ck) = Weights::open(config_path, weights_path)?;
        let (c, f) = (config.n_embd, config.n_inner);
        let v = config.vocab_size;
        // wte (the largest tensor) on one worker while the blocks load on the others.
        let (wte, h) = rayon::join(
            || ck.matrix(names::WTE, c, v, true, ck.held_type(names::WTE, dtype)?),
            || {
                (0..config.n_layer)
                    .into_par_iter()
                    .map(|i| {
                        let name = |module| names::block(i, module);
                        Ok(Block {
                            ln_1: LayerNorm::load(&ck, &name(names::LN_1), c)?,
                            c_attn: Conv1D::load(&ck, &name(names::C_ATTN), c, 3 * c, dtype)?,
                            attn_c_proj: Conv1D::load(&ck, &name(names::ATTN_C_PROJ), c, c, dtype)?,
                            ln_2: LayerNorm::load(&ck, &name(names::LN_2), c)?,
                            c_fc: Conv1D::load(&ck, &name(names::C_FC), c, f, dtype)?,
                            mlp_c_proj: Conv1D::load(&ck, &name(names::MLP_C_PROJ), f, c, dtype)?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()
            },
        );
        let (wte, h) = (wte?, h?);
        let wpe = ck.tensor(names::WPE, &[config.n_positions, c])?;
        let ln_f = LayerNorm::load(&ck, names::LN_F, c)?;
        Ok(Model::assemble(config, wte, wpe, h, ln_f))
    }

    /// The model of these tensors, as loading makes it: named by its blocks' held type (a GGUF's
    /// file type names the same), the detected instruction set, the default K/V, its fingerprint.
    fn assemble(config: Config, wte: PackedMatrix, wpe: Vec<f32>, h: Vec<Block>, ln_f: LayerNorm) -> Model {
        let dtype = h.first().map_or(wte.weight_type(), |b: &Block| b.c_fc.weight.weight_type());
        let mut model = Model {
            wte,
            no_bias: vec![0.0; config.vocab_size],
            wpe,
            h,
            ln_f,
            dtype,
            isa: Isa::detect(),
            kv: KvSpec::default(),
            fingerprint: Fingerprint([0; 32]),
            config,
        };
        model.fingerprint = fingerprint::of(&model.config, &model.parts());
        model
    }

    /// A hash of every byte of every weight as held, with the config's numbers: equal for two
    /// models exactly when they compute the same K/V (see [`Fingerprint`]).
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// What K/V this model computes are stored under: its fingerprint, the K/V's layout and type.
    pub fn kv_fingerprint(&self) -> Fingerprint {
        fingerprint::of_kv(self.fingerprint, self.kv.kv_type())
    }

    /// Every tensor, in one fixed order, as the fingerprint reads them.
    fn parts<'a>(&'a self) -> Vec<Part<'a>> {
        let ln = |l: &'a LayerNorm| [Part::Floats(&l.weight), Part::Floats(&l.bias)];
        let conv = |c: &'a Conv1D| [Part::Matrix(&c.weight), Part::Floats(&c.bias)];
        let mut parts = vec![Part::Matrix(&self.wte), Part::Floats(&self.wpe)];
        for b in &self.h {
            parts.extend(ln(&b.ln_1));
            parts.extend(conv(&b.c_attn));
            parts.extend(conv(&b.attn_c_proj));
            parts.extend(ln(&b.ln_2));
            parts.extend(conv(&b.c_fc));
            parts.extend(conv(&b.mlp_c_proj));
        }
        parts.extend(ln(&self.ln_f));
        parts
    }

    /// The same model with its matrices held as `dtype` (`--draft self:w8a8`'s copy), converted
    /// from the matrices this one holds, without reading the file again: when they are all f32
    /// they hold the file's values exactly, and the copy is the model loading the file as `dtype`
    /// gives, byte for byte (the same fingerprint; the detected instruction set, as loading
    /// gives). None when a matrix is held otherwise, and for llama.cpp's block types (a GGUF of
    /// the type keeps its own blocks when loaded as it).
    pub fn held_as(&self, dtype: WeightType) -> Option<Model> {
        let f32 = |p: &Part| !matches!(p, Part::Matrix(m) if m.weight_type() != WeightType::F32);
        if dtype.ggml_block().is_some() || !self.parts().iter().all(f32) {
            return None;
        }
        let conv = |c: &Conv1D| Conv1D { weight: c.weight.converted(dtype), bias: c.bias.clone() };
        let (wte, h) = rayon::join(
            || self.wte.converted(dtype),
            || {
                self.h
                    .par_iter()
                    .map(|b| Block {
                        ln_1: b.ln_1.clone(),
                        c_attn: conv(&b.c_attn),
                        attn_c_proj: conv(&b.attn_c_proj),
                        ln_2: b.ln_2.clone(),
                        c_fc: conv(&b.c_fc),
                        mlp_c_proj: conv(&b.mlp_c_proj),
                    })
                    .collect()
            },
        );
        Some(Model::assemble(self.config.clone(), wte, self.wpe.clone(), h, self.ln_f.clone()))
    }

    /// The same model running another compiled copy of the kernels (for tests and benchmarks).
    pub fn with_isa(mut self, isa: Isa) -> Model {
        self.isa = isa;
        self
    }

    /// The same model whose caches hold K/V as `kv` says (the logits stay the same bits).
    pub fn with_kv(mut self, kv: KvSpec) -> Model {
        self.kv = kv;
        self
    }

    pub fn kv(&self) -> KvSpec {
        self.kv
    }

    /// A cache of its own for `capacity` positions, held as [`Model::kv`] says.
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        KvCache::with_spec(&self.config, capacity, self.kv)
    }

    /// The dtype the weights are held in for computation.
    pub fn weights_dtype(&self) -> &'static str {
        self.dtype.name()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Bytes the weights of a `cfg` model would take held as `ty` (what [`Model::weight_bytes`]
    /// reports once loaded): the matrices in their panels, biases, LayerNorms and `wpe` in f32.
    pub fn weight_bytes_for(cfg: &Config, ty: WeightType) -> usize {
        let (c, f) = (cfg.n_embd, cfg.n_inner);
        let conv = |k: usize, n: usize| PackedMatrix::bytes_of(k, n, ty) + 4 * n;
        let block = 4 * 4 * c + conv(c, cfg.qkv_width()) + conv(c, c) + conv(c, f) + conv(f, c);
        PackedMatrix::bytes_of(c, cfg.vocab_size, ty) + 4 * cfg.n_positions * c + cfg.n_layer * block + 4 * 2 * c
    }

    /// Bytes of all weights as held in memory.
    pub fn weight_bytes(&self) -> usize {
        let conv = |c: &Conv1D| c.weight.bytes() + 4 * c.bias.len();
        let ln = |l: &LayerNorm| 4 * (l.weight.len() + l.bias.len());
        let blocks: usize = self
            .h
            .iter()
            .map(|b| {
                ln(&b.ln_1) + conv(&b.c_attn) + conv(&b.attn_c_proj) + ln(&b.ln_2) + conv(&b.c_fc) + conv(&b.mlp_c_proj)
            })
            .sum();
        self.wte.bytes() + 4 * self.wpe.len() + blocks + ln(&self.ln_f)
    }

    /// `ln_f` and the vocabulary projection applied to residual-stream rows `hidden` (`[R, C]`):
    /// the logit lens. Allocates; for inspection, not for the generation loop.
    pub fn logits_of_hidden(&self, hidden: &[f32]) -> Vec<f32> {
        let (c, v) = (self.config.n_embd, self.config.vocab_size);
        let r = hidden.len() / c;
        let mut xn = vec![0.0; r * c];
        self.ln_f.forward(self.isa, &mut xn, hidden, r, self.config.layer_norm_epsilon);
        let mut out = vec![0.0; r * v];
        let mut acts = k::QuantizedActs::default();
        k::matmul_packed(self.isa, &mut out, &xn, &self.wte, &self.no_bias, r, &mut acts);
        out
    }
}
