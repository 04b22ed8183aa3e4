//! A block's rows as held, in and out: what the block stores (`crate::store`) write and load.

use super::{Block, KvCache};
use crate::error::{Error, Result};
use std::sync::Arc;

impl Block {
    /// The first `n` positions' rows as held, segment after segment: `[L, 2, NH][n][W]` words.
    pub fn held_rows(&self, n: usize) -> Vec<f32> {
        let s = self.shape();
        let w = s.row_words();
        let mut out = Vec::with_capacity(s.n_layer * 2 * s.n_head * n * w);
        for seg in 0..s.n_layer * 2 * s.n_head {
            out.extend_from_slice(&self.segment(seg)[..n * w]);
        }
        out
    }
}

impl KvCache {
    /// Appends `n` positions (1..=B, at a block boundary) from `rows`, little-endian words in
    /// the layout [`Block::held_rows`] gives: a stored block loaded back. Errors, taking
    /// nothing, when the pool cannot give the block or the bytes are not that many rows.
    pub fn append_held(&mut self, rows: &[u8], n: usize) -> Result<()> {
        let s = self.shape;
        let (b, w, segments) = (s.positions, s.row_words(), s.n_layer * 2 * s.n_head);
        if !self.len.is_multiple_of(b) || n == 0 || n > b || rows.len() != 4 * segments * n * w {
            return Err(Error::Invalid(format!(
                "{} bytes are not {n} stored positions at position {} of blocks of {b}",
                rows.len(),
                self.len
            )));
        }
        self.reserve(n)?;
        let block = Arc::get_mut(&mut self.blocks[self.len / b]).expect("a reserved block is the cache's own");
        for (seg, bytes) in rows.chunks_exact(4 * n * w).enumerate() {
            let (l, part, h) = (seg / (2 * s.n_head), seg / s.n_head % 2, seg % s.n_head);
            let words = &mut block.rows_mut(l, part, h)[..n * w];
            for (to, from) in words.iter_mut().zip(bytes.chunks_exact(4)) {
                *to = f32::from_le_bytes(from.try_into().expect("four bytes"));
            }
        }
        self.len += n;
        Ok(())
    }
}
