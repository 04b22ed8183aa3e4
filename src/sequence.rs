//! A sequence being generated: its ids (prompt, then generated tokens), its own KV cache, its
//! sampler and the logits of its last fed position. The step API that `generate`, `verify`,
//! `bench`, `inspect` and the server share: schedule some of the pending tokens, run a forward
//! (alone or batched with other sequences), sample.

use crate::error::{Error, Result};
use crate::kv_cache::{KvCache, KvSpan};
use crate::model::{Model, Rows, Scratch};
use crate::sampler::{Sampler, Sampling};
use crate::tap::Tap;

pub struct Sequence {
    /// The prompt, then every generated token.
    ids: Vec<u32>,
    prompt_len: usize,
    /// K/V of `ids[..cache.len()]`; the position of the next token fed is `cache.len()`.
    cache: KvCache,
    sampler: Sampler,
    /// `[V]`: the logits of position `cache.len() - 1`, valid once every id has been fed.
    logits: Vec<f32>,
}

impl Sequence {
    /// A sequence for `prompt` with room for `max_new` generated tokens. Its cache holds
    /// `prompt + max_new − 1` positions (the last token is never fed); errors if that exceeds
    /// the model's positions.
    pub fn new(model: &Model, prompt: &[u32], max_new: usize, sampling: Sampling) -> Result<Sequence> {
        let cfg = &model.config;
        check_prompt(model, prompt, max_new)?;
        let capacity = prompt.len() + max_new.saturating_sub(1);
        let mut ids = Vec::with_capacity(prompt.len() + max_new);
        ids.extend_from_slice(prompt);
        Ok(Sequence {
            ids,
            prompt_len: prompt.len(),
            cache: KvCache::with_capacity(cfg, capacity),
            sampler: Sampler::with_isa(sampling, cfg.vocab_size, model.isa()),
            logits: vec![0.0; cfg.vocab_size],
        })
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
        let logits: &mut [f32] = if b == self.ids.len() && b > a { &mut self.logits } else { &mut [] };
        Rows { ids: &self.ids[a..b], cache: &mut self.cache, logits }
    }

    /// Feeds every pending token (in chunks of the scratch's rows), leaving the logits of the last.
    pub fn feed(&mut self, model: &Model, scratch: &mut Scratch) -> Result<()> {
        let a = self.cache.len();
        model.run(&self.ids[a..], &mut self.cache, scratch, &mut self.logits)
    }

    /// The logits of the last fed position (before temperature).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Chooses the next token from [`Sequence::logits`] and appends it.
    pub fn sample(&mut self) -> u32 {
        let id = self.sampler.sample_after(&self.logits, &self.ids, self.prompt_len);
        self.ids.push(id);
        id
    }

    /// Appends a token chosen elsewhere (forced decoding, or the other side of a comparison).
    /// Whether it fits the cache is checked when it is fed (the last token never is).
    pub fn push(&mut self, id: u32) -> Result<()> {
        if id as usize >= self.logits.len() {
            return Err(Error::BadTokenId { id, vocab: self.logits.len() });
        }
        self.ids.push(id);
        Ok(())
    }

    /// Starts over with another prompt, keeping the cache's memory (its capacity stays) and the
    /// sampler's stream.
    pub fn restart(&mut self, prompt: &[u32]) -> Result<()> {
        self.cache.reset();
        self.cache.check_room(prompt.len())?;
        self.ids.clear();
        self.ids.extend_from_slice(prompt);
        self.prompt_len = prompt.len();
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
        let v = self.logits.len();
        if logits.len() >= v {
            self.logits.copy_from_slice(&logits[logits.len() - v..]);
        }
        Ok(())
    }

    /// Mutable access to the cache, for tests that corrupt it on purpose.
    pub fn cache_mut(&mut self) -> &mut KvCache {
        &mut self.cache
    }

    /// The cache, for views of what it holds after the run.
    pub fn into_cache(self) -> KvCache {
        self.cache
    }

    /// Forgets the cache, so that the next feed recomputes every position (the uncached mode).
    pub fn forget_cache(&mut self) {
        self.cache.reset();
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
