//! Speculative decoding, exact (issue #18, first step: greedy, with the n-gram lookup draft).
//!
//! A draft proposes k tokens; the model feeds the last accepted token and the k drafted ones in
//! one forward (one read of the weights for k + 1 rows) and keeps the drafted tokens while each
//! equals its own argmax, then takes its own token at the first disagreement (or after the last
//! drafted one). The cache is rolled back to what was accepted. Every row of a multi-row forward
//! has the bits a one-row decode of the same token at the same position has (no row's arithmetic
//! reads another's), so the ids and logits are those of decoding alone, bit for bit.

use crate::error::Result;
use crate::model::{Model, Scratch};
use crate::sampler::argmax;
use crate::tap::NoTap;

/// Proposes up to `k` tokens to follow `ids`.
pub trait Draft {
    fn propose(&mut self, ids: &[u32], k: usize, out: &mut Vec<u32>);
}

/// Prompt lookup (n-gram) drafting: the tokens that followed the latest earlier occurrence of the
/// longest suffix of the sequence (at most `max_ngram` tokens) are proposed again.
pub struct Lookup {
    pub max_ngram: usize,
}

impl Draft for Lookup {
    fn propose(&mut self, ids: &[u32], k: usize, out: &mut Vec<u32>) {
        out.clear();
        let len = ids.len();
        for n in (1..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let tail = &ids[len - n..];
            if let Some(start) = (0..len - n).rev().find(|&i| &ids[i..i + n] == tail) {
                out.extend(ids[start + n..].iter().take(k));
                return;
            }
        }
    }
}

/// What drafting did over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Verify steps (forwards after the prompt's).
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
}

/// Greedy decoding of `max_new` tokens after `prompt`, drafting up to `k` tokens a step; calls
/// `on_token` with each token and the logits it was chosen from, as `generate` does.
pub fn generate_greedy(
    model: &Model,
    prompt: &[u32],
    max_new: usize,
    draft: &mut dyn Draft,
    k: usize,
    on_token: &mut dyn FnMut(u32, &[f32]),
) -> Result<(Vec<u32>, DraftStats)> {
    let mut seq = crate::sequence::Sequence::new(model, prompt, max_new, crate::Sampling::GREEDY)?;
    let v = model.config.vocab_size;
    let mut scratch = Scratch::new(&model.config, prompt.len().max(k + 1));
    let mut stats = DraftStats::default();
    if max_new == 0 {
        return Ok((vec![], stats));
    }
    seq.feed(model, &mut scratch)?;
    on_token(seq.sample(), seq.logits());
    let mut ids: Vec<u32> = seq.ids().to_vec();
    let mut cache = seq.into_cache();
    let (mut drafted, mut logits) = (Vec::with_capacity(k), vec![0.0f32; (k + 1) * v]);
    while ids.len() - prompt.len() < max_new {
        // Room for the drafted tokens: never past max_new, and the last token is never fed.
        let room = max_new - (ids.len() - prompt.len()) - 1;
        draft.propose(&ids, k.min(room), &mut drafted);
        let base = cache.len(); // ids[base] is the last token, not yet fed
        let fed = drafted.len() + 1;
        ids.extend_from_slice(&drafted);
        let rows = &mut logits[..fed * v];
        model.forward(&ids[base..], &mut cache, &mut scratch, &mut NoTap, rows)?;
        let mut m = 0;
        while m < drafted.len() && argmax(&rows[m * v..(m + 1) * v]) == drafted[m] {
            on_token(drafted[m], &rows[m * v..(m + 1) * v]);
            m += 1;
        }
        let own = argmax(&rows[m * v..(m + 1) * v]);
        on_token(own, &rows[m * v..(m + 1) * v]);
        // Keep the K/V of the last token and the accepted drafts; forget the rest.
        ids.truncate(base + 1 + m);
        ids.push(own);
        cache.truncate(base + 1 + m);
        stats.steps += 1;
        stats.drafted += drafted.len();
        stats.accepted += m;
    }
    debug_assert_eq!(cache.len() + 1, ids.len());
    Ok((ids[prompt.len()..].to_vec(), stats))
}
