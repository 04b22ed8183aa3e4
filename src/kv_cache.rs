//! The per-layer KV cache: K and V of every layer preallocated to `n_positions`, written in place.
//! The position of the next token is the cache length; writing past the capacity is a typed error.

use crate::config::Config;
use crate::error::{Error, Result};

/// K and V of one layer, each `[NH, n_positions, HS]`: head `h`, position `p` at `(h*n_positions + p)*HS`.
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

pub struct KvCache {
    layers: Vec<LayerKv>,
    len: usize,
    capacity: usize,
    n_head: usize,
    head_dim: usize,
}

impl KvCache {
    /// A cache for `cfg.n_positions` positions of every layer, allocated once.
    pub fn new(cfg: &Config) -> KvCache {
        let size = cfg.n_head * cfg.n_positions * cfg.head_dim();
        KvCache {
            layers: (0..cfg.n_layer).map(|_| LayerKv { k: vec![0.0; size], v: vec![0.0; size] }).collect(),
            len: 0,
            capacity: cfg.n_positions,
            n_head: cfg.n_head,
            head_dim: cfg.head_dim(),
        }
    }

    /// Positions filled; the next token goes at position `len()`.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every position (the buffers stay allocated).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Bytes held by K and V of all layers.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| (l.k.len() + l.v.len()) * 4).sum()
    }

    pub fn layer(&self, l: usize) -> &LayerKv {
        &self.layers[l]
    }

    /// Errors if `new` more positions do not fit.
    pub fn check_room(&self, new: usize) -> Result<()> {
        if self.len + new > self.capacity {
            return Err(Error::CacheOverflow { len: self.len, new, capacity: self.capacity });
        }
        Ok(())
    }

    /// Writes K and V of `t` new tokens of layer `l` at positions `len..len+t`, taking them from
    /// the fused c_attn output `qkv` `[T, 3C]` (columns C..2C are K, 2C..3C are V).
    pub(crate) fn write(&mut self, l: usize, qkv: &[f32], t: usize) {
        let (nh, hs, cap, p) = (self.n_head, self.head_dim, self.capacity, self.len);
        let c = nh * hs;
        let layer = &mut self.layers[l];
        for i in 0..t {
            let row = &qkv[i * 3 * c..(i + 1) * 3 * c];
            for h in 0..nh {
                let dst = (h * cap + p + i) * hs;
                layer.k[dst..dst + hs].copy_from_slice(&row[c + h * hs..c + (h + 1) * hs]);
                layer.v[dst..dst + hs].copy_from_slice(&row[2 * c + h * hs..2 * c + (h + 1) * hs]);
            }
        }
    }

    /// Marks `t` more positions as filled (after every layer has written them).
    pub(crate) fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// K (or V) of layer `l` for positions `0..len`, as `[NH, len, HS]` (copied out of the strided store).
    pub fn gather(&self, l: usize, which: KvPart) -> Vec<f32> {
        let (nh, hs, cap, len) = (self.n_head, self.head_dim, self.capacity, self.len);
        let src = match which {
            KvPart::K => &self.layers[l].k,
            KvPart::V => &self.layers[l].v,
        };
        let mut out = Vec::with_capacity(nh * len * hs);
        for h in 0..nh {
            out.extend_from_slice(&src[h * cap * hs..(h * cap + len) * hs]);
        }
        out
    }

    /// Mutable access to one layer's store, for tests that corrupt a cache on purpose.
    pub fn layer_mut(&mut self, l: usize) -> &mut LayerKv {
        &mut self.layers[l]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPart {
    K,
    V,
}
