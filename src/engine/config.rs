//! How the engine runs, and what it reports to whoever observes it.

use super::request::{Ending, Usage};
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::prefix_cache::CacheStats;
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
}

impl EngineConfig {
    /// The most K/V bytes the running sequences can hold: every slot at the full context.
    pub fn kv_limit(&self, model: &Model) -> usize {
        self.parallel * model.config.n_positions * KvCache::bytes_per_position(&model.config)
    }
}

/// What the engine reports after every step, for the metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    pub running: usize,
    pub waiting: usize,
    /// K/V bytes of the running sequences' caches.
    pub kv_bytes: usize,
    pub cache_bytes: usize,
    pub cache_tokens: usize,
    pub stats: CacheStats,
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
