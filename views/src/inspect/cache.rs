//! `inspect cache`'s view: a traced run's KV cache step by step (the prefill, then each decode
//! step) as the terminal, SVG and HTML draw it ([`CacheView`]), and every layer's K and V for
//! `--export`.

use super::{cache_step_points, cache_steps, check_indices, trace, CacheStep, TraceSpec};
use crate::render::cache::{BlockEntry, CacheView, Compare, Ratio, StepView, StoredMark};
use kvgpt_core::error::Result;
use kvgpt_core::store::{Held, Store};
use kvgpt_core::work::Work;
use kvgpt_core::{KvCache, KvPart, Loaded};

/// What to show.
pub struct CacheAsk {
    /// Greedy decode steps after the prompt.
    pub generate: usize,
    /// Prefill only the first N prompt tokens, then feed the rest one at a time.
    pub prefill: Option<usize>,
    /// The layer and head whose cache, scores and K/V values are shown.
    pub layer: usize,
    pub head: usize,
}

/// Every layer's K and V after the run, each `[L, NH, S, HS]`.
pub struct KvTensors {
    pub shape: Vec<usize>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The view of `ids` (and `ask.generate` decode steps), and the cache it ends with; with a
/// `store`, each block marked with where it stands there (read only: nothing is written).
pub fn cache_view(
    loaded: &Loaded,
    ids: &[u32],
    ask: &CacheAsk,
    store: Option<&Store>,
) -> Result<(CacheView, KvTensors)> {
    let (m, cfg) = (&loaded.model, &loaded.model.config);
    check_indices(&[ask.layer], cfg.n_layer, "layer")?;
    check_indices(&[ask.head], cfg.n_head, "head")?;
    let spec = TraceSpec { generate: ask.generate, want: cache_step_points, all_logits: false, prefill: ask.prefill };
    let mut tr = trace(m, ids, &spec)?;
    let steps = cache_steps(m, &mut tr, ask.layer, ask.head)?;
    let steps: Vec<StepView> = steps.iter().enumerate().map(|(i, st)| step_view(i, st, tr.prompt_len)).collect();
    let view = CacheView {
        model: loaded.files.name.clone(),
        dtype: m.weights_dtype(),
        kv_dtype: tr.cache.shape().ty.name(),
        n_layer: cfg.n_layer,
        n_head: cfg.n_head,
        head_dim: cfg.head_dim(),
        n_positions: cfg.n_positions,
        tokens: tr.ids.iter().map(|&i| loaded.tokenizer.token_label(i)).collect(),
        ids: tr.ids.clone(),
        prompt_tokens: tr.prompt_len,
        prefill_tokens: tr.prefill_len,
        capacity: tr.cache.capacity(),
        bytes_per_position: KvCache::bytes_per_position_as(cfg, tr.cache.shape().ty),
        block_size: tr.cache.shape().positions,
        blocks: tr.cache.blocks().len(),
        block_table: block_table(&tr.cache, &steps, store.map(|s| s.compare(&tr.ids, &tr.cache))),
        positions_held: tr.cache.len(),
        bytes_allocated: tr.cache.bytes(),
        layer: ask.layer,
        head: ask.head,
        steps,
        k: head_rows(&tr.cache, ask.layer, ask.head, KvPart::K),
        v: head_rows(&tr.cache, ask.layer, ask.head, KvPart::V),
    };
    Ok((view, kv_tensors(&tr.cache)))
}

/// The cache's blocks in logical order, each with its physical block, the step that took it
/// (the first whose written positions reach into it) and where the store holds it.
fn block_table(cache: &KvCache, steps: &[StepView], held: Option<Vec<Held>>) -> Vec<BlockEntry> {
    let b = cache.shape().positions;
    let entry = |(j, block): (usize, &std::sync::Arc<kvgpt_core::kv_cache::Block>)| {
        let positions = [j * b, ((j + 1) * b).min(cache.len())];
        let step = steps.iter().position(|st| st.written[1] > positions[0]).unwrap_or(0);
        let stored = held.as_ref().and_then(|h| h.get(j)).map(|h| StoredMark {
            key: h.key.hex(),
            tier: h.tier,
            same_bits: h.same_bits,
        });
        BlockEntry { logical: j, physical: block.id(), positions, step, stored }
    };
    cache.blocks().iter().enumerate().map(entry).collect()
}

/// Step `i` of a run whose prompt is `prompt` tokens: the prefill, a prompt token fed alone (after
/// `--prefill N`), or the decode of a generated one.
fn step_view(i: usize, st: &CacheStep, prompt: usize) -> StepView {
    let n = st.p + st.t;
    StepView {
        step: i,
        kind: match i {
            0 => "prefill",
            _ if st.p < prompt => "prompt",
            _ => "decode",
        },
        cached_before: st.p,
        written: [st.p, n],
        work: compare(st.cached, st.uncached),
        recomputed_same_bits: st.same_bits,
        weights: st.weights.iter().map(|w| w.chunks(n).map(<[f32]>::to_vec).collect()).collect(),
        scores: st.scores.chunks(n).map(|row| row.iter().map(|&x| x.is_finite().then_some(x)).collect()).collect(),
    }
}

fn compare(cached: Work, uncached: Work) -> Compare {
    let r = |a: u64, b: u64| if a == 0 { 0.0 } else { b as f64 / a as f64 };
    Compare {
        ratio: Ratio {
            macs: r(cached.macs, uncached.macs),
            weight_bytes: r(cached.weight_bytes, uncached.weight_bytes),
            kv_read_bytes: r(cached.kv_read_bytes, uncached.kv_read_bytes),
        },
        with_cache: cached,
        without_cache: uncached,
    }
}

/// One head's `[NH, len, HS]` gathered part as rows.
fn head_rows(cache: &KvCache, l: usize, h: usize, part: KvPart) -> Vec<Vec<f32>> {
    let [_, len, hs] = cache.filled_shape();
    cache.gather(l, part)[h * len * hs..(h + 1) * len * hs].chunks(hs).map(<[f32]>::to_vec).collect()
}

fn kv_tensors(cache: &KvCache) -> KvTensors {
    let [nh, len, hs] = cache.filled_shape();
    let layers = cache.n_layer();
    let mut k = Vec::with_capacity(layers * nh * len * hs);
    let mut v = Vec::with_capacity(k.capacity());
    for l in 0..layers {
        k.extend(cache.gather(l, KvPart::K));
        v.extend(cache.gather(l, KvPart::V));
    }
    KvTensors { shape: vec![layers, nh, len, hs], k, v }
}
