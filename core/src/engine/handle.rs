//! The one way in: [`EngineHandle::submit`] checks a request, owns the queue limit and returns
//! the sequence's event stream; [`EngineHandle::cancel`] ends one early, saying why.

use super::command::Command;
use super::request::{CancelReason, Events, Flushed, Request, SeqId, SubmitError};
use super::slot::{TierLoad, Waiting};
use crate::error::Error;
use crate::kv_cache::Pool;
use crate::model::Model;
use crate::sequence::check_prompt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tokio::sync::mpsc::unbounded_channel;

/// A front end's handle on a running engine (cheap to clone; the engine ends when every handle
/// is gone and its work is done).
#[derive(Clone)]
pub struct EngineHandle {
    pub(super) tx: mpsc::Sender<Command>,
    pub(super) model: Arc<Model>,
    /// Sequences submitted and not yet ended: running, and waiting for a slot.
    pub(super) inflight: Arc<AtomicUsize>,
    pub(super) parallel: usize,
    pub(super) max_queue: usize,
    pub(super) next_id: Arc<AtomicU64>,
    /// The engine's K/V pool, to refuse what could never fit it.
    pub(super) kv: Pool,
}

impl EngineHandle {
    /// Submits one sequence: its events, or why it cannot run.
    pub fn submit(&self, req: Request) -> Result<Events, SubmitError> {
        Ok(self.submit_all(vec![req])?.remove(0))
    }

    /// Submits sequences that belong together (the choices and prompts of one request): all are
    /// queued, or none is. They are counted against what the engine holds: `parallel` running
    /// and `max_queue` waiting. More than both can ever hold is refused for good
    /// ([`SubmitError::TooMany`]); more than they hold now, until some finish
    /// ([`SubmitError::Busy`]).
    pub fn submit_all(&self, reqs: Vec<Request>) -> Result<Vec<Events>, SubmitError> {
        for r in &reqs {
            self.check(r)?;
        }
        let n = reqs.len();
        let room = self.parallel + self.max_queue;
        if n > room {
            return Err(SubmitError::TooMany { n, parallel: self.parallel, max_queue: self.max_queue });
        }
        let before = self.inflight.fetch_add(n, Ordering::Relaxed);
        if before + n > room {
            self.inflight.fetch_sub(n, Ordering::Relaxed);
            let waiting = before.saturating_sub(self.parallel);
            return Err(SubmitError::Busy { waiting, limit: self.max_queue });
        }
        let submitted = Instant::now();
        let mut out = Vec::with_capacity(n);
        for req in reqs {
            let id: SeqId = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (events, rx) = unbounded_channel();
            if self.tx.send(Command::Submit(Waiting { id, req, events, submitted, tiers: TierLoad::Unasked })).is_err()
            {
                self.inflight.fetch_sub(n - out.len(), Ordering::Relaxed);
                return Err(SubmitError::Stopped);
            }
            out.push(Events { id, rx });
        }
        Ok(out)
    }

    /// Ends sequence `id` early: a stop sequence finishes it as a stop, a client that left
    /// cancels it. Nothing happens if it has already ended.
    pub fn cancel(&self, id: SeqId, reason: CancelReason) {
        let _ = self.tx.send(Command::Cancel(id, reason));
    }

    /// Asks the engine to finish what it has and then stop.
    pub fn drain(&self) {
        let _ = self.tx.send(Command::Drain);
    }

    /// Empties the prompt cache of every entry no running sequence holds (between steps).
    pub async fn flush_cache(&self) -> Result<Flushed, SubmitError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.send(Command::FlushCache(tx)).map_err(|_| SubmitError::Stopped)?;
        rx.await.map_err(|_| SubmitError::Stopped)
    }

    /// The model the engine runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Sequences submitted and not yet ended (running or waiting).
    pub fn in_flight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }

    /// The K/V pool the engine runs on (to read its accounting).
    pub fn kv_pool(&self) -> &Pool {
        &self.kv
    }

    fn check(&self, r: &Request) -> Result<(), SubmitError> {
        r.sampling.check().map_err(|e| Error::Invalid(e.to_string()))?;
        check_prompt(&self.model, &r.prompt, r.max_new_tokens)?;
        let (shape, total) = (self.kv.shape(), self.kv.total_blocks());
        let positions = r.prompt.len() + r.max_new_tokens.saturating_sub(1);
        let need = shape.blocks_for(positions);
        if need > total {
            let pool_bytes = total * shape.bytes();
            return Err(SubmitError::TooBig { positions, need, block: shape.positions, total, pool_bytes });
        }
        Ok(())
    }
}
