//! The cache view's numbers, step by step: what each forward call of a traced run wrote into the
//! cache, what its last query read, the work it did against the same step without the cache, and
//! whether the step recomputed without the cache gives the same bits (it must: kvgpt's promise).

use super::Trace;
use crate::error::Result;
use crate::kv_cache::{KvCache, KvPart};
use crate::model::{Model, Scratch, Work};
use crate::tap::{NoTap, Point};

/// One forward call of a trace: the prefill (step 0) or a decode step.
pub struct CacheStep {
    /// Positions cached before the call; it wrote K/V at `p..p + t`.
    pub p: usize,
    pub t: usize,
    /// The work of the call, and of the same step without the cache (positions `0..p + t` run
    /// again from an empty cache).
    pub cached: Work,
    pub uncached: Work,
    /// `weights[layer]`: `[NH, p + t]`, the call's last query over every key in the cache.
    pub weights: Vec<Vec<f32>>,
    /// `scores[layer]`: `[NH, t, p + t]`, before the softmax, −∞ where masked.
    pub scores: Vec<Vec<f32>>,
    /// Whether the uncached run gave bit-identical K/V at every position and layer, and logits.
    pub same_bits: bool,
}

/// The points a trace must record for [`cache_steps`].
pub fn wants(p: Point) -> bool {
    matches!(p, Point::AttnProbs(_) | Point::AttnScores(_) | Point::Logits)
}

/// Every call of `tr` (recorded with [`wants`]) as a [`CacheStep`]; runs each step again without
/// the cache to compare.
pub fn cache_steps(model: &Model, tr: &Trace) -> Result<Vec<CacheStep>> {
    let cfg = &model.config;
    let (nh, v) = (cfg.n_head, cfg.vocab_size);
    let mut out = Vec::new();
    let mut p = 0;
    let missing = |what: &str| crate::Error::Invalid(format!("the trace did not record {what}"));
    for call in &tr.recorder.calls {
        let scores: Vec<Vec<f32>> = (0..cfg.n_layer)
            .map(|l| call.get(&Point::AttnScores(l)).map(|r| r.data.clone()).ok_or_else(|| missing("scores")))
            .collect::<Result<_>>()?;
        let t = call.get(&Point::AttnScores(0)).map_or(0, |r| r.shape[1]);
        let n = p + t;
        let weights = (0..cfg.n_layer)
            .map(|l| {
                let r = call.get(&Point::AttnProbs(l)).ok_or_else(|| missing("attention weights"))?;
                Ok((0..nh).flat_map(|h| r.data[(h * t + t - 1) * n..(h * t + t) * n].iter().copied()).collect())
            })
            .collect::<Result<_>>()?;
        let logits = call.get(&Point::Logits).ok_or_else(|| missing("logits"))?;
        let same_bits = recomputed_matches(model, &tr.ids[..n], &tr.cache, &logits.data[logits.data.len() - v..])?;
        out.push(CacheStep {
            p,
            t,
            cached: model.work(p, t, 1),
            uncached: model.work(0, n, 1),
            weights,
            scores,
            same_bits,
        });
        p = n;
    }
    Ok(out)
}

/// Runs `ids` from an empty cache in one call and compares its K/V with the first `ids.len()`
/// positions of `cache`, and its last logits with `logits`, bit for bit.
fn recomputed_matches(model: &Model, ids: &[u32], cache: &KvCache, logits: &[f32]) -> Result<bool> {
    let n = ids.len();
    let mut fresh = KvCache::with_capacity(&model.config, n);
    let mut got = vec![0.0; logits.len()];
    model.forward(ids, &mut fresh, &mut Scratch::new(&model.config, n), &mut NoTap, &mut got)?;
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let mut cut = cache.clone();
    cut.truncate(n);
    let kv_same = (0..model.config.n_layer)
        .all(|l| [KvPart::K, KvPart::V].iter().all(|&w| bits(&fresh.gather(l, w)) == bits(&cut.gather(l, w))));
    Ok(kv_same && bits(&got) == bits(logits))
}
