//! A conversation that keeps its KV cache between turns: each turn computes only its own new
//! tokens (and the last answer's final token, which generation never feeds), then the answer.
//!
//! The ids are the whole conversation; `cache.len()` of them have their K/V in the cache. A turn
//! appends its ids, feeds everything not yet cached, and decodes until `on_token` says stop, the
//! end-of-text token comes, `max_new` tokens are out or the context is full. With a draft, each
//! step verifies the drafted tokens; tokens accepted past the answer's end are dropped, so the
//! conversation holds exactly what was shown.

use crate::error::{Error, Result};
use crate::generate::Step;
use crate::kv_cache::KvCache;
use crate::model::CHUNK_ROWS;
use crate::model::{Model, Scratch};
use crate::prompt_file;
use crate::sampler::Sampling;
use crate::sequence::Sequence;
use crate::speculative::{DraftConfig, DraftStats};
use crate::store::Store;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The conversation is one [`Sequence`] that grows turn by turn: each turn's text is appended as
/// its prompt, and the answer decoded after it (speculatively, with a draft).
pub struct Chat {
    seq: Sequence,
    scratch: Scratch,
    /// Each turn since the conversation began (or was loaded, kept or reset): where its text
    /// starts in the ids and where its answer starts.
    turns: Vec<(usize, usize)>,
    /// The K/V store (`--kv-disk`) a fresh conversation starts from and every answer goes to.
    store: Option<Arc<Store>>,
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
    /// Steps of the answer after its first token: drafting (with a draft), a forward pass, then
    /// choosing the next token (or tokens, when drafts are accepted).
    pub decode_steps: usize,
    pub decode_time: Duration,
    /// Choosing the answer's tokens, all of them (already part of `prefill_time` and
    /// `decode_time`).
    pub sample_time: Duration,
    /// The draft's proposals (already part of `decode_time`).
    pub draft_time: Duration,
}

impl Chat {
    pub fn new(model: &Model, sampling: Sampling) -> Chat {
        let cfg = &model.config;
        Chat {
            seq: Sequence::open(model, sampling),
            scratch: Scratch::new(cfg, CHUNK_ROWS.min(cfg.n_positions)),
            turns: Vec::new(),
            store: None,
        }
    }

    /// Starts each fresh conversation from what `store` holds of it, and writes every turn there.
    pub fn keep_in(&mut self, store: Arc<Store>) {
        self.store = Some(store);
    }

    /// Answers speculatively from now on, with a draft made by `cfg` (the same answers).
    pub fn speculate(&mut self, cfg: &DraftConfig) {
        self.seq.speculate_with(cfg);
    }

    /// What drafting did over the whole conversation, if the chat speculates.
    pub fn drafts(&self) -> Option<DraftStats> {
        self.seq.speculation().map(|s| s.stats)
    }

    /// The conversation's ids so far.
    pub fn ids(&self) -> &[u32] {
        self.seq.ids()
    }

    /// Positions with their K/V in the cache.
    pub fn cached(&self) -> usize {
        self.seq.cache().len()
    }

    pub fn cache(&self) -> &KvCache {
        self.seq.cache()
    }

    /// Positions left in the context for new tokens.
    pub fn room(&self, model: &Model) -> usize {
        model.config.n_positions - self.ids().len()
    }

    /// Forgets the conversation.
    pub fn reset(&mut self) -> Result<()> {
        self.turns.clear();
        self.seq.restart(&[])
    }

    /// Where the last turn's text and its answer start in the ids, if there is a turn since the
    /// conversation began (or was loaded, cut or reset).
    pub fn last_turn(&self) -> Option<(usize, usize)> {
        self.turns.last().copied()
    }

    /// Removes the last turn (its text and its answer); returns the ids removed, or None when
    /// there is no turn to remove (none yet, or the conversation was loaded or cut since).
    pub fn undo(&mut self) -> Option<usize> {
        let (start, _) = self.turns.pop()?;
        let removed = self.ids().len() - start;
        self.seq.truncate(start);
        Some(removed)
    }

    /// Replaces the conversation's first `old` ids (its opening text) with `new`: the turns after
    /// them move, so their K/V are computed again at the next turn (the cache keeps only what
    /// is unchanged before the first difference).
    pub fn replace_opening(&mut self, old: usize, new: &[u32]) -> Result<()> {
        let ids = self.ids();
        let keep = ids.iter().zip(new).take_while(|(a, b)| a == b).count().min(old).min(self.cached());
        let rest = ids[old.min(ids.len())..].to_vec();
        let moved = new.len() as isize - old as isize;
        if new.len() + rest.len() > self.seq.cache().capacity() {
            return Err(Error::Invalid(format!(
                "the new opening makes the conversation {} tokens, past the context",
                new.len() + rest.len()
            )));
        }
        self.seq.truncate(keep);
        self.seq.append_prompt(&[&new[keep..], &rest[..]].concat())?;
        // Every turn's text starts after the opening but the first's, which holds it; every
        // answer starts after it.
        let shift = |at: usize| (at as isize + moved) as usize;
        for t in &mut self.turns {
            *t = (if t.0 < old { t.0 } else { shift(t.0) }, shift(t.1));
        }
        Ok(())
    }

    /// Keeps only the last `keep` ids and computes their K/V again from position 0 (GPT-2's
    /// positions are learned, so cached K/V cannot move). Returns how many were kept.
    pub fn keep_last(&mut self, model: &Model, keep: usize) -> Result<usize> {
        let ids = self.ids();
        let kept = ids[ids.len().saturating_sub(keep)..].to_vec();
        self.turns.clear();
        self.seq.restart(&kept)?;
        self.feed_pending(model)?;
        Ok(kept.len())
    }

    /// Feeds every id not yet in the cache.
    fn feed_pending(&mut self, model: &Model) -> Result<()> {
        if self.seq.pending() > 0 {
            self.seq.feed(model, &mut self.scratch)?;
        }
        Ok(())
    }

    /// Saves the whole conversation (ids and K/V) as a prompt cache file.
    pub fn save(&mut self, model: &Model, path: &Path) -> Result<()> {
        self.feed_pending(model)?;
        prompt_file::save(path, model, self.seq.ids(), self.seq.cache())
    }

    /// Replaces the conversation with the one `path` holds (its K/V restored, not recomputed).
    pub fn load(&mut self, model: &Model, path: &Path) -> Result<usize> {
        let saved = prompt_file::load(path, model)?;
        self.turns.clear();
        self.seq.restart(&saved.ids)?;
        self.seq.restore(&saved.kv, 0, saved.kv.len)?;
        Ok(saved.ids.len())
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
        if new.is_empty() || self.ids().len() + new.len() > n {
            return Err(Error::Invalid(format!(
                "a turn of {} tokens after {} of the conversation: it must be 1 to {} tokens",
                new.len(),
                self.ids().len(),
                n - self.ids().len()
            )));
        }
        let start = self.ids().len();
        self.seq.append_prompt(new)?;
        self.restore(model)?;
        let reused = self.cached();
        self.turns.push((start, self.ids().len()));
        let turn = self.answer(model, reused, max_new, on_token)?;
        if let Some(store) = &self.store {
            // The turn's prompt (its last block in part, found token exact by the next run that
            // says the same), then the conversation so far.
            store.save(&self.seq, self.turns.last().map_or(0, |t| t.1));
        }
        Ok(turn)
    }

    /// Drops the last answer and answers its turn again (with sampling, the sampler's next
    /// draws). Errors when there is no turn to answer again.
    pub fn regenerate(
        &mut self,
        model: &Model,
        max_new: usize,
        on_token: &mut dyn FnMut(u32) -> Result<Step>,
    ) -> Result<Turn> {
        let Some(&(_, answer)) = self.turns.last() else {
            return Err(Error::Invalid("there is no answer to generate again".into()));
        };
        // Back to before the turn's last token, which is fed again for the logits the answer
        // starts from.
        let last = self.ids()[answer - 1];
        self.seq.truncate(answer - 1);
        self.seq.append_prompt(&[last])?;
        let reused = self.cached();
        self.answer(model, reused, max_new, on_token)
    }

    /// A conversation with nothing cached yet starts from what the store holds of it.
    fn restore(&mut self, model: &Model) -> Result<()> {
        if let Some(store) = &self.store {
            store.restore(model, &mut self.seq)?;
        }
        Ok(())
    }

    /// Feeds what is not cached, then answers.
    fn answer(
        &mut self,
        model: &Model,
        reused: usize,
        max_new: usize,
        on_token: &mut dyn FnMut(u32) -> Result<Step>,
    ) -> Result<Turn> {
        let n = model.config.n_positions;
        let start = Instant::now();
        self.seq.feed(model, &mut self.scratch)?; // (a draft takes the turn in when it first drafts)
        let prefill_time = start.elapsed();
        let prompt = self.ids().len();
        let mut turn = Turn {
            reused,
            prefilled: prompt - reused,
            answer: Vec::new(),
            ended: Ended::Length,
            prefill_time,
            decode_steps: 0,
            decode_time: Duration::ZERO,
            sample_time: Duration::ZERO,
            draft_time: Duration::ZERO,
        };
        loop {
            let t = Instant::now();
            self.seq.sample();
            let took = t.elapsed();
            turn.sample_time += took;
            if turn.answer.is_empty() {
                turn.prefill_time += took;
            } else {
                turn.decode_time += took;
            }
            for j in 0..self.seq.new_tokens().len() {
                let id = self.seq.new_tokens()[j];
                turn.answer.push(id);
                let ended = if on_token(id)? == Step::Stop {
                    Some(Ended::Stopped)
                } else if id == model.config.eos_token_id {
                    Some(Ended::Eos)
                } else if turn.answer.len() == max_new {
                    Some(Ended::Length)
                } else if prompt + turn.answer.len() >= n {
                    Some(Ended::ContextFull)
                } else {
                    None
                };
                if let Some(ended) = ended {
                    self.seq.keep_generated(turn.answer.len()); // drafts accepted past the end go
                    turn.ended = ended;
                    return Ok(turn);
                }
            }
            let t = Instant::now();
            self.seq.draft(1)?;
            turn.draft_time += t.elapsed();
            self.seq.feed(model, &mut self.scratch)?;
            turn.decode_time += t.elapsed();
            turn.decode_steps += 1;
        }
    }
}
