//! A conversation that keeps its KV cache between turns: each turn computes only its own new
//! tokens (and the last answer's final token, which generation never feeds), then the answer.
//!
//! The ids are the whole conversation; `cache.len()` of them have their K/V in the cache. A turn
//! appends its ids, feeds everything not yet cached, and decodes until `on_token` says stop, the
//! end-of-text token comes, `max_new` tokens are out or the context is full.

use crate::error::{Error, Result};
use crate::model::CHUNK_ROWS;
use crate::prompt_file;
use crate::{KvCache, Model, NoTap, Sampler, Sampling, Scratch, Step};
use std::path::Path;
use std::time::{Duration, Instant};

pub struct Chat {
    ids: Vec<u32>,
    cache: KvCache,
    scratch: Scratch,
    sampler: Sampler,
    logits: Vec<f32>,
}

/// Why an answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// `on_token` said stop (the end of the answer's line, or Ctrl-C).
    Stopped,
    Eos,
    /// `max_new` tokens.
    Length,
    /// No position left for another token.
    ContextFull,
}

/// What one turn did.
#[derive(Clone, Debug)]
pub struct Turn {
    /// Positions whose K/V came from the cache.
    pub reused: usize,
    /// Positions computed before the answer (the turn's tokens, and any left unfed before it).
    pub prefilled: usize,
    /// Tokens of the answer.
    pub answer: Vec<u32>,
    pub ended: Ended,
    /// Computing those positions, and choosing the answer's first token.
    pub prefill_time: Duration,
    /// Steps of the answer after its first token: a forward pass, then choosing the next token.
    pub decode_steps: usize,
    pub decode_time: Duration,
    /// Choosing the answer's tokens, all of them (already part of `prefill_time` and
    /// `decode_time`).
    pub sample_time: Duration,
}

impl Chat {
    pub fn new(model: &Model, sampling: Sampling) -> Chat {
        let cfg = &model.config;
        Chat {
            ids: Vec::new(),
            cache: KvCache::new(cfg),
            scratch: Scratch::new(cfg, CHUNK_ROWS.min(cfg.n_positions)),
            sampler: Sampler::with_isa(sampling, cfg.vocab_size, model.isa()),
            logits: vec![0.0; cfg.vocab_size],
        }
    }

    /// The conversation's ids so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Positions with their K/V in the cache.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Positions left in the context for new tokens.
    pub fn room(&self, model: &Model) -> usize {
        model.config.n_positions - self.ids.len()
    }

    /// Forgets the conversation.
    pub fn reset(&mut self) {
        self.ids.clear();
        self.cache.reset();
    }

    /// Keeps only the last `keep` ids and computes their K/V again from position 0 (GPT-2's
    /// positions are learned, so cached K/V cannot move). Returns how many were kept.
    pub fn keep_last(&mut self, model: &Model, keep: usize) -> Result<usize> {
        let from = self.ids.len().saturating_sub(keep);
        let kept = self.ids.split_off(from);
        self.reset();
        self.ids = kept;
        self.feed_pending(model)?;
        Ok(self.ids.len())
    }

    /// Feeds every id not yet in the cache (no logits).
    fn feed_pending(&mut self, model: &Model) -> Result<()> {
        let done = self.cache.len();
        if done < self.ids.len() {
            model.run(&self.ids[done..], &mut self.cache, &mut self.scratch, &mut [])?;
        }
        Ok(())
    }

    /// Saves the whole conversation (ids and K/V) as a prompt cache file.
    pub fn save(&mut self, model: &Model, path: &Path) -> Result<()> {
        self.feed_pending(model)?;
        prompt_file::save(path, model, &self.ids, &self.cache)
    }

    /// Replaces the conversation with the one `path` holds (its K/V restored, not recomputed).
    pub fn load(&mut self, model: &Model, path: &Path) -> Result<usize> {
        let saved = prompt_file::load(path, model)?;
        self.reset();
        self.cache.append_span(&saved.kv, 0, saved.kv.len)?;
        self.ids = saved.ids;
        Ok(self.ids.len())
    }

    /// One turn: appends `new` (which must fit, see [`Chat::room`]), computes what is not
    /// cached, then answers, handing each token to `on_token`.
    pub fn turn(
        &mut self,
        model: &Model,
        new: &[u32],
        max_new: usize,
        on_token: &mut dyn FnMut(u32) -> Result<Step>,
    ) -> Result<Turn> {
        let n = model.config.n_positions;
        if new.is_empty() || self.ids.len() + new.len() > n {
            return Err(Error::Invalid(format!(
                "a turn of {} tokens after {} of the conversation: it must be 1 to {} tokens",
                new.len(),
                self.ids.len(),
                n - self.ids.len()
            )));
        }
        if let Some(&id) = new.iter().find(|&&id| id as usize >= model.config.vocab_size) {
            return Err(Error::BadTokenId { id, vocab: model.config.vocab_size });
        }
        let reused = self.cache.len();
        self.ids.extend_from_slice(new);
        let start = Instant::now();
        let fed = self.cache.len();
        model.run(&self.ids[fed..], &mut self.cache, &mut self.scratch, &mut self.logits)?;
        let prefill_time = start.elapsed();
        let prompt = self.ids.len();
        let mut turn = Turn {
            reused,
            prefilled: prompt - fed,
            answer: Vec::new(),
            ended: Ended::Length,
            prefill_time,
            decode_steps: 0,
            decode_time: Duration::ZERO,
            sample_time: Duration::ZERO,
        };
        while turn.answer.len() < max_new {
            let t = Instant::now();
            let id = self.sampler.sample_after(&self.logits, &self.ids, prompt);
            let took = t.elapsed();
            turn.sample_time += took;
            if turn.answer.is_empty() {
                turn.prefill_time += took;
            } else {
                turn.decode_time += took;
            }
            self.ids.push(id);
            turn.answer.push(id);
            if on_token(id)? == Step::Stop {
                turn.ended = Ended::Stopped;
                return Ok(turn);
            }
            if id == model.config.eos_token_id {
                turn.ended = Ended::Eos;
                return Ok(turn);
            }
            if turn.answer.len() == max_new {
                break;
            }
            if self.ids.len() >= n {
                turn.ended = Ended::ContextFull;
                return Ok(turn);
            }
            let t = Instant::now();
            model.forward(&[id], &mut self.cache, &mut self.scratch, &mut NoTap, &mut self.logits)?;
            turn.decode_time += t.elapsed();
            turn.decode_steps += 1;
        }
        Ok(turn)
    }
}
