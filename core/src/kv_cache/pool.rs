//! The K/V memory: a pool of fixed-size blocks, each holding every layer's K and V for `B`
//! consecutive positions, in the type `--kv-dtype` asks for. Caches hold blocks by reference
//! count (`Arc<Block>`): a block shared by several caches and the prompt cache is one block in
//! memory, and it goes back to the pool's free list when the last holder lets go. The pool's
//! blocks live in one slab (kvgpt-kernels' `Slab`), laid out `[L, 2, NH][block][B, W]`: a head's
//! rows of consecutive blocks are neighbours, as in one contiguous cache, and nothing is
//! allocated after the pool is made.

use super::KvSpec;
use crate::config::Config;
use crate::error::{Error, Result};
use kvgpt_kernels::{KvType, Slab, SlabBlock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Positions per block unless a command says otherwise (`--kv-block-size`), as vLLM's default.
pub const DEFAULT_BLOCK: usize = 16;

/// What one block holds: `positions` positions of every layer's K and V, `[L, 2, NH]` segments of
/// `[B, W]` 4-byte words, a row of `HS` values held as `ty` in `W = ty.row_words(HS)` words (`HS` for f32).
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

    /// Which segment of a block holds head `h`'s rows of layer `l`'s K (`part` 0) or V (1).
    pub(super) fn segment(&self, l: usize, part: usize, h: usize) -> usize {
        (l * 2 + part) * self.n_head + h
    }

    /// Blocks that hold `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.positions)
    }
}

/// One block of K/V memory, back to its pool when dropped.
pub struct Block {
    /// Its memory in the pool's slab (taken back by `drop`).
    mem: Option<SlabBlock>,
    pool: Arc<Shared>,
}

impl Block {
    #[inline]
    fn mem(&self) -> &SlabBlock {
        self.mem.as_ref().expect("a live block holds its memory")
    }

    /// The physical block: which of its pool's blocks holds it.
    pub fn id(&self) -> usize {
        self.mem().index()
    }

    /// Head `h`'s rows of layer `l`'s K (`part` 0) or V (1): `[B, W]` words.
    pub fn rows(&self, l: usize, part: usize, h: usize) -> &[f32] {
        self.segment(self.pool.shape.segment(l, part, h))
    }

    /// Segment `s` of the block (see [`BlockShape::segment`]).
    #[inline]
    pub(super) fn segment(&self, s: usize) -> &[f32] {
        self.mem().segment(s)
    }

    pub(super) fn rows_mut(&mut self, l: usize, part: usize, h: usize) -> &mut [f32] {
        let s = self.pool.shape.segment(l, part, h);
        self.mem.as_mut().expect("a live block holds its memory").segment_mut(s)
    }

    /// Copies every row of `other` (a block of the same shape) into this one.
    pub(super) fn copy_from(&mut self, other: &Block) {
        let shape = self.pool.shape;
        for l in 0..shape.n_layer {
            for part in 0..2 {
                for h in 0..shape.n_head {
                    self.rows_mut(l, part, h).copy_from_slice(other.rows(l, part, h));
                }
            }
        }
    }

    /// The shape of the pool it belongs to.
    pub fn shape(&self) -> BlockShape {
        self.pool.shape
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.take() {
            self.pool.free.lock().unwrap_or_else(|p| p.into_inner()).push_back(mem);
        }
        self.pool.in_use.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Shared {
    shape: BlockShape,
    total: usize,
    /// Blocks not in use, the longest free first.
    free: Mutex<VecDeque<SlabBlock>>,
    /// Blocks handed out and not yet given back.
    in_use: AtomicUsize,
    /// The most ever in use at once (a high-water mark, transient holders included).
    peak: AtomicUsize,
}

/// A pool of `total` blocks of one shape in one slab, shared by whoever clones it.
#[derive(Clone)]
pub struct Pool(Arc<Shared>);

impl Pool {
    /// A pool of `total` blocks held as `spec` says, for the model `cfg`; its memory is taken
    /// now (the OS commits pages as they are first written). Errors when it cannot be had.
    pub fn try_new(cfg: &Config, spec: KvSpec, total: usize) -> Result<Pool> {
        let shape = BlockShape::of(cfg, spec);
        let segments = shape.n_layer * 2 * shape.n_head;
        let blocks = Slab::blocks(total, segments, shape.positions * shape.row_words()).ok_or_else(|| {
            let mib = total as f64 * shape.bytes() as f64 / (1u64 << 20) as f64;
            Error::Invalid(format!(
                "a K/V pool of {total} blocks ({mib:.1} MiB) could not be allocated: give a smaller --kv-mb"
            ))
        })?;
        let (free, in_use, peak) = (Mutex::new(blocks.into()), AtomicUsize::new(0), AtomicUsize::new(0));
        Ok(Pool(Arc::new(Shared { shape, total, free, in_use, peak })))
    }

    /// [`Pool::try_new`] of a cache's own pool (at most the model's context, a few MB).
    pub fn new(cfg: &Config, spec: KvSpec, total: usize) -> Pool {
        Pool::try_new(cfg, spec, total).expect("memory for a cache of at most the model's context")
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

    /// The most blocks ever in use at once: every block taken counts, however briefly it was
    /// held (a sequence's own copy of a block it gave up for a shared one included).
    pub fn peak_blocks(&self) -> usize {
        self.0.peak.load(Ordering::Relaxed)
    }

    /// Blocks that can be handed out now.
    pub fn free_blocks(&self) -> usize {
        self.0.total.saturating_sub(self.used_blocks())
    }

    /// A block (its contents are whatever it last held), or None when all are in use.
    pub(super) fn alloc(&self) -> Option<Arc<Block>> {
        let s = &self.0;
        let mem = s.free.lock().unwrap_or_else(|p| p.into_inner()).pop_front()?;
        let now = s.in_use.fetch_add(1, Ordering::Relaxed) + 1;
        s.peak.fetch_max(now, Ordering::Relaxed);
        Some(Arc::new(Block { mem: Some(mem), pool: s.clone() }))
    }
}
