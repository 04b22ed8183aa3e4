//! One sequence's part of a forward call, and the work buffers the forward pass reuses.

use crate::config::Config;
use crate::kv_cache::KvCache;
use kvgpt_kernels as k;

/// Tokens per chunk of a long prefill (the scratch's rows in generate, bench and verify): half
/// the activations of a 512-token prompt at one weight read per 256 rows (DESIGN.md, "Chunked
/// prefill", has the measurements).
pub const CHUNK_ROWS: usize = 256;

/// One sequence's part of a forward call: the tokens it feeds at positions `cache.len()..`, its
/// cache, and `[R, V]` for the logits of its last R rows (empty: none).
pub struct Rows<'a> {
    pub ids: &'a [u32],
    pub cache: &'a mut KvCache,
    pub logits: &'a mut [f32],
}

/// Work buffers of the forward pass, sized for the largest `T` seen and then reused: decoding
/// allocates nothing.
pub struct Scratch {
    pub(super) rows: usize,
    pub(super) x: Vec<f32>,            // [T, C] the residual stream
    pub(super) xn: Vec<f32>,           // [T, C] LayerNorm output
    pub(super) qkv: Vec<f32>,          // [T, 3C]
    pub(super) att: Vec<f32>,          // [T, C] attention output (heads side by side)
    pub(super) proj: Vec<f32>,         // [T, C] c_proj outputs
    pub(super) fc: Vec<f32>,           // [T, F]
    pub(super) scores: Vec<f32>,       // [NH, TILE, n_positions] a tile of score rows per head
    pub(super) probs: Vec<f32>,        // [NH, T, P+T] only when a tap asks for attention weights
    pub(super) logits: Vec<f32>,       // [R, V] of a batch whose logits go to several sequences
    pub(super) acts: k::QuantizedActs, // [T, K] int8 activations of the matmul at hand (W8A8 only)
}

impl Scratch {
    /// Buffers for calls of up to `rows` tokens: [`Model::run`] splits longer inputs into chunks
    /// of `rows`; [`Model::forward`] grows the buffers on demand.
    pub fn new(cfg: &Config, rows: usize) -> Scratch {
        let mut s = Scratch {
            rows: 0,
            x: vec![],
            xn: vec![],
            qkv: vec![],
            att: vec![],
            proj: vec![],
            fc: vec![],
            scores: vec![0.0; k::ATTENTION_TILE * cfg.n_head * cfg.n_positions],
            probs: vec![],
            logits: vec![],
            acts: k::QuantizedActs::default(),
        };
        s.ensure(cfg, rows);
        s
    }

    /// Tokens the buffers hold activations for.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub(super) fn ensure(&mut self, cfg: &Config, rows: usize) {
        if rows <= self.rows {
            return;
        }
        let c = cfg.n_embd;
        self.x.resize(rows * c, 0.0);
        self.xn.resize(rows * c, 0.0);
        self.qkv.resize(rows * 3 * c, 0.0);
        self.att.resize(rows * c, 0.0);
        self.proj.resize(rows * c, 0.0);
        self.fc.resize(rows * cfg.n_inner, 0.0);
        self.rows = rows;
    }
}
