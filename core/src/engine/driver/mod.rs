//! The engine loop on its own thread: take commands, plan a step, make room for it in the K/V
//! pool (`memory.rs`: evict, then preempt), execute it, update every sequence from what it
//! produced (events, finishes with their reason, prompt-cache inserts).

mod memory;
mod tiers;

use super::command::Command;
use super::config::{EngineConfig, Monitor};
use super::policy::{self, Cached, Limits, Phase};
use super::request::{CancelReason, Ending, Event, Flushed, Usage};
use super::runner::{Output, Runner};
use super::slot::{Slot, Waiting};
use crate::error::Result;
use crate::kv_cache::Pool;
use crate::kv_events::{block_event, BlockEvent};
use crate::model::Model;
use crate::prefix_cache::PrefixCache;
use crate::sequence::FinishReason;
use crate::sequence::Sequence;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Where the engine's KV-cache events go (they count in the pool's blocks).
pub(super) type KvEventSink = tokio::sync::mpsc::UnboundedSender<Vec<BlockEvent>>;

pub(super) struct Engine {
    cfg: EngineConfig,
    kv_events: Option<KvEventSink>,
    cache: PrefixCache,
    /// The K/V blocks of every sequence and of the prompt cache.
    pool: Pool,
    runner: Runner,
    /// Running sequences, in admission order.
    slots: Vec<Slot>,
    /// Sequences preempted for memory, oldest admitted first: they go before `waiting`.
    preempted: VecDeque<Slot>,
    preemptions: u64,
    waiting: VecDeque<Waiting>,
    /// Sequences submitted and not yet ended (shared with the handle, which owns the limit).
    inflight: Arc<AtomicUsize>,
    draining: bool,
}

impl Engine {
    /// An engine over `pool`, counting its sequences in `inflight` (both shared with the handle).
    pub fn new(
        model: Arc<Model>,
        cfg: EngineConfig,
        (pool, inflight): (Pool, Arc<AtomicUsize>),
        kv_events: Option<KvEventSink>,
    ) -> Engine {
        if let Some(store) = &cfg.store {
            store.limit_inflight(pool.total_blocks() / 8); // a slow tier holds at most an eighth of the pool
        }
        let mut cache = PrefixCache::new(cfg.cache_bytes);
        if kv_events.is_some() || cfg.store.is_some() {
            cache.keep_journal(); // the events and the writes through are made from it
        }
        Engine {
            kv_events,
            cache,
            pool,
            runner: Runner::new(model, cfg.max_rows()),
            cfg,
            slots: vec![],
            preempted: VecDeque::new(),
            preemptions: 0,
            waiting: VecDeque::new(),
            inflight,
            draining: false,
        }
    }

    /// Runs until [`Command::Drain`] (or every handle is gone) and nothing is left to do.
    pub fn run(mut self, rx: mpsc::Receiver<Command>, monitor: &mut dyn Monitor) {
        loop {
            let idle = self.idle();
            if idle && self.draining {
                return;
            }
            // Wait for work when idle; otherwise take whatever has arrived and go on. With nothing
            // to run until the tiers answer, wait for their answer (and look at the commands every
            // few milliseconds).
            if idle {
                match rx.recv() {
                    Ok(c) => self.command(c, monitor),
                    Err(_) => return, // every handle is gone
                }
            } else if self.stalled() {
                self.cfg.store.as_ref().expect("only a store stalls").wait_fetched(Duration::from_millis(5));
            }
            self.commands(&rx, monitor);
            let gone = self.slots.iter().chain(&self.preempted).any(Slot::gone);
            if gone || self.waiting.iter().any(Waiting::gone) {
                // A front end that stopped a sequence said so before letting go of it.
                self.commands(&rx, monitor);
                self.drop_gone(monitor);
            }
            if let Err(e) = if self.idle() { Ok(()) } else { self.step(monitor) } {
                // A step that fails fails every sequence in it; the engine goes on.
                for s in std::mem::take(&mut self.slots) {
                    s.send(Event::Error(e.to_string()));
                    self.finish(s, Ending::Failed, usize::MAX, monitor);
                }
            }
            self.report_cache();
            monitor.step(&self.gauges());
        }
    }

    fn idle(&self) -> bool {
        self.slots.is_empty() && self.preempted.is_empty() && self.waiting.is_empty()
    }

    /// Hands the store what the prompt cache stored since the last call, and sends it and what
    /// was evicted as one batch of block events, if whole blocks changed.
    fn report_cache(&mut self) {
        let changes = self.cache.take_changes();
        self.write_through(&changes);
        let Some(sink) = &self.kv_events else { return };
        let block = self.pool.shape().positions;
        let batch: Vec<BlockEvent> = changes.iter().filter_map(|c| block_event(c, block)).collect();
        if !batch.is_empty() {
            let _ = sink.send(batch); // nobody listening any more is no error
        }
    }

    fn commands(&mut self, rx: &mpsc::Receiver<Command>, monitor: &mut dyn Monitor) {
        while let Ok(c) = rx.try_recv() {
            self.command(c, monitor);
        }
    }

    fn command(&mut self, c: Command, monitor: &mut dyn Monitor) {
        match c {
            Command::Submit(w) => self.waiting.push_back(w),
            Command::Cancel(id, reason) => self.cancel(id, reason, monitor),
            Command::Drain => self.draining = true,
            Command::FlushCache(reply) => {
                let before = self.cache.stats.evicted_tokens;
                self.cache.evict_to(0);
                let evicted_tokens = self.cache.stats.evicted_tokens - before;
                self.report_cache(); // the events go out before the answer
                let _ = reply.send(Flushed { evicted_tokens, held_tokens: self.cache.tokens() });
            }
        }
    }

    fn cancel(&mut self, id: u64, reason: CancelReason, monitor: &mut dyn Monitor) {
        if let Some(i) = self.slots.iter().position(|s| s.id == id) {
            let s = self.slots.remove(i);
            match reason {
                CancelReason::Stop { tokens } => self.finish(s, Ending::Finished(FinishReason::Stop), tokens, monitor),
                CancelReason::Client => self.finish(s, Ending::Cancelled, usize::MAX, monitor),
            }
        } else if let Some(i) = self.preempted.iter().position(|s| s.id == id) {
            let s = self.preempted.remove(i).expect("found");
            self.finish(s, Ending::Cancelled, usize::MAX, monitor);
        } else if let Some(i) = self.waiting.iter().position(|w| w.id == id) {
            let w = self.waiting.remove(i).expect("found");
            self.cancel_waiting(w, monitor);
        }
    }

    fn cancel_waiting(&mut self, w: Waiting, monitor: &mut dyn Monitor) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        let usage = Usage { prompt_tokens: w.req.prompt.len(), queue: w.submitted.elapsed(), ..Usage::default() };
        monitor.finished(&usage, Ending::Cancelled);
    }

    /// Sequences whose receiver has gone leave first, freeing their slots.
    fn drop_gone(&mut self, monitor: &mut dyn Monitor) {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting).into_iter().partition(Waiting::gone);
        self.waiting = kept.into();
        for w in gone {
            self.cancel_waiting(w, monitor);
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.slots).into_iter().partition(Slot::gone);
        self.slots = kept;
        let (gone_too, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.preempted).into_iter().partition(Slot::gone);
        self.preempted = kept.into();
        for s in gone.into_iter().chain(gone_too) {
            self.finish(s, Ending::Cancelled, usize::MAX, monitor);
        }
    }

    /// Plan, execute, update.
    fn step(&mut self, monitor: &mut dyn Monitor) -> Result<()> {
        self.load_from_store(); // before the counts: it evicts and inserts
        let evictable = self.evictable();
        let limits = Limits {
            parallel: self.cfg.parallel,
            batch_tokens: self.cfg.batch_tokens,
            prefix_cache: self.cfg.cache_bytes > 0,
            memory: self.memory(&evictable),
        };
        self.runner.draft(&mut self.slots)?;
        let running: Vec<_> = self.slots.iter().map(Slot::view).collect();
        let waiting: Vec<_> =
            self.preempted.iter().map(Slot::view).chain(self.waiting.iter().map(Waiting::view)).collect();
        let cache = &self.cache;
        let cached = |ids: &[u32]| {
            let (tokens, evictable) = cache.peek_in(&evictable, ids);
            Cached { tokens, evictable }
        };
        let mut plan = policy::plan(&running, &waiting, &cached, limits);
        self.admit(plan.admit);
        for &(id, cached) in &plan.start {
            self.start(id, cached, monitor);
        }
        self.make_room(&mut plan);
        let out = self.runner.execute(&mut self.slots, &plan.rows)?;
        self.update(out, monitor);
        self.share_decoded();
        Ok(())
    }

    /// Moves `n` sequences into slots: preempted ones first, then waiting ones.
    fn admit(&mut self, n: usize) {
        let resumed = n.min(self.preempted.len());
        self.slots.extend(self.preempted.drain(..resumed));
        let n = n - resumed;
        for w in self.waiting.drain(..n.min(self.waiting.len())) {
            // The handle checked the request; a failure here is memory, reported as an error.
            let new = (w.req.max_new_tokens, w.req.sampling);
            match Sequence::new_in(Some(&self.pool), &self.runner.model, &w.req.prompt, new) {
                Ok(mut seq) => {
                    if let Some(d) = self.cfg.draft.as_ref().filter(|_| w.req.speculative) {
                        seq.speculate_in_pool(d);
                    }
                    self.slots.push(Slot::new(w, seq));
                }
                Err(e) => {
                    self.inflight.fetch_sub(1, Ordering::Relaxed);
                    let _ = w.events.send(Event::Error(e.to_string()));
                }
            }
        }
    }

    /// Starts sequence `id` from the `cached` tokens of its ids the plan found in the prompt
    /// cache (their blocks mapped; the path held until its prompt is in the tree). A preempted
    /// sequence resumes this way, keeping what its first start reported.
    fn start(&mut self, id: u64, cached: usize, monitor: &mut dyn Monitor) {
        let Some(i) = self.slots.iter().position(|s| s.id == id) else { return };
        let s = &mut self.slots[i];
        let mut found = self.cache.lookup_upto(s.seq.ids(), cached);
        let restored = s.seq.map_prefix(&found.blocks, found.len);
        if s.first_token.is_none() {
            if self.cfg.store.is_some() {
                let (start, loaded) = s.loaded.unwrap_or_default();
                found.stop.tiers = Some(loaded.of(start, found.len));
            }
            s.reuse = (self.cfg.cache_bytes > 0).then_some(found.stop);
            (s.cached, s.hold) = (found.len, Some(found.hold));
        } else {
            // A resumed sequence's prompt is in the tree already (see `update`): nothing to hold.
            self.cache.release(found.hold);
        }
        s.phase = Phase::Prefilling;
        if let Err(e) = restored {
            let s = self.slots.remove(i);
            s.send(Event::Error(e.to_string()));
            self.finish(s, Ending::Failed, usize::MAX, monitor);
        }
    }

    /// Sends each new token; the first one starts the stream and puts the prompt's K/V into the
    /// prompt cache; a sequence at its end finishes (keeping no token made after its end in the
    /// same step).
    fn update(&mut self, out: Vec<Output>, monitor: &mut dyn Monitor) {
        let eos = self.runner.model.config.eos_token_id;
        let mut done: Vec<(usize, FinishReason)> = vec![];
        for Output { slot, token, logprob } in out {
            if done.last().is_some_and(|&(d, _)| d == slot) {
                continue; // ended at an earlier token of this step
            }
            let s = &mut self.slots[slot];
            let now = Instant::now();
            s.phase = Phase::Decoding;
            if s.first_token.is_none() {
                s.first_token = Some(now);
                monitor.first_token(now - s.submitted);
                s.send(Event::Started {
                    cached_tokens: s.cached,
                    queue: s.admitted - s.submitted,
                    prompt_time: now - s.admitted,
                    reuse: s.reuse.clone(),
                });
                if self.cfg.cache_bytes > 0 {
                    let end = s.seq.prompt().len();
                    memory::share(&mut self.cache, s, end);
                }
                // Its prompt is in the tree now, and the blocks it maps stay whatever the tree
                // evicts: the hold would only keep a block it copied away from.
                if let Some(h) = s.hold.take() {
                    self.cache.release(h);
                }
            } else {
                monitor.token(now - s.last_token);
            }
            s.last_token = now;
            s.sent += 1;
            s.send(Event::Token { id: token, logprob });
            if s.req.stop_at_eos && token == eos {
                done.push((slot, FinishReason::Eos));
            } else if s.sent >= s.req.max_new_tokens {
                done.push((slot, FinishReason::Length));
            }
        }
        for &(slot, finish) in done.iter().rev() {
            let mut s = self.slots.remove(slot); // `remove` keeps admission order
            s.seq.keep_generated(s.sent);
            self.finish(s, Ending::Finished(finish), usize::MAX, monitor);
        }
    }

    /// A sequence leaves: its K/V into the prompt cache (once it has started, unless it failed), its hold
    /// released, its usage counted, and then, for a finish, `Done` (so whoever reads it finds the
    /// sequence no longer counted against the queue limit).
    fn finish(&mut self, mut s: Slot, ending: Ending, completion: usize, monitor: &mut dyn Monitor) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        // A failed step may have left unverified drafts (or half a step) in the cache.
        if self.cfg.cache_bytes > 0 && s.first_token.is_some() && ending != Ending::Failed {
            self.cache.insert(s.seq.ids(), s.seq.cache());
        }
        if let Some(h) = s.hold.take() {
            self.cache.release(h);
        }
        let usage = s.usage(completion);
        monitor.finished(&usage, ending);
        if let Ending::Finished(finish) = ending {
            s.send(Event::Done { finish, usage });
        }
    }
}
