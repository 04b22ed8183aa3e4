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
}
