//! A sequence being generated: its ids (prompt, then generated tokens), its own KV cache, its
//! sampler and the logits of its last fed position. The step API that `generate`, `verify`,
//! `bench`, `inspect` and the server share: schedule some of the pending tokens, run a forward
//! (alone or batched with other sequences), sample.
//!
//! Beside this core: [`drafting`] (speculative decoding's draft, proposed before a feed and
//! verified by [`Sequence::sample`]) and [`editing`] (a sequence grown, cut back and restarted
//! turn by turn: a chat, and Python's KV cache).

mod drafting;
mod editing;

use crate::error::{Error, Result};
use crate::kv_cache::{Block, KvCache, KvSpan, Pool};
use crate::model::{Model, Rows, Scratch};
use crate::sampler::{Sampler, Sampling};
use crate::speculative::Speculation;
use crate::tap::Tap;
use std::sync::Arc;

/// How a sequence's generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Eos,
    Length,
    /// A stop sequence (or the caller) said so.
    Stop,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
        }
    }

    /// OpenAI's `finish_reason`: "stop" (end-of-text or a stop sequence) or "length".
    pub fn openai(self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

pub struct Sequence {
    /// The prompt, then every generated token.
    ids: Vec<u32>,
    prompt_len: usize,
    /// K/V of `ids[..cache.len()]`; the position of the next token fed is `cache.len()`.
    cache: KvCache,
    sampler: Sampler,
    /// `[1 + K, V]`: the logits of the rows of the last feed (one, or the last accepted token and
    /// the drafted ones after it), valid once every id has been fed.
    logits: Vec<f32>,
    /// The row of `logits` the last token was chosen from.
    chosen: usize,
    /// Tokens the last choice appended (more than one when drafts were accepted).
    new: usize,
    /// Drafted tokens at the end of `ids`, fed but not yet verified (0 outside a verify step).
    drafted: usize,
    /// The draft, if this sequence decodes speculatively.
    spec: Option<Speculation>,
    vocab: usize,
}

impl Sequence {
    /// A sequence for `prompt` with room for `max_new` generated tokens. Its cache holds
    /// `prompt + max_new − 1` positions (the last token is never fed); errors if that exceeds
    /// the model's positions.
    pub fn new(model: &Model, prompt: &[u32], max_new: usize, sampling: Sampling) -> Result<Sequence> {
        Sequence::new_in(None, model, prompt, (max_new, sampling))
    }

    /// [`Sequence::new`] whose cache takes its blocks from `pool` (None: a pool of its own).
    pub fn new_in(
        pool: Option<&Pool>,
        model: &Model,
        prompt: &[u32],
        (max_new, sampling): (usize, Sampling),
    ) -> Result<Sequence> {
        check_prompt(model, prompt, max_new)?;
        let (cfg, capacity) = (&model.config, prompt.len() + max_new.saturating_sub(1));
        let cache = match pool {
            Some(pool) => KvCache::in_pool(pool, cfg, capacity),
            None => model.new_cache(capacity),
        };
        let mut seq = Sequence::with_cache(model, cache, sampling);
        seq.ids.extend_from_slice(prompt);
        seq.prompt_len = prompt.len();
        Ok(seq)
    }

    /// Empty, over `cache` (ids may hold one more than its capacity: the last is never fed).
    pub(super) fn with_cache(model: &Model, cache: KvCache, sampling: Sampling) -> Sequence {
        let cfg = &model.config;
        Sequence {
            ids: Vec::with_capacity(cache.capacity() + 1),
            prompt_len: 0,
            cache,
            sampler: Sampler::with_isa(sampling, cfg.vocab_size, model.isa()),
            logits: vec![0.0; cfg.vocab_size],
            chosen: 0,
            new: 0,
            drafted: 0,
            spec: None,
            vocab: cfg.vocab_size,
        }
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn prompt(&self) -> &[u32] {
        &self.ids[..self.prompt_len]
    }

    pub fn generated(&self) -> &[u32] {
        &self.ids[self.prompt_len..]
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Ids not yet fed to the model (their K/V are not in the cache).
    pub fn pending(&self) -> usize {
        self.ids.len() - self.cache.len()
    }

    /// This sequence's part of a [`Model::forward_batch`] call: up to `n` of its pending tokens
    /// (0: it sits the call out). The call that feeds the last pending token also computes the
    /// logits.
    pub fn rows(&mut self, n: usize) -> Rows<'_> {
        let a = self.cache.len();
        let b = a + n.min(self.ids.len() - a);
        let rows = (self.drafted + 1) * self.vocab;
        let logits: &mut [f32] = if b == self.ids.len() && b > a { &mut self.logits[..rows] } else { &mut [] };
        Rows { ids: &self.ids[a..b], cache: &mut self.cache, logits }
    }

    /// Feeds every pending token (in chunks of the scratch's rows), leaving the logits of the last
    /// (and of the drafted ones, when drafting).
    pub fn feed(&mut self, model: &Model, scratch: &mut Scratch) -> Result<()> {
        let a = self.cache.len();
        let rows = (self.drafted + 1) * self.vocab;
        model.run(&self.ids[a..], &mut self.cache, scratch, &mut self.logits[..rows])
    }

    /// The logits the last token was chosen from (before temperature).
    pub fn logits(&self) -> &[f32] {
        self.new_logits(self.chosen)
    }

    /// The tokens the last [`Sequence::sample`] appended: one, or with drafts the accepted ones
    /// and the model's own.
    pub fn new_tokens(&self) -> &[u32] {
        &self.ids[self.ids.len() - self.new..]
    }

    /// The logits token `j` of [`Sequence::new_tokens`] was chosen from.
    pub fn new_logits(&self, j: usize) -> &[f32] {
        let v = self.vocab;
        &self.logits[j * v..(j + 1) * v]
    }

    /// Chooses the next token from the last fed row's logits and appends it; returns it. With
    /// drafts fed, chooses at each row in turn, keeping each draft the model also chooses, and
    /// appends the model's own token at the first disagreement (or after the last draft): the
    /// cache forgets the rest. Returns the last token appended ([`Sequence::new_tokens`] has
    /// them all). One sampler draw per token, as without drafts.
    pub fn sample(&mut self) -> u32 {
        let (v, d) = (self.vocab, self.drafted);
        let base = self.ids.len() - d; // ids[..base] were accepted before this step
        let mut m = 0;
        let id = loop {
            let row = &self.logits[m * v..(m + 1) * v];
            let id = self.sampler.sample_after(row, &self.ids[..base + m], self.prompt_len);
            if m == d || id != self.ids[base + m] {
                break id;
            }
            m += 1;
        };
        self.ids.truncate(base + m);
        self.ids.push(id);
        if d > 0 {
            self.cache.truncate(base + m); // the rejected drafts' K/V go
            if let Some(spec) = &mut self.spec {
                spec.record(d, m);
            }
        }
        (self.chosen, self.new, self.drafted) = (m, m + 1, 0);
        id
    }

    /// Keeps only the first `n` generated tokens (a stop in the middle of accepted drafts).
    pub fn keep_generated(&mut self, n: usize) {
        self.ids.truncate(self.prompt_len + n);
        let fed = self.cache.len().min(self.ids.len().saturating_sub(1));
        self.cache.truncate(fed);
        self.new = self.new.min(n);
    }

    /// Appends a token chosen elsewhere (forced decoding, or the other side of a comparison).
    /// Whether it fits the cache is checked when it is fed (the last token never is).
    pub fn push(&mut self, id: u32) -> Result<()> {
        if id as usize >= self.vocab {
            return Err(Error::BadTokenId { id, vocab: self.vocab });
        }
        self.ids.push(id);
        Ok(())
    }

    /// Feeds every pending token in one forward call observed by `tap`; `logits` (`[R, V]`)
    /// receives the logits of the last R of them, and the last row becomes [`Sequence::logits`].
    pub fn feed_observed(
        &mut self,
        model: &Model,
        scratch: &mut Scratch,
        tap: &mut dyn Tap,
        logits: &mut [f32],
    ) -> Result<()> {
        let a = self.cache.len();
        model.forward(&self.ids[a..], &mut self.cache, scratch, tap, logits)?;
        let v = self.vocab;
        if logits.len() >= v {
            self.logits[..v].copy_from_slice(&logits[logits.len() - v..]);
            self.chosen = 0;
        }
        Ok(())
    }

    /// Mutable access to the cache, for tests that corrupt it on purpose.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn cache_mut(&mut self) -> &mut KvCache {
        &mut self.cache
    }

    /// The cache, for views of what it holds after the run.
    pub fn into_cache(self) -> KvCache {
        self.cache
    }

    /// Gives every K/V block back (a preempted sequence), its draft's too: drafts not yet
    /// verified are dropped, the ids and the sampler kept, so feeding every id again continues
    /// where it was.
    pub fn preempt(&mut self) {
        self.ids.truncate(self.ids.len() - self.drafted);
        self.drafted = 0;
        self.cache.reset();
        if let Some(spec) = &mut self.spec {
            spec.release();
        }
    }

    /// Forgets the cache, so that the next feed recomputes every position (the uncached mode).
    pub fn forget_cache(&mut self) {
        self.cache.reset();
    }

    /// Maps the prompt cache's blocks for this sequence's whole blocks in place of its own
    /// (see [`KvCache::share_whole`]); how many it gave up.
    pub fn share_whole(&mut self, blocks: &[Arc<Block>]) -> usize {
        self.cache.share_whole(blocks)
    }

    /// Starts the empty cache from the blocks of a prompt-cache hit holding K/V of `ids[..len]`.
    pub fn map_prefix(&mut self, blocks: &[Arc<Block>], len: usize) -> Result<()> {
        if len > self.ids.len() {
            return Err(Error::Invalid("a mapped prefix is longer than the sequence".into()));
        }
        self.cache.map_prefix(blocks, len)
    }

    /// Starts the cache from K/V computed elsewhere for `ids[..]` (a cached prefix): positions
    /// `cache.len()..cache.len() + (to - from)` take positions `from..to` of `span`.
    pub fn restore(&mut self, span: &KvSpan, from: usize, to: usize) -> Result<()> {
        if self.cache.len() + to - from > self.ids.len() {
            return Err(Error::Invalid("a restored prefix is longer than the sequence".into()));
        }
        self.cache.append_span(span, from, to)
    }
}

/// Checks what [`Sequence::new`] needs of a prompt: tokens, each in the vocabulary, and room for
/// `max_new` more in the model's positions.
pub fn check_prompt(model: &Model, prompt: &[u32], max_new: usize) -> Result<()> {
    let vocab = model.config.vocab_size;
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt has no tokens".into()));
    }
    check_context(model, prompt.len(), max_new)?;
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::BadTokenId { id, vocab });
    }
    Ok(())
}

/// Checks that the prompt and the new tokens fit the model's positions. The last new token is
/// sampled and never fed back: prompt + new − 1 positions are run.
pub fn check_context(model: &Model, prompt: usize, new: usize) -> Result<()> {
    check_positions(model, prompt, new, 1)
}

/// Errors unless `prompt` tokens and then `fed` more, each fed to the model (as a benchmark's
/// decode steps are), fit the model's positions.
pub fn check_fed(model: &Model, prompt: usize, fed: usize) -> Result<()> {
    check_positions(model, prompt, fed, 0)
}

/// `new` tokens after `prompt`, of which the last `unfed` are never run.
fn check_positions(model: &Model, prompt: usize, new: usize, unfed: usize) -> Result<()> {
    let n_positions = model.config.n_positions;
    let room = if prompt <= n_positions { n_positions - prompt + unfed } else { 0 };
    if prompt > n_positions || new > room {
        return Err(Error::ContextOverflow { prompt, new, n_positions, room });
    }
    Ok(())
}
