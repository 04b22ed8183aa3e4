//! The serving engine: one thread that owns the model's run state and steps every running
//! sequence together. Front ends (the HTTP server, a test, a binding) meet it at one narrow
//! interface: [`EngineHandle::submit`] a [`Request`], read its [`Events`].
//!
//! - [`policy`]: a pure function that decides a step ([`Plan`]: admissions, prefix restores,
//!   rows per sequence), tested without weights;
//! - `runner`: executes a plan's rows as one batched forward and samples;
//! - `driver`: the loop (commands → plan → execute → update), with an explicit [`Phase`] per
//!   sequence and a reason for every ending;
//! - `handle`: submission with its checks and the queue limit, and cancellation.
//!
//! Because no row's arithmetic reads another row, and each sequence samples from its own seeded
//! stream, a request's tokens and logprobs are the same bits however it was batched, chunked or
//! resumed from the prompt cache.

mod driver;
mod handle;
pub mod policy;
mod request;
mod runner;
mod slot;

pub use handle::EngineHandle;
pub use policy::{Phase, Plan};
pub use request::{CancelReason, Ending, Event, Events, Request, SeqId, SubmitError, Usage};

use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::prefix_cache::CacheStats;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc};
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

/// Messages to the engine thread.
enum Command {
    Submit(slot::Waiting),
    Cancel(SeqId, CancelReason),
    /// Finish the running and waiting sequences, then return.
    Drain,
}

/// Starts an engine on its own thread (inside `pool` when given): its handle and the thread.
pub fn spawn(
    model: Arc<Model>,
    cfg: EngineConfig,
    mut monitor: Box<dyn Monitor>,
    pool: Option<rayon::ThreadPool>,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let handle = EngineHandle {
        tx,
        model: model.clone(),
        queued: queued.clone(),
        max_queue: cfg.max_queue,
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let thread = std::thread::Builder::new().name("kvgpt-engine".into()).spawn(move || {
        let engine = driver::Engine::new(model, cfg, queued);
        match pool {
            Some(p) => p.install(|| engine.run(rx, monitor.as_mut())),
            None => engine.run(rx, monitor.as_mut()),
        }
    })?;
    Ok((handle, thread))
}
