//! Speculative decoding on a sequence: the draft it holds, the tokens drafted before a feed
//! (verified by [`Sequence::sample`]), and what drafting did.

use super::Sequence;
use crate::error::Result;
use crate::speculative::{DraftConfig, Speculation};

impl Sequence {
    /// Decodes speculatively from now on, with this draft (see [`crate::speculative`]).
    pub fn speculate(&mut self, spec: Speculation) {
        self.logits.resize((1 + spec.max_k) * self.vocab, 0.0);
        self.spec = Some(spec);
    }

    /// Decodes speculatively from now on with a draft made by `cfg`, sized for this sequence
    /// (a draft model's K/V in a cache of its own).
    pub fn speculate_with(&mut self, cfg: &DraftConfig) {
        self.speculate(cfg.speculation(self.cache.capacity() + 1, None));
    }

    /// [`Sequence::speculate_with`] whose draft model takes its blocks from this sequence's
    /// pool, when they are its shape (a server's one pool: drafts count in its memory).
    pub fn speculate_in_pool(&mut self, cfg: &DraftConfig) {
        let pool = self.cache.pool().clone();
        self.speculate(cfg.speculation(self.cache.capacity() + 1, Some(&pool)));
    }

    /// Decodes without a draft from now on.
    pub fn stop_speculating(&mut self) {
        self.spec = None;
    }

    /// The draft and what it did, if this sequence decodes speculatively.
    pub fn speculation(&self) -> Option<&Speculation> {
        self.spec.as_ref()
    }

    /// Drafts the tokens the next feed verifies, if this sequence decodes speculatively and has
    /// chosen its last token (one pending), as one of `batch` sequences decoding together;
    /// returns how many were drafted. They are fed after the last token and verified by
    /// [`Sequence::sample`].
    pub fn draft(&mut self, batch: usize) -> Result<usize> {
        let Some(spec) = &mut self.spec else { return Ok(0) };
        if self.ids.len() != self.cache.len() + 1 {
            return Ok(0);
        }
        // Every drafted token is fed, so they must fit the cache; the last chosen token never is.
        let room = self.cache.capacity().saturating_sub(self.ids.len());
        let k = spec.plan(room, batch);
        spec.propose(&self.ids, k)?;
        self.ids.extend_from_slice(&spec.proposed);
        self.drafted = spec.proposed.len();
        Ok(self.drafted)
    }

    /// Has the draft (if any) take in what the cache holds, once the prompt is computed, so
    /// its prefill is not part of the first decode step.
    pub fn prefill_draft(&mut self) -> Result<()> {
        match &mut self.spec {
            Some(spec) => spec.prefill(&self.ids[..self.cache.len()]),
            None => Ok(()),
        }
    }
}
