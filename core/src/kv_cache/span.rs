//! K and V of a run of positions held outside any cache.

/// Which of a layer's two tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPart {
    K,
    V,
}

/// K and V of a run of consecutive positions of every layer, held outside any cache (the files of
/// `--prompt-cache`, and copies for views): `[L, 2 (K, V), NH, len, HS]`.
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
    pub(super) fn head(&self, l: usize, part: usize, h: usize) -> &[f32] {
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
