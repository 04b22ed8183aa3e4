//! The serving engine: one thread that owns the model's run state and steps every running
//! sequence together. Front ends (the HTTP server, a test, a binding) meet it at one narrow
//! interface: [`EngineHandle::submit`] a [`Request`], read its [`Events`].
//!
//! - [`policy`]: a pure function that decides a step ([`Plan`]: admissions, prefix restores,
//!   rows per sequence), tested without weights;
//! - `runner`: executes a plan's rows as one batched forward and samples;
//! - `driver`: the loop (commands → plan → execute → update), with an explicit [`Phase`] per
//!   sequence and a reason for every ending;
//! - `handle`: submission with its checks and the queue limit, and cancellation;
//! - `text`: a sequence's events as the text a reader sees, and how it ended.
//!
//! Because no row's arithmetic reads another row, and each sequence samples from its own seeded
//! stream, a request's tokens and logprobs are the same bits however it was batched, chunked or
//! resumed from the prompt cache.

mod command;
mod config;
mod driver;
mod handle;
pub mod policy;
mod request;
mod runner;
mod slot;
mod text;

pub use crate::kv_events::BlockEvent;
pub use crate::prefix_cache::{ReuseStop, StopReason};
pub use config::{EngineConfig, Gauges, Monitor, NoMonitor};
pub use handle::EngineHandle;
pub use policy::{Phase, Plan};
pub use request::{CancelReason, Ending, Event, Events, Flushed, Request, SeqId, SubmitError, Usage};
pub use text::{block_on, Delta, Ended, TextEvent, TextEvents};

use crate::model::Model;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// A running engine: its handle, its thread, and (when asked for) its KV-cache events.
pub struct Spawned {
    pub handle: EngineHandle,
    pub thread: std::thread::JoinHandle<()>,
    /// What the prompt cache stored and evicted, as block events, one batch per step that
    /// changed whole blocks (with [`EngineConfig::kv_events`]).
    pub kv_events: Option<UnboundedReceiver<Vec<BlockEvent>>>,
}

/// Starts an engine on its own thread (inside `pool` when given); a configuration it cannot run
/// ([`EngineConfig::check`]) is an `InvalidInput` error.
pub fn spawn(
    model: Arc<Model>,
    cfg: EngineConfig,
    mut monitor: Box<dyn Monitor>,
    pool: Option<rayon::ThreadPool>,
) -> std::io::Result<Spawned> {
    cfg.check().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let (shape, blocks) = cfg.kv_pool_size(&model);
    if blocks == 0 {
        let block = shape.bytes();
        let msg = format!(
            "the K/V pool holds no block of {block} bytes: give --kv-mb at least {:.2}",
            block as f64 / (1u64 << 20) as f64
        );
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
    }
    let kv = cfg.kv_pool(&model).map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e.to_string()))?;
    let (tx, rx) = mpsc::channel();
    let (events_tx, kv_events) = if cfg.kv_events {
        let (tx, rx) = unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let inflight = Arc::new(AtomicUsize::new(0));
    let handle = EngineHandle {
        tx,
        model: model.clone(),
        inflight: inflight.clone(),
        parallel: cfg.parallel,
        max_queue: cfg.max_queue,
        next_id: Arc::new(AtomicU64::new(1)),
        kv: kv.clone(),
    };
    let thread = std::thread::Builder::new().name("kvgpt-engine".into()).spawn(move || {
        let engine = driver::Engine::new(model, cfg, (kv, inflight), events_tx);
        match pool {
            Some(p) => p.install(|| engine.run(rx, monitor.as_mut())),
            None => engine.run(rx, monitor.as_mut()),
        }
    })?;
    Ok(Spawned { handle, thread, kv_events })
}
