//! The per-layer KV cache: K and V of every layer preallocated to `n_positions`, written in place.
//! The position of the next token is the cache length; writing past the capacity is a typed error.

use crate::config::Config;
use crate::error::{Error, Result};

/// The strided store's range of head `h`'s positions `at`, for a capacity `cap`.
fn h_rows(cap: usize, hs: usize, at: std::ops::Range<usize>) -> impl Fn(usize) -> std::ops::Range<usize> {
    move |h| (h * cap + at.start) * hs..(h * cap + at.end) * hs
}

/// K and V of one layer, each `[NH, n_positions, HS]`: head `h`, position `p` at `(h*n_positions + p)*HS`.
#[derive(Clone)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

#[derive(Clone)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    len: usize,
    capacity: usize,
    n_head: usize,
    head_dim: usize,
}

impl KvCache {
    /// How K/V are held, as stored K/V record it: f32, per layer K then V, each `[NH, N, HS]`.
    pub const LAYOUT: &'static str = "f32; per layer K then V, [NH, N, HS]";

    /// A cache for `cfg.n_positions` positions of every layer, allocated once.
    pub fn new(cfg: &Config) -> KvCache {
        KvCache::with_capacity(cfg, cfg.n_positions)
    }

    /// A cache for `capacity` positions (at most `cfg.n_positions`), allocated once: a sequence
    /// that will never hold more positions needs no more memory.
    pub fn with_capacity(cfg: &Config, capacity: usize) -> KvCache {
        let capacity = capacity.min(cfg.n_positions);
        let size = cfg.n_head * capacity * cfg.head_dim();
        KvCache {
            layers: (0..cfg.n_layer).map(|_| LayerKv { k: vec![0.0; size], v: vec![0.0; size] }).collect(),
            len: 0,
            capacity,
            n_head: cfg.n_head,
            head_dim: cfg.head_dim(),
        }
    }

    /// Bytes of K and V for one position of every layer (f32).
    pub fn bytes_per_position(cfg: &Config) -> usize {
        2 * cfg.n_layer * cfg.n_embd * 4
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

    /// Layers.
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// The shape of one layer's K (and V) as filled: `[NH, len, HS]`.
    pub fn shape(&self) -> [usize; 3] {
        [self.n_head, self.len, self.head_dim]
    }

    /// Bytes of K and V of one layer that hold positions (f32).
    pub fn layer_bytes_used(&self) -> usize {
        2 * self.n_head * self.len * self.head_dim * 4
    }

    /// Bytes of K and V of one layer as allocated (`capacity` positions).
    pub fn layer_bytes_allocated(&self) -> usize {
        2 * self.n_head * self.capacity * self.head_dim * 4
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
        let (mut out, rows) = (Vec::with_capacity(nh * len * hs), h_rows(cap, hs, 0..len));
        for h in 0..nh {
            out.extend_from_slice(&src[rows(h)]);
        }
        out
    }

    /// Whether K and V of positions `0..n` are the same bits in `other`, every layer and head
    /// (compared in place, whatever either cache's capacity).
    pub fn same_bits(&self, other: &KvCache, n: usize) -> bool {
        assert!(
            n <= self.len && n <= other.len,
            "comparing {n} positions of caches holding {} and {}",
            self.len,
            other.len
        );
        let hs = self.head_dim;
        let (a, b) = (h_rows(self.capacity, hs, 0..n), h_rows(other.capacity, hs, 0..n));
        let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        (self.n_head, self.head_dim, self.layers.len()) == (other.n_head, other.head_dim, other.layers.len())
            && self
                .layers
                .iter()
                .zip(&other.layers)
                .all(|(x, y)| (0..self.n_head).all(|h| same(&x.k[a(h)], &y.k[b(h)]) && same(&x.v[a(h)], &y.v[b(h)])))
    }

    /// A copy of K and V of positions `a..b` of every layer.
    pub fn span(&self, a: usize, b: usize) -> KvSpan {
        assert!(a <= b && b <= self.len, "span {a}..{b} of a cache holding {} positions", self.len);
        let (nh, hs, cap, n) = (self.n_head, self.head_dim, self.capacity, b - a);
        let (mut data, rows) = (Vec::with_capacity(self.layers.len() * 2 * nh * n * hs), h_rows(cap, hs, a..b));
        for layer in &self.layers {
            for src in [&layer.k, &layer.v] {
                for h in 0..nh {
                    data.extend_from_slice(&src[rows(h)]);
                }
            }
        }
        KvSpan { len: n, n_layer: self.layers.len(), n_head: nh, head_dim: hs, data }
    }

    /// Appends positions `from..to` of `span` at positions `len()..`: the K/V bits a forward pass
    /// over the same tokens at the same positions would have written.
    pub fn append_span(&mut self, span: &KvSpan, from: usize, to: usize) -> Result<()> {
        assert!(from <= to && to <= span.len, "positions {from}..{to} of a span of {}", span.len);
        assert!(span.n_layer == self.layers.len() && span.n_head == self.n_head && span.head_dim == self.head_dim);
        self.check_room(to - from)?;
        let (nh, hs, cap, p) = (self.n_head, self.head_dim, self.capacity, self.len);
        for (l, layer) in self.layers.iter_mut().enumerate() {
            for (part, dst) in [&mut layer.k, &mut layer.v].into_iter().enumerate() {
                for h in 0..nh {
                    let src = span.head(l, part, h);
                    dst[(h * cap + p) * hs..(h * cap + p + to - from) * hs].copy_from_slice(&src[from * hs..to * hs]);
                }
            }
        }
        self.len += to - from;
        Ok(())
    }

    /// Forgets positions `len..` (the next token goes at position `len`).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Mutable access to one layer's store, for tests that corrupt a cache on purpose.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn layer_mut(&mut self, l: usize) -> &mut LayerKv {
        &mut self.layers[l]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPart {
    K,
    V,
}

/// K and V of a run of consecutive positions of every layer, held outside any cache (the prompt
/// cache's entries and the files of `--prompt-cache`): `[L, 2 (K, V), NH, len, HS]`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvSpan {
    pub len: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub data: Vec<f32>,
}

impl KvSpan {
    /// Head `h` of layer `l`, part 0 (K) or 1 (V): `[len, HS]`.
    fn head(&self, l: usize, part: usize, h: usize) -> &[f32] {
        let n = self.len * self.head_dim;
        &self.data[((l * 2 + part) * self.n_head + h) * n..][..n]
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Splits at position `m`: `self` keeps `0..m`, the result holds `m..len`.
    pub fn split_off(&mut self, m: usize) -> KvSpan {
        assert!(m <= self.len);
        let (n, hs) = (self.len, self.head_dim);
        if n == 0 || hs == 0 {
            return self.clone();
        }
        let (mut head, mut tail) = (Vec::with_capacity(self.data.len() / n.max(1) * m), Vec::new());
        for chunk in self.data.chunks(n * hs) {
            head.extend_from_slice(&chunk[..m * hs]);
            tail.extend_from_slice(&chunk[m * hs..]);
        }
        self.data = head;
        self.len = m;
        KvSpan { len: n - m, data: tail, ..*self }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{KvCache, KvSpan};
    use crate::config::Config;

    pub(crate) fn cfg() -> Config {
        Config {
            n_layer: 1,
            n_head: 1,
            n_embd: 2,
            n_positions: 64,
            n_inner: 8,
            vocab_size: 100,
            layer_norm_epsilon: 1e-5,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
            bos_token_id: 0,
            eos_token_id: 0,
        }
    }

    /// A cache holding `ids` at positions 0.., with the made-up K/V.
    pub(crate) fn cache_of(ids: &[u32]) -> KvCache {
        let n = ids.len();
        let mut data = vec![];
        for sign in [1.0, -1.0] {
            for (p, &id) in ids.iter().enumerate() {
                data.extend([sign * id as f32, p as f32]);
            }
        }
        let span = KvSpan { len: n, n_layer: 1, n_head: 1, head_dim: 2, data };
        let mut cache = KvCache::with_capacity(&cfg(), 64);
        cache.append_span(&span, 0, n).unwrap();
        cache
    }

    #[test]
    fn same_bits_compares_the_positions_whatever_the_capacity() {
        let a = cache_of(&[1, 2, 3]); // room for 64 positions
        let mut b = KvCache::with_capacity(&cfg(), 3);
        b.append_span(&a.span(0, 3), 0, 3).unwrap();
        assert!(a.same_bits(&b, 3) && b.same_bits(&a, 3));
        b.layer_mut(0).v[2 * 2] += 1.0; // V of position 2 (head 0, head size 2)
        assert!(!a.same_bits(&b, 3), "one value differs");
        assert!(a.same_bits(&b, 2), "the positions before it do not");
    }
}
