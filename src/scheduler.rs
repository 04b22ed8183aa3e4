//! The serving engine: one thread that owns the model's run state and steps every running
//! sequence together. The HTTP side and the engine meet at one narrow interface: a [`Request`]
//! goes in as a [`Command`] on the channel [`spawn`] returns, a stream of [`Event`]s comes out through the
//! request's [`Client`].
//!
//! Each step: admit waiting requests while a slot is free (each starts from the longest prefix
//! the [`PrefixCache`] holds), give every decoding sequence one row and the prefilling ones
//! chunks of their prompts under a token budget (a long new prompt never stalls the streams that
//! are already decoding), run one [`Model::forward_batch`] over all of them, then sample each
//! sequence that got logits and send its token. Because no row's arithmetic reads another row, and
//! each sequence samples from its own seeded stream, a request's tokens and logprobs are the same
//! bits however it was batched, chunked or resumed from the cache.

use crate::error::Result;
use crate::generate::FinishReason;
use crate::inspect::{top_k, Distribution};
use crate::kv_cache::KvCache;
use crate::model::{Batched, Model, Rows, Scratch};
use crate::prefix_cache::{CacheStats, Match, PrefixCache};
use crate::sampler::Sampling;
use crate::sequence::Sequence;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One sequence to generate.
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    pub stop_at_eos: bool,
    /// Report each token's log-probability and this many alternatives (None: no logprobs).
    pub logprobs: Option<usize>,
    pub client: Box<dyn Client>,
}

/// Where a request's events go.
pub trait Client: Send {
    /// Delivers an event; false if the receiver is gone.
    fn send(&mut self, event: Event) -> bool;
    /// Whether the receiver has gone away (the request is then cancelled).
    fn gone(&self) -> bool;
}

/// A token's log-probability (natural log, from the logits before temperature) and the most
/// likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Prefill finished: how much of the prompt came from the prompt cache.
    Started {
        cached_tokens: usize,
        queue: Duration,
        prompt_time: Duration,
    },
    Token {
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    Error(String),
}

/// What a finished request cost (llama.cpp's `timings` names: `cache_n` / `prompt_n`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the prompt cache (`cache_n`).
    pub cached_tokens: usize,
    /// Prompt tokens computed (`prompt_n` = prompt_tokens - cached_tokens).
    pub prompt_computed: usize,
    pub completion_tokens: usize,
    /// Submission to admission.
    pub queue: Duration,
    /// Admission to the first token: restoring the cached prefix and computing the rest.
    pub prompt_time: Duration,
    /// First token to the last.
    pub decode_time: Duration,
}

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences running at once.
    pub parallel: usize,
    /// Rows per forward step (decode rows first, then prefill chunks).
    pub batch_tokens: usize,
    /// Bytes the prompt cache may hold.
    pub cache_bytes: usize,
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
    fn finished(&mut self, _u: &Usage, _cancelled: bool) {}
}

/// Messages to the engine thread.
pub enum Command {
    Submit(Request, Instant),
    /// Finish the running and waiting requests, then return.
    Drain,
}

struct Running {
    seq: Sequence,
    req: Request,
    hold: Option<Match>,
    cached: usize,
    queued: Duration,
    admitted: Instant,
    first_token: Option<Instant>,
    last_token: Instant,
}

impl Batched for Running {
    fn rows(&mut self) -> Rows<'_> {
        self.seq.rows()
    }
}

/// The engine: the model, the prompt cache and the running sequences, stepped on one thread.
pub struct Engine {
    model: Arc<Model>,
    cfg: EngineConfig,
    cache: PrefixCache,
    scratch: Scratch,
    running: Vec<Running>,
    waiting: VecDeque<(Request, Instant)>,
    /// Requests submitted but not yet admitted (shared with the submitting side).
    queued: Arc<AtomicUsize>,
}

impl Engine {
    pub fn new(model: Arc<Model>, cfg: EngineConfig, queued: Arc<AtomicUsize>) -> Engine {
        let scratch = Scratch::new(&model.config, cfg.batch_tokens.max(1));
        Engine {
            cache: PrefixCache::new(cfg.cache_bytes),
            scratch,
            model,
            cfg,
            running: vec![],
            waiting: VecDeque::new(),
            queued,
        }
    }

    /// The most K/V bytes the running sequences can hold: every slot at the full context.
    pub fn kv_limit(model: &Model, parallel: usize) -> usize {
        parallel * model.config.n_positions * KvCache::bytes_per_position(&model.config)
    }

    /// Runs until [`Command::Drain`] (or every sender is gone) and nothing is left to do.
    pub fn run(mut self, rx: mpsc::Receiver<Command>, monitor: &mut dyn Monitor) {
        let mut draining = false;
        loop {
            let idle = self.running.is_empty() && self.waiting.is_empty();
            if idle && draining {
                return;
            }
            // Wait for work when idle; otherwise take whatever has arrived and go on.
            let first = if idle { rx.recv().ok() } else { None };
            if idle && first.is_none() {
                return; // every sender is gone
            }
            for msg in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match msg {
                    Command::Submit(r, at) => self.waiting.push_back((r, at)),
                    Command::Drain => draining = true,
                }
            }
            if self.running.is_empty() && self.waiting.is_empty() {
                continue;
            }
            self.admit(monitor);
            if let Err(e) = self.step(monitor) {
                // A step that fails fails every sequence in it; the engine goes on.
                for mut r in self.running.drain(..) {
                    r.req.client.send(Event::Error(e.to_string()));
                    if let Some(m) = r.hold.take() {
                        self.cache.release(m);
                    }
                }
            }
            monitor.step(&self.gauges());
        }
    }

    fn gauges(&self) -> Gauges {
        Gauges {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_bytes: self.running.iter().map(|r| r.seq.cache().bytes()).sum(),
            cache_bytes: self.cache.bytes(),
            cache_tokens: self.cache.tokens(),
            stats: self.cache.stats,
        }
    }

    /// Moves waiting requests into free slots, each starting from its longest cached prefix.
    fn admit(&mut self, monitor: &mut dyn Monitor) {
        while self.running.len() < self.cfg.parallel {
            let Some((mut req, at)) = self.waiting.pop_front() else { break };
            self.queued.fetch_sub(1, Ordering::Relaxed);
            if req.client.gone() {
                let usage = Usage { prompt_tokens: req.prompt.len(), queue: at.elapsed(), ..Usage::default() };
                monitor.finished(&usage, true);
                continue;
            }
            let admitted = Instant::now();
            let seq = match Sequence::new(&self.model, &req.prompt, req.max_new_tokens, req.sampling) {
                Ok(s) => s,
                Err(e) => {
                    req.client.send(Event::Error(e.to_string()));
                    continue;
                }
            };
            self.running.push(Running {
                seq,
                req,
                hold: None,
                cached: 0,
                queued: admitted - at,
                admitted,
                first_token: None,
                last_token: admitted,
            });
        }
    }

    /// One forward over every running sequence, then a token for each that got logits.
    fn step(&mut self, monitor: &mut dyn Monitor) -> Result<()> {
        // Cancelled requests leave first, freeing their slots (`remove` keeps admission order).
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].req.client.gone() {
                let r = self.running.remove(i);
                self.finish(r, None, monitor);
            } else {
                i += 1;
            }
        }
        self.start_prefills(monitor);
        if self.running.iter().all(|r| r.hold.is_none()) {
            return Ok(());
        }
        // Decode rows first (one each), then prefill chunks in admission order under the budget.
        let mut budget = self.cfg.batch_tokens.max(1);
        for r in self.running.iter_mut() {
            let n = usize::from(r.hold.is_some() && r.seq.pending() == 1);
            r.seq.schedule(n);
            budget = budget.saturating_sub(n);
        }
        for r in self.running.iter_mut().filter(|r| r.hold.is_some() && r.seq.pending() > 1) {
            r.seq.schedule(budget);
            budget -= budget.min(r.seq.pending());
        }
        self.model.forward_batch(&mut self.running, &mut self.scratch)?;

        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            if r.seq.pending() > 0 {
                i += 1; // still prefilling
                continue;
            }
            let now = Instant::now();
            let id = r.seq.sample();
            let logprob = r.req.logprobs.map(|k| token_logprob(r.seq.logits(), id, k));
            if r.first_token.is_none() {
                r.first_token = Some(now);
                monitor.first_token(now - r.admitted + r.queued);
                r.req.client.send(Event::Started {
                    cached_tokens: r.cached,
                    queue: r.queued,
                    prompt_time: now - r.admitted,
                });
                if self.cfg.cache_bytes > 0 {
                    self.cache.insert(r.seq.prompt(), r.seq.cache());
                }
            } else {
                monitor.token(now - r.last_token);
            }
            r.last_token = now;
            let alive = r.req.client.send(Event::Token { id, logprob });
            let eos = r.req.stop_at_eos && id == self.model.config.eos_token_id;
            let full = r.seq.generated().len() >= r.req.max_new_tokens;
            if !alive || eos || full {
                let r = self.running.remove(i);
                let finish = if eos { FinishReason::Eos } else { FinishReason::Length };
                self.finish(r, alive.then_some(finish), monitor);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Starts the sequences that have not started: each takes the longest prefix the prompt cache
    /// holds *now*, so it looks up as late as possible. One whose prompt shares more with an
    /// earlier sequence still prefilling than the cache holds waits for that one's prompt to
    /// enter the cache, instead of computing the same prefix twice; the earliest always goes.
    fn start_prefills(&mut self, monitor: &mut dyn Monitor) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].hold.is_some() {
                i += 1;
                continue;
            }
            let (before, rest) = self.running.split_at_mut(i);
            let r = &mut rest[0];
            let prompt = r.seq.prompt();
            let cap = prompt.len().saturating_sub(1);
            let ahead = before
                .iter()
                .filter(|q| q.first_token.is_none())
                .map(|q| q.seq.prompt().iter().zip(prompt).take_while(|(a, b)| a == b).count().min(cap))
                .max()
                .unwrap_or(0);
            if self.cfg.cache_bytes > 0 && ahead > self.cache.matched_len(r.seq.ids()) {
                i += 1; // waits for the earlier one's prompt
                continue;
            }
            match self.cache.lookup(&mut r.seq) {
                Ok(m) => {
                    r.cached = m.len;
                    r.hold = Some(m);
                    i += 1;
                }
                Err(e) => {
                    let mut r = self.running.remove(i);
                    r.req.client.send(Event::Error(e.to_string()));
                    self.finish(r, None, monitor);
                }
            }
        }
    }

    /// Ends a request: `Done` (or nothing, when cancelled), its K/V into the prompt cache, its
    /// hold released.
    fn finish(&mut self, mut r: Running, finish: Option<FinishReason>, monitor: &mut dyn Monitor) {
        let now = Instant::now();
        let first = r.first_token.unwrap_or(now);
        let usage = Usage {
            prompt_tokens: r.seq.prompt().len(),
            cached_tokens: r.cached,
            prompt_computed: r.seq.prompt().len() - r.cached,
            completion_tokens: r.seq.generated().len(),
            queue: r.queued,
            prompt_time: first - r.admitted,
            decode_time: now - first,
        };
        if self.cfg.cache_bytes > 0 && r.first_token.is_some() {
            self.cache.insert(r.seq.ids(), r.seq.cache());
        }
        if let Some(m) = r.hold.take() {
            self.cache.release(m);
        }
        monitor.finished(&usage, finish.is_none());
        if let Some(finish) = finish {
            r.req.client.send(Event::Done { finish, usage });
        }
    }
}

/// Starts an engine on its own thread. Returns the channel to submit to and the thread.
pub fn spawn(
    model: Arc<Model>,
    cfg: EngineConfig,
    queued: Arc<AtomicUsize>,
    mut monitor: Box<dyn Monitor>,
    pool: Option<rayon::ThreadPool>,
) -> std::io::Result<(mpsc::Sender<Command>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new().name("kvgpt-engine".into()).spawn(move || {
        let engine = Engine::new(model, cfg, queued);
        match pool {
            Some(p) => p.install(|| engine.run(rx, monitor.as_mut())),
            None => engine.run(rx, monitor.as_mut()),
        }
    })?;
    Ok((tx, handle))
}

/// The log-probability of `id` under `logits` and the `k` most likely alternatives.
pub fn token_logprob(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let d = Distribution::of(logits);
    TokenLogprob {
        logprob: d.logprob(logits[id as usize]),
        top: top_k(logits, k).0.iter().map(|c| (c.id, c.logprob)).collect(),
    }
}
