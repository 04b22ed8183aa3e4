//! How the engine runs, and what it reports to whoever observes it.

use super::request::{Ending, Usage};
use crate::kv_cache::{BlockShape, KvCache, Pool};
use crate::model::Model;
use crate::prefix_cache::CacheStats;
use crate::speculative::DraftConfig;
use crate::store::{Store, StoreCounts};
use std::sync::Arc;
use std::time::Duration;

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences running at once.
    pub parallel: usize,
    /// Rows per forward step (decode rows first, then prefill chunks).
    pub batch_tokens: usize,
    /// Bytes the prompt cache may hold (0: none).
    pub cache_bytes: usize,
    /// Sequences that may wait for a slot; past that, [`SubmitError::Busy`].
    pub max_queue: usize,
    /// Decode speculatively with this draft (each request that does not turn it off).
    pub draft: Option<DraftConfig>,
    /// Announce what the prompt cache stores and evicts as KV-cache events over the pool's
    /// blocks ([`super::Spawned::kv_events`]).
    pub kv_events: bool,
    /// Bytes of the one K/V pool that running sequences and the prompt cache share (None: as
    /// much as every slot at the full context and the prompt cache's budget).
    pub kv_bytes: Option<usize>,
    /// The tiers under the pool (`--kv-disk`): the prompt cache writes through to them, and a
    /// prompt it does not hold is looked up there too.
    pub store: Option<Arc<Store>>,
}

/// Full contexts the default pool holds (the K/V of the old default of four slots): more slots
/// share it by memory, as their sequences' blocks are taken, and a pool that runs out preempts
/// (the answer's bits do not change). `--kv-mb` sets it outright.
pub const FULL_CONTEXTS: usize = 4;

impl EngineConfig {
    /// Refuses a configuration the engine cannot run: no slot, no row per step.
    pub fn check(&self) -> Result<(), String> {
        if self.parallel == 0 || self.batch_tokens == 0 {
            return Err("the engine needs at least one slot (parallel) and one row per step (batch_tokens)".into());
        }
        Ok(())
    }

    /// The K/V pool's block shape and how many blocks it holds: `kv_bytes` (default: up to
    /// [`FULL_CONTEXTS`] slots at the full context and the prompt cache's budget) in blocks of the
    /// model's K/V, as many positions each as [`Model::kv`] says.
    pub fn kv_pool_size(&self, model: &Model) -> (BlockShape, usize) {
        let (cfg, spec) = (&model.config, model.kv());
        let slots = self.parallel.min(FULL_CONTEXTS);
        let full = slots * cfg.n_positions * KvCache::bytes_per_position_as(cfg, spec.kv_type());
        let bytes = self.kv_bytes.unwrap_or(full + self.cache_bytes);
        let shape = BlockShape::of(cfg, spec);
        (shape, bytes / shape.bytes())
    }

    /// The K/V pool itself, its memory taken now; an error says when it cannot be had.
    pub fn kv_pool(&self, model: &Model) -> crate::error::Result<Pool> {
        Pool::try_new(&model.config, model.kv(), self.kv_pool_size(model).1)
    }

    /// The most K/V bytes a draft model's caches can hold outside the pool (every slot at the
    /// full context); 0 when its blocks are the pool's shape (its caches take the pool's blocks).
    pub fn draft_kv_bytes(&self, model: &Model) -> usize {
        let (positions, shape) = (model.config.n_positions, self.kv_pool_size(model).0);
        self.parallel * self.draft.as_ref().map_or(0, |d| d.kv_bytes(positions, shape))
    }

    /// The most rows one forward step can feed: the token budget, or every slot decoding with a
    /// full draft (decode rows are never cut to the budget).
    pub fn max_rows(&self) -> usize {
        let drafts = self.draft.as_ref().map_or(0, |d| d.max_k);
        self.batch_tokens.max(self.parallel * (1 + drafts)).max(1)
    }
}

/// What the engine reports after every step, for the metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    pub running: usize,
    pub waiting: usize,
    /// K/V bytes of the running sequences' caches, and the positions they hold.
    pub kv_bytes: usize,
    pub kv_tokens: usize,
    /// The pool: its blocks, those in use (by sequences or the prompt cache), those a running
    /// sequence maps that another holder (a sequence, the prompt cache) holds too.
    pub pool_blocks: usize,
    pub pool_used: usize,
    /// The most blocks ever in use at once.
    pub pool_peak: usize,
    pub blocks_shared: usize,
    /// Sequences preempted so far (their blocks dropped, recomputed later).
    pub preemptions: u64,
    pub cache_bytes: usize,
    pub cache_tokens: usize,
    pub stats: CacheStats,
    /// The tiers under the pool, when there are any.
    pub store: Option<StoreCounts>,
}

/// Observes the engine (metrics); called on the engine thread.
pub trait Monitor: Send {
    fn step(&mut self, _g: &Gauges) {}
    fn first_token(&mut self, _ttft: Duration) {}
    fn token(&mut self, _itl: Duration) {}
    fn finished(&mut self, _u: &Usage, _ending: Ending) {}
}

/// A monitor that observes nothing.
pub struct NoMonitor;
impl Monitor for NoMonitor {}
