//! `inspect cache`: the KV cache step by step — the prefill, then each decode step — with what
//! each step wrote and read, its work against the same step without the cache, the scores
//! before the softmax and the K/V values of a chosen head; as text, JSON, SVG and an HTML viewer.

use super::session::{do_export, selected, write_text, Common, Session};
use crate::common::print_json;
use anyhow::{bail, Result};
use clap::Args;
use kvgpt_core::export::Named;
use kvgpt_core::work::Work;
use kvgpt_core::{KvCache, KvPart};
use kvgpt_views::inspect::{cache_step_points, cache_steps, trace, TraceSpec};
use kvgpt_views::render;
use kvgpt_views::render::cache::{CacheView, Compare, Ratio, StepView};
use kvgpt_views::render::cache_term::steps_text;
use std::path::PathBuf;

/// What `inspect cache` shows and where.
#[derive(Args, Clone)]
pub struct CacheArgs {
    /// Greedy decode steps to run after the prompt.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub generate: usize,
    /// Prefill only the first N prompt tokens, then feed the rest one at a time as decode steps
    /// (how a chat's next turn or a streamed prompt reaches the cache).
    #[arg(long, value_name = "N")]
    pub prefill: Option<usize>,
    /// The layer whose cache the terminal draws and whose K/V values are shown (default 0).
    #[arg(long)]
    pub layer: Option<usize>,
    /// The head whose scores and K/V values are shown (default 0).
    #[arg(long)]
    pub head: Option<usize>,
    /// Show only this step in the terminal (0 is the prefill).
    #[arg(long, value_name = "S")]
    pub step: Option<usize>,
    /// How many leading numbers of each K and V row the terminal shows.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub dims: usize,
    /// Draw the cache growing step by step (the chosen layer and head, with and without the
    /// cache side by side) into an SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// A self-contained HTML viewer (no network): step buttons and slider, layer and head
    /// pickers, the cache grid with this step's rows highlighted, the query's weights, the work
    /// with and without the cache, the scores and the K/V values.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
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
    let [_, len, hs] = cache.shape();
    cache.gather(l, part)[h * len * hs..(h + 1) * len * hs].chunks(hs).map(<[f32]>::to_vec).collect()
}

pub(super) fn cache(c: &Common, a: &CacheArgs) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let (nh, hs) = (cfg.n_head, cfg.head_dim());
    let layer = selected(a.layer, cfg.n_layer, "layer")?[0];
    let head = selected(a.head, nh, "head")?[0];
    let spec = TraceSpec { generate: a.generate, want: cache_step_points, all_logits: false, prefill: a.prefill };
    let mut tr = trace(m, &s.ids, &spec)?;
    let steps = cache_steps(m, &mut tr, layer, head)?;
    if let Some(st) = a.step.filter(|&st| st >= steps.len()) {
        match steps.len() {
            1 => bail!(
                "--step {st} is out of range: this run has only the prefill, step 0 (--generate N adds N decode steps)"
            ),
            n => bail!("--step {st} is out of range: this run has steps 0 (the prefill) to {}", n - 1),
        }
    }
    let view = CacheView {
        model: s.loaded.files.name.clone(),
        dtype: m.weights_dtype(),
        n_layer: cfg.n_layer,
        n_head: nh,
        head_dim: hs,
        n_positions: cfg.n_positions,
        tokens: s.labels(&tr.ids),
        ids: tr.ids.clone(),
        prompt_tokens: tr.prompt_len,
        prefill_tokens: tr.prefill_len,
        capacity: tr.cache.capacity(),
        bytes_per_position: KvCache::bytes_per_position(cfg),
        bytes_allocated: tr.cache.bytes(),
        layer,
        head,
        steps: steps
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let n = st.p + st.t;
                StepView {
                    step: i,
                    kind: if i == 0 { "prefill" } else { "decode" },
                    cached_before: st.p,
                    written: [st.p, n],
                    work: compare(st.cached, st.uncached),
                    recomputed_same_bits: st.same_bits,
                    weights: st.weights.iter().map(|w| w.chunks(n).map(<[f32]>::to_vec).collect()).collect(),
                    scores: st
                        .scores
                        .chunks(n)
                        .map(|row| row.iter().map(|&x| x.is_finite().then_some(x)).collect())
                        .collect(),
                }
            })
            .collect(),
        k: head_rows(&tr.cache, layer, head, KvPart::K),
        v: head_rows(&tr.cache, layer, head, KvPart::V),
    };
    if let Some(p) = &a.svg {
        write_text(p, &render::cache_svg::svg(&view))?;
        errln!("[kvgpt] wrote {} ({})", p.display(), kvgpt_core::units::count(view.steps.len(), "step"));
    }
    if let Some(p) = &a.html {
        write_text(p, &render::cache_html::html(&view)?)?;
        errln!("[kvgpt] wrote {} (a viewer of {})", p.display(), kvgpt_core::units::count(view.steps.len(), "step"));
    }
    if c.io.json {
        print_json(&serde_json::to_value(&view)?)?;
    } else if a.svg.is_none() && a.html.is_none() {
        out!("{}", steps_text(&view, a.step, a.dims));
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
