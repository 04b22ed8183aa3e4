//! Speculative decoding round by round, for the learner's view (`kvgpt inspect draft`): what the
//! draft proposed, what the model kept, its own token, and the cache before the step, after the
//! forward over the drafts and after the rollback.

use kvgpt_core::error::Result;
use kvgpt_core::logprobs::Distribution;
use kvgpt_core::model::{Model, Scratch};
use kvgpt_core::sequence::Sequence;
use serde::Serialize;

/// One verify step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Round {
    /// Positions in the model's cache before the step (every accepted token but the last, which
    /// this step feeds).
    pub cache_before: usize,
    /// The tokens the draft proposed (none: a plain decode step).
    pub drafted: Vec<u32>,
    /// How many of them the model accepted (a prefix of `drafted`).
    pub accepted: usize,
    /// The model's own token after them: its correction at the first disagreement, or one more
    /// after the last draft.
    pub token: u32,
    /// Positions after the forward over the last token and the drafts, before the rollback:
    /// `cache_before + 1 + drafted.len()`.
    pub cache_fed: usize,
    /// After the rollback, the rejected drafts' K/V forgotten: `cache_before + 1 + accepted`.
    pub cache_after: usize,
    /// The model's probability (softmax of its logits at the row where it chose `token`) of its
    /// token, and of the draft it rejected there.
    pub p_token: f64,
    pub p_rejected: Option<f64>,
}

/// Decodes `seq` (which speculates) to `max_new` tokens, recording every round after the first
/// token (which the prompt's forward chooses).
pub fn rounds(model: &Model, seq: &mut Sequence, max_new: usize) -> Result<Vec<Round>> {
    let drafts = seq.speculation().map_or(0, |s| s.max_k);
    let mut scratch = Scratch::new(&model.config, seq.pending().max(1 + drafts));
    seq.feed(model, &mut scratch)?;
    seq.prefill_draft()?;
    seq.sample();
    let mut out = vec![];
    while seq.generated().len() < max_new {
        let cache_before = seq.cache().len();
        let d = seq.draft(1)?;
        let drafted = seq.ids()[seq.ids().len() - d..].to_vec();
        seq.feed(model, &mut scratch)?;
        let cache_fed = seq.cache().len();
        seq.sample();
        let accepted = seq.new_tokens().len() - 1;
        let token = seq.new_tokens()[accepted];
        let row = seq.new_logits(accepted);
        let dist = Distribution::of(row);
        let p = |id: u32| dist.logprob(row[id as usize]).exp();
        out.push(Round {
            cache_before,
            accepted,
            token,
            cache_fed,
            cache_after: seq.cache().len(),
            p_token: p(token),
            p_rejected: drafted.get(accepted).map(|&x| p(x)),
            drafted,
        });
    }
    Ok(out)
}
