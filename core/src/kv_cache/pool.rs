//! The K/V memory: a pool of fixed-size blocks, each holding every layer's K and V for `B`
//! consecutive positions, in the type `--kv-dtype` asks for. Caches hold blocks by reference
//! count (`Arc<Block>`): a block shared by several caches and the prompt cache is one block in
//! memory, and it goes back to the pool when the last holder lets go (its buffer is kept for the next block, so a pool that has run
//! once allocates nothing more). The pool never holds more than its `total` blocks.

use super::KvSpec;
use crate::config::Config;
use kvgpt_kernels::KvType;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Positions per block unless a command says otherwise (`--kv-block-size`), as vLLM's default.
pub const DEFAULT_BLOCK: usize = 16;

/// What one block holds: `positions` positions of every layer's K and V, `[L, 2, NH, B, W]`
/// 4-byte words, a row of `HS` values held as `ty` in `W = ty.row_words(HS)` words (`HS` for f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockShape {
    pub n_layer: usize,
    pub n_head: usize,
    pub head_dim: usize,
    /// Positions per block (`B`).
    pub positions: usize,
    /// How each row is held.
    pub ty: KvType,
}

impl BlockShape {
    pub fn of(cfg: &Config, spec: KvSpec) -> BlockShape {
        let (head_dim, positions, ty) = (cfg.head_dim(), spec.block(), spec.kv_type());
        BlockShape { n_layer: cfg.n_layer, n_head: cfg.n_head, head_dim, positions, ty }
    }

    /// Words of one row (one head's K or V at one position).
    pub fn row_words(&self) -> usize {
        self.ty.row_words(self.head_dim)
    }

    /// Words in one block.
    pub fn words(&self) -> usize {
        self.n_layer * 2 * self.n_head * self.positions * self.row_words()
    }

    /// Bytes in one block.
    pub fn bytes(&self) -> usize {
        self.words() * 4
    }

    /// Where head `h`'s row `r` of layer `l`'s K (`part` 0) or V (1) starts in a block.
    pub(super) fn row(&self, l: usize, part: usize, h: usize, r: usize) -> usize {
        (((l * 2 + part) * self.n_head + h) * self.positions + r) * self.row_words()
    }

    /// Blocks that hold `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.positions)
    }
}

/// One block of K/V memory, back to its pool when dropped.
pub struct Block {
    data: Box<[f32]>,
    /// Which of the pool's buffers it is (its physical number, for the views).
    id: usize,
    pool: Arc<Shared>,
}

impl Block {
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The physical block: which of its pool's buffers holds it (numbered as they were first
    /// made; a block given back and taken again may come back in another).
    pub fn id(&self) -> usize {
        self.id
    }

    pub(super) fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.pool.free.lock().unwrap_or_else(|p| p.into_inner()).push_back((self.id, data));
        self.pool.in_use.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Shared {
    shape: BlockShape,
    total: usize,
    /// Buffers of blocks that were given back (with their numbers), for the next ones.
    free: Mutex<VecDeque<(usize, Box<[f32]>)>>,
    /// Buffers made so far.
    made: AtomicUsize,
    /// Blocks handed out and not yet given back.
    in_use: AtomicUsize,
}

/// A pool of at most `total` blocks of one shape, shared by whoever clones it.
#[derive(Clone)]
pub struct Pool(Arc<Shared>);

impl Pool {
    /// A pool of at most `total` blocks held as `spec` says, for the model `cfg`.
    pub fn new(cfg: &Config, spec: KvSpec, total: usize) -> Pool {
        let shape = BlockShape::of(cfg, spec);
        let (free, made, in_use) = (Mutex::new(VecDeque::new()), AtomicUsize::new(0), AtomicUsize::new(0));
        Pool(Arc::new(Shared { shape, total, free, made, in_use }))
    }

    pub fn shape(&self) -> BlockShape {
        self.0.shape
    }

    /// Blocks the pool may hold.
    pub fn total_blocks(&self) -> usize {
        self.0.total
    }

    /// Blocks held by caches (or the prompt cache) now.
    pub fn used_blocks(&self) -> usize {
        self.0.in_use.load(Ordering::Relaxed)
    }

    /// Blocks that can be handed out now.
    pub fn free_blocks(&self) -> usize {
        self.0.total.saturating_sub(self.used_blocks())
    }

    /// A block (its contents are whatever it last held), or None when all are in use.
    pub(super) fn alloc(&self) -> Option<Arc<Block>> {
        let s = &self.0;
        let mut taken = s.in_use.load(Ordering::Relaxed);
        loop {
            if taken >= s.total {
                return None;
            }
            match s.in_use.compare_exchange_weak(taken, taken + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => taken = now,
            }
        }
        let reused = s.free.lock().unwrap_or_else(|p| p.into_inner()).pop_front(); // the longest free first
        let (id, data) = reused
            .unwrap_or_else(|| (s.made.fetch_add(1, Ordering::Relaxed), vec![0.0; s.shape.words()].into_boxed_slice()));
        Some(Arc::new(Block { data, id, pool: s.clone() }))
    }
}
