//! A sequence edited turn by turn, as a conversation uses it: opened empty with room for the
//! whole context, grown by prompts, cut back to an earlier point, started over.

use super::Sequence;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampler::Sampling;

impl Sequence {
    /// A sequence with no ids yet and room for the model's whole context, extended turn by turn
    /// with [`Sequence::append_prompt`] (a chat).
    pub fn open(model: &Model, sampling: Sampling) -> Sequence {
        Sequence::with_cache(model, model.new_cache(model.config.n_positions), sampling)
    }

    /// Appends `new` ids, and makes the whole sequence so far the prompt (what penalties and
    /// [`Sequence::generated`] count from): a chat's next turn. Errors if an id is not in the
    /// vocabulary or the ids, all fed, would not fit the cache.
    pub fn append_prompt(&mut self, new: &[u32]) -> Result<()> {
        if let Some(&id) = new.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(Error::BadTokenId { id, vocab: self.vocab });
        }
        self.cache.check_room(self.ids.len() + new.len() - self.cache.len())?;
        self.ids.extend_from_slice(new);
        self.prompt_len = self.ids.len();
        Ok(())
    }

    /// Keeps only the first `len` ids (and K/V of at most those): back to an earlier point of a
    /// conversation. What follows is pending again, to be fed.
    pub fn truncate(&mut self, len: usize) {
        self.ids.truncate(len);
        self.prompt_len = self.prompt_len.min(len);
        self.cache.truncate(self.cache.len().min(len));
        (self.chosen, self.new, self.drafted) = (0, 0, 0);
    }

    /// Starts over with another prompt, keeping the cache's memory (its capacity stays) and the
    /// sampler's stream.
    pub fn restart(&mut self, prompt: &[u32]) -> Result<()> {
        self.cache.reset();
        self.cache.check_room(prompt.len())?;
        self.ids.clear();
        self.ids.extend_from_slice(prompt);
        self.prompt_len = prompt.len();
        (self.chosen, self.new, self.drafted) = (0, 0, 0);
        Ok(())
    }
}
