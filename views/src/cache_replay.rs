//! Prompts replayed through a prompt cache, in order, as a server would see them: each is looked
//! up in the cache the earlier ones filled, its cached prefix restored and the rest computed, then
//! stored. What `kvgpt cache diff` reports, offline: where reuse stopped for each prompt, how long
//! its prefill took with what was reused against from nothing, and whether both gave the same bits.

use kvgpt_core::error::Result;
use kvgpt_core::model::{Model, Scratch};
use kvgpt_core::prefix_cache::{PrefixCache, ReuseStop};
use kvgpt_core::sampler::Sampling;
use kvgpt_core::sequence::Sequence;
use std::time::{Duration, Instant};

/// One prompt of a replay.
pub struct Replayed {
    pub stop: ReuseStop,
    /// The prefill with the cached prefix restored: the positions from the stop on.
    pub prefill: Duration,
    /// The same prompt's prefill from an empty cache.
    pub cold_prefill: Duration,
    /// Both prefills gave the same next-token logits, bit for bit.
    pub same_bits: bool,
}

/// Feeds what `seq` has not computed yet (everything after a restored prefix), timed; its logits.
fn prefill(model: &Model, seq: &mut Sequence) -> Result<(Duration, Vec<f32>)> {
    let mut scratch = Scratch::new(&model.config, seq.pending());
    let t0 = Instant::now();
    seq.feed(model, &mut scratch)?;
    Ok((t0.elapsed(), seq.logits().to_vec()))
}

/// Replays `prompts` in order through one prompt cache (unbounded: nothing is evicted).
pub fn replay(model: &Model, prompts: &[Vec<u32>]) -> Result<Vec<Replayed>> {
    let mut cache = PrefixCache::new(usize::MAX);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let mut out = Vec::with_capacity(prompts.len());
    for ids in prompts {
        let (cold, cold_logits) = prefill(model, &mut Sequence::new(model, ids, 1, Sampling::GREEDY)?)?;
        let found = cache.lookup(ids);
        let mut seq = Sequence::new(model, ids, 1, Sampling::GREEDY)?;
        seq.map_prefix(&found.blocks, found.len)?;
        let (stop, hold) = (found.stop, found.hold);
        let (warm, logits) = prefill(model, &mut seq)?;
        cache.insert(ids, seq.cache());
        cache.release(hold);
        out.push(Replayed { stop, prefill: warm, cold_prefill: cold, same_bits: bits(&logits) == bits(&cold_logits) });
    }
    Ok(out)
}
