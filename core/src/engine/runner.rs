//! The runner: has the speculating sequences draft, executes a plan's rows as one batched
//! forward, then samples every sequence that got its logits (with its log-probabilities when
//! asked). It decides nothing: how many tokens to draft is each sequence's own choice.

use super::policy::Phase;
use super::request::SeqId;
use super::slot::Slot;
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::logprobs::{token_logprob, TokenLogprob};
use crate::model::{Model, Scratch};
use crate::tap::NoTap;
use std::sync::Arc;

/// A token a step produced for the sequence in slot `slot`.
pub(super) struct Output {
    pub slot: usize,
    pub token: u32,
    pub logprob: Option<TokenLogprob>,
}

pub(super) struct Runner {
    pub model: Arc<Model>,
    scratch: Scratch,
}

impl Runner {
    pub fn new(model: Arc<Model>, rows: usize) -> Runner {
        let scratch = Scratch::new(&model.config, rows.max(1));
        Runner { model, scratch }
    }

    /// Computes the K/V of `ids` after what `cache` holds (no logits): a stored block proved by
    /// recomputing it.
    pub fn recompute(&mut self, ids: &[u32], cache: &mut KvCache) -> Result<()> {
        self.model.forward(ids, cache, &mut self.scratch, &mut NoTap, &mut [])
    }

    /// Every decoding sequence that speculates drafts the tokens this step verifies (before
    /// the plan, which gives a decoding sequence all its pending rows).
    pub fn draft(&mut self, slots: &mut [Slot]) -> Result<()> {
        let decoding = slots.iter().filter(|s| s.phase == Phase::Decoding).count();
        for s in slots.iter_mut().filter(|s| s.phase == Phase::Decoding) {
            s.seq.draft(decoding)?;
        }
        Ok(())
    }

    /// Feeds `rows` (sequence, rows; in slot order) in one forward, then samples the next token
    /// of each sequence that fed its last pending token: one output per token it appended (more
    /// than one when drafts were accepted), in order.
    pub fn execute(&mut self, slots: &mut [Slot], rows: &[(SeqId, usize)]) -> Result<Vec<Output>> {
        let mut plan = rows.iter().peekable();
        let mut batch = Vec::with_capacity(rows.len());
        let mut fed = Vec::with_capacity(rows.len());
        for (i, s) in slots.iter_mut().enumerate() {
            if let Some(&(_, n)) = plan.next_if(|(id, _)| *id == s.id) {
                fed.push(i);
                batch.push(s.seq.rows(n));
            }
        }
        if batch.is_empty() {
            return Ok(vec![]);
        }
        self.model.forward_batch(&mut batch, &mut self.scratch)?;
        drop(batch);
        let mut out = vec![];
        for i in fed {
            let s = &mut slots[i];
            if s.seq.pending() > 0 {
                continue; // still prefilling
            }
            // (A draft model takes in the prompt when it first drafts, not before the first token
            // goes out: a large batch may never draft at all.)
            s.seq.sample();
            for (j, &token) in s.seq.new_tokens().iter().enumerate() {
                let logprob = s.req.logprobs.map(|k| token_logprob(s.seq.new_logits(j), token, k));
                out.push(Output { slot: i, token, logprob });
            }
        }
        Ok(out)
    }
}
