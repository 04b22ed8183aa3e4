//! What one forward call costs, counted from the shapes the forward pass runs: the lesson of the
//! KV cache in numbers. A decode step with the cache runs one token (`P` cached, `T = 1`); the
//! same step without it runs every position again (`P = 0`, `T = n + 1`).
//!
//! Counted: the multiply-adds of every matrix product and of attention (`q·k` and the weighted
//! sum of `v`); LayerNorm, GELU, softmax and the residual adds (O(T·C) each) are not. Weight bytes
//! are the parameters each call streams at the dtype they are held in, unpadded: every block's
//! matrices, biases and LayerNorms, `ln_f`, the embedding rows of the call's tokens, and the
//! vocabulary matrix when logits are wanted. K/V bytes are f32, as the cache holds them.

use super::gpt2::{Conv1D, Model};
use crate::work::Work;
use kvgpt_kernels::PackedMatrix;

/// Bytes of a matrix as it is held, without the panels' padding.
fn matrix_bytes(m: &PackedMatrix) -> u64 {
    m.weight_type().unpadded_bytes(m.k(), m.n())
}

impl Model {
    /// The work of a forward call over `t` tokens after `p` cached ones that computes the logits
    /// of its last `r` rows.
    pub fn work(&self, p: usize, t: usize, r: usize) -> Work {
        let cfg = &self.config;
        let (c, f, v, l) = (cfg.n_embd, cfg.n_inner, cfg.vocab_size, cfg.n_layer as u64);
        let (t64, c64) = (t as u64, c as u64);
        // Per layer: c_attn [C, 3C], c_proj [C, C], c_fc [C, F], mlp c_proj [F, C].
        let matmul_macs = (c * 3 * c + c * c + c * f + f * c) as u64;
        let conv = |m: &Conv1D| matrix_bytes(&m.weight);
        let mats: u64 =
            self.h.iter().map(|b| conv(&b.c_attn) + conv(&b.attn_c_proj) + conv(&b.c_fc) + conv(&b.mlp_c_proj)).sum();
        let vectors = 4 * (4 * c + 3 * c + c + f + c) as u64; // 2 LayerNorms, 4 biases
                                                              // Query i (position p + i) reads the keys and values of positions 0..=p + i.
        let keys_read: u64 = (0..t).map(|i| (p + i + 1) as u64).sum();
        let attn_macs = 2 * c64 * keys_read; // q·k, then Σ a·v, over every head
        let wants_logits = r > 0;
        Work {
            positions: t64,
            macs: l * (t64 * matmul_macs + attn_macs) + (r * c * v) as u64,
            weight_bytes: mats + l * vectors
                + 4 * 2 * c64 // ln_f
                + t64 * (matrix_bytes(&self.wte) / v as u64 + 4 * c64) // each token's wte and wpe rows
                + if wants_logits { matrix_bytes(&self.wte) } else { 0 },
            kv_read_bytes: l * 2 * c64 * 4 * keys_read,
            kv_written_bytes: l * 2 * c64 * 4 * t64,
        }
    }
}
