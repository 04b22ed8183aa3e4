//! The cache view's numbers, step by step: what each forward call of a traced run wrote into the
//! cache, what its last query read, the work it did against the same step without the cache, and
//! whether the step recomputed without the cache gives the same bits (it must: kvgpt's promise).

use super::Trace;
use kvgpt_core::error::Result;
use kvgpt_core::kv_cache::KvCache;
use kvgpt_core::model::{Model, Scratch};
use kvgpt_core::tap::{NoTap, Point};
use kvgpt_core::work::Work;

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
    /// The chosen layer's and head's scores before the softmax, `[t, p + t]`, −∞ where masked.
    pub scores: Vec<f32>,
    /// Whether the step run again without the cache gave bit-identical K/V at every position and
    /// layer, and logits; None for the prefill, which is that computation already.
    pub same_bits: Option<bool>,
}

/// The points a trace must record for [`cache_steps`].
pub fn wants(p: Point) -> bool {
    matches!(p, Point::AttnProbs(_) | Point::AttnScores(_) | Point::Logits)
}

/// Every call of `tr` (recorded with [`wants`]; its recordings are moved out, not copied) as a
/// [`CacheStep`] with the scores of `layer`'s head `head`; runs each decode step again without
/// the cache to compare.
pub fn cache_steps(model: &Model, tr: &mut Trace, layer: usize, head: usize) -> Result<Vec<CacheStep>> {
    let cfg = &model.config;
    let (nh, v) = (cfg.n_head, cfg.vocab_size);
    let mut out = Vec::new();
    let mut p = 0;
    let missing = |what: &str| kvgpt_core::Error::Invalid(format!("the trace did not record {what}"));
    for mut call in std::mem::take(&mut tr.recorder.calls) {
        let mut take = |point: Point, what: &str| call.remove(&point).ok_or_else(|| missing(what));
        let sc = take(Point::AttnScores(layer), "scores")?;
        let t = sc.shape[1];
        let n = p + t;
        let scores = sc.data[head * t * n..(head + 1) * t * n].to_vec();
        let weights = (0..cfg.n_layer)
            .map(|l| {
                let r = take(Point::AttnProbs(l), "attention weights")?;
                Ok((0..nh).flat_map(|h| r.data[(h * t + t - 1) * n..(h * t + t) * n].iter().copied()).collect())
            })
            .collect::<Result<_>>()?;
        let logits = take(Point::Logits, "logits")?.data;
        let same_bits = match p {
            0 => None,
            _ => Some(recomputed_matches(model, &tr.ids[..n], &tr.cache, &logits[logits.len() - v..])?),
        };
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
    let mut fresh = model.new_cache(n);
    let mut got = vec![0.0; logits.len()];
    model.forward(ids, &mut fresh, &mut Scratch::new(&model.config, n), &mut NoTap, &mut got)?;
    let same_logits = got.iter().zip(logits).all(|(a, b)| a.to_bits() == b.to_bits());
    Ok(cache.same_bits(&fresh, n) && same_logits)
}
