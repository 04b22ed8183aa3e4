//! `inspect cache`: the KV cache per layer, and what each decode step reads and computes.

use super::session::{do_export, Common, Session};
use crate::common::print_json;
use anyhow::Result;
use kvgpt::export::Named;
use kvgpt::inspect::{trace, TraceSpec};
use kvgpt::KvCache;
use kvgpt::KvPart;
use serde::Serialize;

pub(super) fn cache(c: &Common, generate: usize) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let (nh, hs, np) = (cfg.n_head, cfg.head_dim(), cfg.n_positions);
    let spec = TraceSpec { generate, want: |_| false, all_logits: false };
    let tr = trace(m, &s.ids, &spec)?;
    let t = tr.prompt_len;
    // The cache as it was after the prompt (the trace's cache, cut back to the prompt) and at
    // the end; it reports its own shape and bytes.
    let mut at_prompt = tr.cache.clone();
    at_prompt.truncate(t);
    let fill = |cache: &KvCache| Fill {
        len: cache.len(),
        fill: cache.len() as f64 / np as f64,
        layers: (0..cache.n_layer())
            .map(|l| LayerFill {
                layer: l,
                k_shape: cache.shape(),
                v_shape: cache.shape(),
                dtype: "f32",
                bytes_used: cache.layer_bytes_used(),
                bytes_allocated: cache.layer_bytes_allocated(),
            })
            .collect(),
    };
    let view = CacheView {
        n_positions: np,
        n_layer: cfg.n_layer,
        n_head: nh,
        head_dim: hs,
        dtype: "f32",
        prompt_tokens: t,
        after_prefill: fill(&at_prompt),
        steps: (0..generate)
            .map(|i| {
                let pos = t + i;
                let id = tr.ids[pos];
                Step {
                    step: i + 1,
                    token_id: id,
                    token: s.label(id),
                    position: pos,
                    read_from_cache: [0, pos],
                    computed: [pos, pos + 1],
                    cache_len_after: pos + 1,
                }
            })
            .collect(),
        final_: fill(&tr.cache),
        total_bytes_allocated: tr.cache.bytes(),
    };
    if c.io.json {
        print_json(&serde_json::to_value(&view)?)?;
    } else {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        outln!(
            "KV cache: {} layers × (K, V), each [n_head={nh}, positions, head_dim={hs}] f32, preallocated to {np} positions ({:.2} MiB)",
            view.n_layer,
            mib(view.total_bytes_allocated)
        );
        outln!("after the prompt ({t} tokens, computed together in one prefill call):");
        for l in &view.after_prefill.layers {
            let [a, b, c] = l.k_shape;
            outln!(
                "  layer {}: K [{a}, {b}, {c}]  V [{a}, {b}, {c}]  {:.3} MiB used of {:.3} MiB, fill {}/{np}",
                l.layer,
                mib(l.bytes_used),
                mib(l.bytes_allocated),
                view.after_prefill.len
            );
        }
        for st in &view.steps {
            let pos = st.position;
            outln!(
                "decode step {}: token {} {:?} at position {pos}: K,V of the {pos} cached positions 0-{} read, \
                 q,k,v of position {pos} computed and its K,V written at {pos}; cache length now {}",
                st.step,
                st.token_id,
                st.token,
                pos.saturating_sub(1),
                st.cache_len_after
            );
        }
        if generate > 0 {
            let len = view.final_.len;
            outln!("final: every layer K [{nh}, {len}, {hs}] V [{nh}, {len}, {hs}], fill {len}/{np}");
        }
    }
    let len = tr.cache.len();
    let mut k = Vec::with_capacity(cfg.n_layer * nh * len * hs);
    let mut v = Vec::with_capacity(k.capacity());
    for l in 0..cfg.n_layer {
        k.extend(tr.cache.gather(l, KvPart::K));
        v.extend(tr.cache.gather(l, KvPart::V));
    }
    let shape = vec![cfg.n_layer, nh, len, hs];
    do_export(
        c,
        &[Named { name: "k".into(), shape: shape.clone(), data: &k }, Named { name: "v".into(), shape, data: &v }],
    )
}

/// What `inspect cache` shows, as text or JSON.
#[derive(Serialize)]
pub(super) struct CacheView {
    n_positions: usize,
    n_layer: usize,
    n_head: usize,
    head_dim: usize,
    dtype: &'static str,
    prompt_tokens: usize,
    after_prefill: Fill,
    steps: Vec<Step>,
    #[serde(rename = "final")]
    final_: Fill,
    total_bytes_allocated: usize,
}

#[derive(Serialize)]
pub(super) struct Fill {
    len: usize,
    fill: f64,
    layers: Vec<LayerFill>,
}

#[derive(Serialize)]
pub(super) struct LayerFill {
    layer: usize,
    k_shape: [usize; 3],
    v_shape: [usize; 3],
    dtype: &'static str,
    bytes_used: usize,
    bytes_allocated: usize,
}

/// One decode step: what it read from the cache and what it computed.
#[derive(Serialize)]
pub(super) struct Step {
    step: usize,
    token_id: u32,
    token: String,
    position: usize,
    read_from_cache: [usize; 2],
    computed: [usize; 2],
    cache_len_after: usize,
}
