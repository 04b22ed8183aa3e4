//! The drafts: n-gram lookup over the sequence itself, and a (smaller or int8) model with its own
//! KV cache kept in step with what the target accepted.

use super::Draft;
use crate::error::{Error, Result};
use crate::kv_cache::{BlockShape, KvCache, Pool};
use crate::model::{Model, Scratch};
use crate::sampler::argmax;
use std::sync::Arc;

/// Prompt lookup (n-gram) drafting: the tokens that followed the latest earlier occurrence of the
/// longest suffix of the sequence (at most `max_ngram` tokens) are proposed again.
pub struct Lookup {
    pub max_ngram: usize,
}

impl Draft for Lookup {
    fn propose(&mut self, ids: &[u32], k: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let len = ids.len();
        for n in (1..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let tail = &ids[len - n..];
            if let Some(start) = (0..len - n).rev().find(|&i| &ids[i..i + n] == tail) {
                out.extend(ids[start + n..].iter().take(k));
                return Ok(());
            }
        }
        Ok(())
    }
}

/// Rows of the draft's prompt chunks: its scratch stays small (one per sequence in a server).
const DRAFT_CHUNK: usize = 64;

/// A model that drafts greedily: its own cache holds the K/V of `seen` (the accepted tokens and
/// the drafts it fed); each proposal first forgets what the target did not accept (the longest
/// common prefix with the accepted ids is kept), feeds what it has not seen, then decodes.
pub struct ModelDraft {
    model: Arc<Model>,
    cache: KvCache,
    scratch: Scratch,
    seen: Vec<u32>,
    logits: Vec<f32>,
}

impl ModelDraft {
    /// A draft for a sequence of up to `capacity` positions (fewer if the draft has fewer), its
    /// blocks from `pool` when they are the pool's shape (a server's one pool), else its own.
    pub fn new(model: Arc<Model>, capacity: usize, pool: Option<&Pool>) -> ModelDraft {
        let cfg = &model.config;
        let capacity = capacity.min(cfg.n_positions);
        let shared = pool.filter(|p| p.shape() == BlockShape::of(cfg, model.kv()));
        ModelDraft {
            cache: match shared {
                Some(p) => KvCache::in_pool(p, cfg, capacity),
                None => model.new_cache(capacity),
            },
            scratch: Scratch::new(cfg, DRAFT_CHUNK.min(capacity.max(1))),
            seen: Vec::with_capacity(capacity + 1),
            logits: vec![0.0; cfg.vocab_size],
            model,
        }
    }

    /// The positions its cache holds (for the learner's view and the rollback test).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }
}

impl ModelDraft {
    /// Forgets what the target did not accept (the longest common prefix of `seen` and `ids`
    /// is kept, but at most `keep`), then feeds the rest of `ids` (`logits`: the last one's).
    fn catch_up(&mut self, ids: &[u32], keep: usize, logits: bool) -> Result<()> {
        let common = self.seen.iter().zip(ids).take_while(|(a, b)| a == b).count().min(keep);
        self.seen.truncate(common);
        self.cache.truncate(common);
        if common < ids.len() {
            let out = if logits { &mut self.logits[..] } else { &mut [] };
            self.model.run(&ids[common..], &mut self.cache, &mut self.scratch, out)?;
            self.seen.extend_from_slice(&ids[common..]);
        }
        Ok(())
    }
}

/// A draft whose blocks come from a shared pool may find it full: it then drafts nothing (or what
/// it had proposed so far), and the sequence decodes plainly this step. Its cache and `seen` are
/// as they were (a forward that cannot reserve computes nothing).
fn unless_pool_full(r: Result<()>) -> Result<()> {
    match r {
        Err(Error::KvPoolFull { .. }) => Ok(()),
        r => r,
    }
}

impl Draft for ModelDraft {
    fn prefill(&mut self, ids: &[u32]) -> Result<()> {
        let ids = &ids[..ids.len().min(self.cache.capacity())];
        unless_pool_full(self.catch_up(ids, ids.len(), false))
    }

    fn release(&mut self) {
        self.seen.clear();
        self.cache.reset();
    }

    fn propose(&mut self, ids: &[u32], k: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        // Room: every id and k − 1 drafts are fed (the last draft never is).
        let k = k.min((self.cache.capacity() + 1).saturating_sub(ids.len()));
        if k == 0 || ids.is_empty() {
            return Ok(());
        }
        // Always feed at least the last id, for its logits.
        if let Err(e) = self.catch_up(ids, ids.len() - 1, true) {
            return unless_pool_full(Err(e));
        }
        let (model, cache, scratch) = (&*self.model, &mut self.cache, &mut self.scratch);
        loop {
            let t = argmax(&self.logits);
            out.push(t);
            if out.len() == k {
                return Ok(());
            }
            unless_pool_full(model.run(&[t], cache, scratch, &mut self.logits))?;
            if self.seen.len() == cache.len() {
                return Ok(()); // the pool had no block for it: the drafts so far
            }
            self.seen.push(t);
        }
    }
}

/// Where drafts come from, shared by every sequence that drafts (a server's draft model is
/// loaded once).
#[derive(Clone)]
pub enum DraftSource {
    Lookup { max_ngram: usize },
    Model(Arc<Model>),
}

impl DraftSource {
    /// A draft for one sequence of up to `capacity` positions (its blocks from `pool` when they
    /// are its shape).
    pub fn make(&self, capacity: usize, pool: Option<&Pool>) -> Box<dyn Draft> {
        match self {
            DraftSource::Lookup { max_ngram } => Box::new(Lookup { max_ngram: *max_ngram }),
            DraftSource::Model(m) => Box::new(ModelDraft::new(m.clone(), capacity, pool)),
        }
    }

    /// Checks that a draft model speaks the target's tokens: the same vocabulary and end-of-text
    /// id. (The tokenizers themselves are compared where both are loaded.)
    pub fn check(&self, target: &Model) -> Result<()> {
        let DraftSource::Model(m) = self else { return Ok(()) };
        let (d, t) = (&m.config, &target.config);
        if d.vocab_size != t.vocab_size || d.eos_token_id != t.eos_token_id {
            return Err(Error::Invalid(format!(
                "the draft model's vocabulary ({} tokens, end-of-text {}) is not the model's ({} tokens, \
                 end-of-text {}); draft with a model that has the same tokenizer",
                d.vocab_size, d.eos_token_id, t.vocab_size, t.eos_token_id
            )));
        }
        Ok(())
    }
}
