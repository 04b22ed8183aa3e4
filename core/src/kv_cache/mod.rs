//! A sequence's KV cache: a block table over a [`Pool`] of K/V blocks (`pool.rs`). Logical
//! block `j` holds positions `j·B..(j+1)·B` of every layer; blocks are taken from the pool as
//! positions arrive ([`KvCache::reserve`]), never up front, and one shared with another holder
//! (the prompt cache, another sequence) is copied before it is written (copy on write). The
//! position of the next token is the cache length; writing past the capacity is a typed error.
//!
//! Attention reads the blocks through [`LayerBlocks`] in position order, so the logits are the
//! same bits whatever the block size and wherever the blocks are (kvgpt-kernels' attention).

mod held;
mod pool;
mod span;

pub use pool::{Block, BlockShape, Pool, DEFAULT_BLOCK};
pub use span::{KvPart, KvSpan};

use crate::config::Config;
use crate::error::{Error, Result};
use kvgpt_kernels::{kv_load, kv_store, KvBlocks, KvType};
use std::sync::Arc;

/// How a model's caches hold K/V: positions per block (`--kv-block-size`; the logits are the
/// same bits for every size, it changes memory and speed only) and the type of the values
/// (`--kv-dtype`; f32 unless asked: any other type rounds K and V as they are stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    block: usize,
    ty: KvType,
}

impl Default for KvSpec {
    fn default() -> KvSpec {
        KvSpec { block: DEFAULT_BLOCK, ty: KvType::F32 }
    }
}

impl KvSpec {
    /// The largest block a command accepts (a block holds every layer's K/V of its positions).
    pub const MAX_BLOCK: usize = 4096;

    /// A spec of `block` positions per block; errors, naming the flag, outside `1..=MAX_BLOCK`.
    pub fn new(block: usize) -> Result<KvSpec> {
        if !(1..=KvSpec::MAX_BLOCK).contains(&block) {
            return Err(Error::Invalid(format!(
                "a K/V block of {block} positions (--kv-block-size): a block holds 1 to {} positions; pick one in that range (16 is the default)",
                KvSpec::MAX_BLOCK
            )));
        }
        Ok(KvSpec { block, ty: KvType::F32 })
    }

    /// The same spec holding K/V as `ty`.
    pub fn with_type(self, ty: KvType) -> KvSpec {
        KvSpec { ty, ..self }
    }

    /// Positions per block.
    pub fn block(&self) -> usize {
        self.block
    }

    /// The type K and V are held in.
    pub fn kv_type(&self) -> KvType {
        self.ty
    }
}

pub struct KvCache {
    pool: Pool,
    /// Logical block → its block.
    blocks: Vec<Arc<Block>>,
    len: usize,
    capacity: usize,
    shape: BlockShape,
}

impl KvCache {
    /// How K/V are held, as stored K/V (a prompt-cache file's spans) record it: f32 values, per
    /// layer K then V, each `[NH, len, HS]` (a cache of another type widens its rows exactly).
    pub const LAYOUT: &'static str = "f32; blocks of positions, per layer K then V, [NH, B, HS]";

    /// A cache for `cfg.n_positions` positions, in blocks of [`DEFAULT_BLOCK`] of its own.
    pub fn new(cfg: &Config) -> KvCache {
        KvCache::with_capacity(cfg, cfg.n_positions)
    }

    /// A cache for `capacity` positions (at most `cfg.n_positions`), with a pool of its own just
    /// large enough: a sequence that will never hold more positions needs no more memory.
    pub fn with_capacity(cfg: &Config, capacity: usize) -> KvCache {
        KvCache::with_spec(cfg, capacity, KvSpec::default())
    }

    /// [`KvCache::with_capacity`] held as `spec` says.
    pub fn with_spec(cfg: &Config, capacity: usize, spec: KvSpec) -> KvCache {
        let capacity = capacity.min(cfg.n_positions);
        // One block more than its positions take: a copy of its partly filled last block can be
        // made while another holder (a K/V store's writer) still holds the original.
        let pool = Pool::new(cfg, spec, capacity.div_ceil(spec.block()) + 1);
        KvCache::in_pool(&pool, cfg, capacity)
    }

    /// A cache for `capacity` positions (at most `cfg.n_positions`) whose blocks come from `pool`.
    pub fn in_pool(pool: &Pool, cfg: &Config, capacity: usize) -> KvCache {
        let capacity = capacity.min(cfg.n_positions);
        let shape = pool.shape();
        let blocks = Vec::with_capacity(shape.blocks_for(capacity));
        KvCache { pool: pool.clone(), blocks, len: 0, capacity, shape }
    }

    /// Bytes of K and V for one position of every layer held as f32.
    pub fn bytes_per_position(cfg: &Config) -> usize {
        KvCache::bytes_per_position_as(cfg, KvType::F32)
    }

    /// Bytes of K and V for one position of every layer held as `ty` (q8_0: 34 per 32 values).
    pub fn bytes_per_position_as(cfg: &Config, ty: KvType) -> usize {
        2 * cfg.n_layer * cfg.n_head * ty.row_bytes(cfg.head_dim())
    }

    /// Positions filled; the next token goes at position `len()`.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions this cache may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn shape(&self) -> BlockShape {
        self.shape
    }

    /// The blocks of logical blocks `0..`, as held now.
    pub fn blocks(&self) -> &[Arc<Block>] {
        &self.blocks
    }

    /// Forgets every position and gives every block back.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Layers.
    pub fn n_layer(&self) -> usize {
        self.shape.n_layer
    }

    /// The shape of one layer's K (and V) as filled: `[NH, len, HS]`.
    pub fn filled_shape(&self) -> [usize; 3] {
        [self.shape.n_head, self.len, self.shape.head_dim]
    }

    /// Bytes of K and V of one layer that hold positions.
    pub fn layer_bytes_used(&self) -> usize {
        2 * self.shape.n_head * self.len * self.shape.ty.row_bytes(self.shape.head_dim)
    }

    /// Bytes of the blocks held (a block shared with another holder counts in full here too).
    pub fn bytes(&self) -> usize {
        self.shape.bytes() * self.blocks.len()
    }

    /// Errors if `new` more positions do not fit the capacity.
    pub fn check_room(&self, new: usize) -> Result<()> {
        if self.len + new > self.capacity {
            return Err(Error::CacheOverflow { len: self.len, new, capacity: self.capacity });
        }
        Ok(())
    }

    /// Blocks [`KvCache::reserve`] would take from the pool for `new` more positions: the new
    /// ones, and a copy of a shared block that the first of them would write into.
    pub fn blocks_needed(&self, new: usize) -> usize {
        let fresh = self.shape.blocks_for(self.len + new).saturating_sub(self.blocks.len());
        fresh + usize::from(self.to_copy(new).is_some())
    }

    /// The shared block that `new` more positions would write into first, if any: the one the
    /// cache's last positions partly fill.
    fn to_copy(&self, new: usize) -> Option<usize> {
        let j = self.len / self.shape.positions;
        (new > 0 && !self.len.is_multiple_of(self.shape.positions) && self.shared(j)).then_some(j)
    }

    fn shared(&self, j: usize) -> bool {
        self.blocks.get(j).is_some_and(|b| Arc::strong_count(b) > 1)
    }

    /// Replaces block `j` by a copy of it from the pool (its other holders keep the original).
    fn copy_block(&mut self, j: usize) -> Result<()> {
        let mut copy = self.take_block()?;
        Arc::get_mut(&mut copy).expect("a new block").copy_from(&self.blocks[j]);
        self.blocks[j] = copy;
        Ok(())
    }

    /// Makes room for `new` more positions: checks the capacity, takes the blocks they need from
    /// the pool and copies a shared block they would write into. Errors, taking nothing, when the
    /// pool cannot give them all.
    pub fn reserve(&mut self, new: usize) -> Result<()> {
        self.check_room(new)?;
        let need = self.blocks_needed(new);
        if need > self.pool.free_blocks() {
            let (free, total) = (self.pool.free_blocks(), self.pool.total_blocks());
            return Err(Error::KvPoolFull { need, free, total, block: self.shape.positions });
        }
        if let Some(j) = self.to_copy(new) {
            self.copy_block(j)?;
        }
        while self.blocks.len() < self.shape.blocks_for(self.len + new) {
            let block = self.take_block()?;
            self.blocks.push(block);
        }
        Ok(())
    }

    fn take_block(&self) -> Result<Arc<Block>> {
        self.pool.alloc().ok_or(Error::KvPoolFull {
            need: 1,
            free: 0,
            total: self.pool.total_blocks(),
            block: self.shape.positions,
        })
    }

    /// Head `h`'s row of layer `l`'s K or V at position `p`, as held (`W` words).
    fn row(&self, l: usize, part: usize, h: usize, p: usize) -> &[f32] {
        let (b, w) = (self.shape.positions, self.shape.row_words());
        &self.blocks[p / b].rows(l, part, h)[p % b * w..][..w]
    }

    /// The same row's values (`out`: `[HS]`), widened exactly from how they are held.
    fn read_row(&self, l: usize, part: usize, h: usize, p: usize, out: &mut [f32]) {
        kv_load(self.shape.ty, out, self.row(l, part, h, p));
    }

    /// Stores `x` (`[HS]`) as the row: its block is this cache's own (reserved, copied if it was
    /// shared).
    fn store_row(&mut self, l: usize, part: usize, h: usize, p: usize, x: &[f32]) {
        let (b, w, ty) = (self.shape.positions, self.shape.row_words(), self.shape.ty);
        let block = Arc::get_mut(&mut self.blocks[p / b]).expect("a reserved block is the cache's own");
        kv_store(ty, &mut block.rows_mut(l, part, h)[p % b * w..][..w], x);
    }

    /// Writes K and V of `t` new tokens of layer `l` at positions `len..len+t` (reserved), taking
    /// them from the fused c_attn output `qkv` `[T, 3C]` (columns C..2C are K, 2C..3C are V).
    pub(crate) fn write(&mut self, l: usize, qkv: &[f32], t: usize) {
        let BlockShape { n_head: nh, head_dim: hs, positions: b, ty, .. } = self.shape;
        let (c, w) = (nh * hs, self.shape.row_words());
        let mut i = 0;
        while i < t {
            // Rows i..i+n go to block j from its row r (one block at a time: one check that it is ours).
            let (j, r) = ((self.len + i) / b, (self.len + i) % b);
            let n = (b - r).min(t - i);
            let block = Arc::get_mut(&mut self.blocks[j]).expect("a reserved block is the cache's own");
            for (part, h) in (1..3).flat_map(|part| (0..nh).map(move |h| (part, h))) {
                let rows = block.rows_mut(l, part - 1, h);
                for k in 0..n {
                    let src = &qkv[(i + k) * 3 * c + part * c + h * hs..][..hs];
                    kv_store(ty, &mut rows[(r + k) * w..][..w], src);
                }
            }
            i += n;
        }
    }

    /// Marks `t` more positions as filled (after every layer has written them).
    pub(crate) fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// Layer `l`'s K and V as attention reads them.
    pub fn layer(&self, l: usize) -> LayerBlocks<'_> {
        LayerBlocks { blocks: &self.blocks, shape: self.shape, l }
    }

    /// K (or V) of layer `l` for positions `0..len`, as `[NH, len, HS]` (copied out of the blocks).
    pub fn gather(&self, l: usize, which: KvPart) -> Vec<f32> {
        let (nh, hs, part) = (self.shape.n_head, self.shape.head_dim, which as usize);
        let mut out = vec![0.0; nh * self.len * hs];
        for (i, o) in out.chunks_mut(hs).enumerate() {
            self.read_row(l, part, i / self.len, i % self.len, o);
        }
        out
    }

    /// Whether K and V of positions `0..n` are the same bits in `other`, every layer and head
    /// (compared in place, whatever either cache's blocks).
    pub fn same_bits(&self, other: &KvCache, n: usize) -> bool {
        assert!(
            n <= self.len && n <= other.len,
            "comparing {n} positions of caches holding {} and {}",
            self.len,
            other.len
        );
        let (s, o) = (self.shape, other.shape);
        let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        (s.n_layer, s.n_head, s.head_dim, s.ty) == (o.n_layer, o.n_head, o.head_dim, o.ty)
            && (0..s.n_layer).all(|l| {
                (0..2).all(|part| {
                    (0..s.n_head).all(|h| (0..n).all(|p| same(self.row(l, part, h, p), other.row(l, part, h, p))))
                })
            })
    }

    /// A copy of K and V of positions `a..b` of every layer.
    pub fn span(&self, a: usize, b: usize) -> KvSpan {
        assert!(a <= b && b <= self.len, "span {a}..{b} of a cache holding {} positions", self.len);
        let BlockShape { n_layer, n_head, head_dim, .. } = self.shape;
        let mut data = vec![0.0; n_layer * 2 * n_head * (b - a) * head_dim];
        for (i, o) in data.chunks_mut(head_dim).enumerate() {
            let (lph, p) = (i / (b - a), a + i % (b - a)); // ((l · 2 + part) · NH + h, position)
            self.read_row(lph / (2 * n_head), lph / n_head % 2, lph % n_head, p, o);
        }
        KvSpan { len: b - a, n_layer, n_head, head_dim, data }
    }

    /// Appends positions `from..to` of `span` at positions `len()..`: the K/V bits a forward pass
    /// over the same tokens at the same positions would have written.
    pub fn append_span(&mut self, span: &KvSpan, from: usize, to: usize) -> Result<()> {
        assert!(from <= to && to <= span.len, "positions {from}..{to} of a span of {}", span.len);
        let s = self.shape;
        assert!(span.n_layer == s.n_layer && span.n_head == s.n_head && span.head_dim == s.head_dim);
        self.reserve(to - from)?;
        let (hs, p) = (s.head_dim, self.len);
        for l in 0..s.n_layer {
            for part in 0..2 {
                for h in 0..s.n_head {
                    let src = span.head(l, part, h);
                    for i in from..to {
                        self.store_row(l, part, h, p + i - from, &src[i * hs..(i + 1) * hs]);
                    }
                }
            }
        }
        self.len += to - from;
        Ok(())
    }

    /// Starts an empty cache from `blocks` holding positions `0..len` computed elsewhere (a
    /// prompt-cache hit), mapped, not copied: a partly filled last block is copied when this cache
    /// first writes into it.
    pub fn map_prefix(&mut self, blocks: &[Arc<Block>], len: usize) -> Result<()> {
        if !self.is_empty() || blocks.len() != self.shape.blocks_for(len) {
            return Err(Error::Invalid(format!(
                "mapping {} block(s) for {len} positions into a cache holding {}",
                blocks.len(),
                self.len
            )));
        }
        if blocks.iter().any(|b| b.shape() != self.shape) {
            return Err(Error::Invalid(
                "a mapped block is not of this cache's shape (block size or --kv-dtype)".into(),
            ));
        }
        self.check_room(len)?;
        self.blocks.extend(blocks.iter().cloned());
        self.len = len;
        Ok(())
    }

    /// Maps `blocks` (logical blocks `0..blocks.len()` of this cache's positions, holding the
    /// same bits: the prompt cache's blocks for the same tokens, [`PrefixCache::insert_shared`])
    /// in place of its own, for the blocks this cache has filled whole (a block it still writes
    /// into stays its own); its own copies go back to the pool when nobody else holds them.
    /// Returns how many it gave up.
    ///
    /// [`PrefixCache::insert_shared`]: crate::prefix_cache::PrefixCache::insert_shared
    pub fn share_whole(&mut self, blocks: &[Arc<Block>]) -> usize {
        let whole = self.len / self.shape.positions;
        let mut given_up = 0;
        for (mine, theirs) in self.blocks.iter_mut().zip(blocks).take(whole) {
            if !Arc::ptr_eq(mine, theirs) && theirs.shape() == self.shape {
                *mine = theirs.clone();
                given_up += 1;
            }
        }
        given_up
    }

    /// Forgets positions `len..` (the next token goes at position `len`), and gives back the
    /// blocks that held only them.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.blocks.truncate(self.shape.blocks_for(self.len));
    }

    /// Adds `delta` to value `i` of head `h`'s row of layer `l`'s K or V at position `p`, for
    /// tests that corrupt a cache on purpose.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn nudge(&mut self, l: usize, which: KvPart, h: usize, p: usize, i: usize, delta: f32) {
        assert!(p < self.len, "position {p} of a cache holding {}", self.len);
        let j = p / self.shape.positions;
        if self.shared(j) {
            self.copy_block(j).expect("a block to copy into");
        }
        let mut x = vec![0.0; self.shape.head_dim];
        self.read_row(l, which as usize, h, p, &mut x);
        x[i] += delta;
        self.store_row(l, which as usize, h, p, &x);
    }
}

/// One layer's K and V in a cache's blocks, as [`kvgpt_kernels::attention_blocks`] reads them.
pub struct LayerBlocks<'a> {
    blocks: &'a [Arc<Block>],
    shape: BlockShape,
    l: usize,
}

impl KvBlocks for LayerBlocks<'_> {
    #[inline]
    fn block(&self) -> usize {
        self.shape.positions
    }
    #[inline]
    fn k(&self, j: usize, h: usize) -> &[f32] {
        self.blocks[j].segment(self.shape.segment(self.l, 0, h))
    }
    #[inline]
    fn v(&self, j: usize, h: usize) -> &[f32] {
        self.blocks[j].segment(self.shape.segment(self.l, 1, h))
    }
    #[inline]
    fn kv_type(&self) -> KvType {
        self.shape.ty
    }
}

#[cfg(test)]
pub(crate) mod tests;
