//! A model's fingerprint: one BLAKE3 hash over what it computes with — its config's numbers, and
//! every byte of every weight as it is held (the type each matrix is held as, its panels, scales
//! and minimums; the embeddings, LayerNorms and biases). Two models with the same fingerprint give
//! the same K/V for the same ids, bit for bit; any weight byte, held type or shape that differs
//! gives another. Computed once at load (each tensor hashed on its own, in parallel, then the
//! list of their hashes): what a prompt-cache file, and the coming block stores, are keyed by.

use crate::config::Config;
use crate::kv_cache::KvCache;
use kvgpt_kernels::{KvType, PackedMatrix};
use rayon::prelude::*;

/// The fingerprint's format: changes when what it covers changes.
const VERSION: &[u8] = b"kvgpt model fingerprint 1";

/// A model's fingerprint (32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// One tensor of the model, as the fingerprint reads it.
pub(super) enum Part<'a> {
    Floats(&'a [f32]),
    Matrix(&'a PackedMatrix),
}

impl Part<'_> {
    fn hash(&self) -> blake3::Hash {
        let mut h = blake3::Hasher::new();
        match self {
            Part::Floats(v) => {
                h.update(b"f32");
                h.update(&(v.len() as u64).to_le_bytes());
                for chunk in v.chunks(4096) {
                    let bytes: Vec<u8> = chunk.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
                    h.update(&bytes);
                }
            }
            Part::Matrix(m) => m.each_byte_run(&mut |run| {
                h.update(run);
            }),
        }
        h.finalize()
    }
}

/// What stored K/V are keyed by: the model's fingerprint, the K/V's layout and the type they are
/// held in (`--kv-dtype`; f32 adds nothing, keeping the key it always had) — `--prompt-cache`
/// files now, the block stores next. K/V under another key were made by another model, type or
/// layout, and are never used.
pub(super) fn of_kv(model: Fingerprint, ty: KvType) -> Fingerprint {
    let mut h = blake3::Hasher::new();
    h.update(b"kvgpt K/V");
    h.update(&model.0);
    h.update(KvCache::LAYOUT.as_bytes());
    if ty != KvType::F32 {
        h.update(ty.name().as_bytes());
    }
    Fingerprint(*h.finalize().as_bytes())
}

/// The fingerprint of a model of `cfg` whose tensors are `parts`, in the model's order (see the
/// module's documentation).
pub(super) fn of(cfg: &Config, parts: &[Part]) -> Fingerprint {
    let hashes: Vec<blake3::Hash> = parts.par_iter().map(Part::hash).collect();
    let mut root = blake3::Hasher::new();
    root.update(VERSION);
    for n in [cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_inner, cfg.n_positions, cfg.vocab_size] {
        root.update(&(n as u64).to_le_bytes());
    }
    root.update(&cfg.layer_norm_epsilon.to_bits().to_le_bytes());
    root.update(&[u8::from(cfg.scale_attn_weights), u8::from(cfg.scale_attn_by_inverse_layer_idx)]);
    for h in &hashes {
        root.update(h.as_bytes());
    }
    Fingerprint(*root.finalize().as_bytes())
}
