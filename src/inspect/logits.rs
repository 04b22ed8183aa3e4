//! `inspect logits`: next-token distributions, the prompt's actual next token, the logit lens.

use super::session::{do_export, Common, Session};
use crate::common::print_json;
use anyhow::{bail, Context, Result};
use kvgpt_core::export::Named;
use kvgpt_core::logprobs::top_k;
use kvgpt_core::Point;
use kvgpt_views::inspect::{trace, TraceSpec};
use kvgpt_views::render;
use serde::Serialize;
use serde_json::{json, Value};

/// One candidate next token.
#[derive(Serialize)]
pub(super) struct Candidate {
    id: u32,
    token: String,
    logit: f32,
    prob: f64,
}

/// A next-token distribution: its top candidates and entropy.
#[derive(Serialize)]
pub(super) struct Distribution {
    top: Vec<Candidate>,
    entropy: f64,
}

/// How the model rated the token that actually comes next in the prompt.
#[derive(Serialize)]
pub(super) struct Actual {
    id: u32,
    token: String,
    rank: usize,
    prob: f64,
    surprisal: f64,
}

/// One layer of the logit lens.
#[derive(Serialize)]
pub(super) struct LensRow {
    /// "embed", or the block's index.
    layer: Value,
    #[serde(flatten)]
    dist: Distribution,
}

/// What `inspect logits` shows of one position.
#[derive(Serialize)]
pub(super) struct LogitsView {
    position: usize,
    token: String,
    #[serde(flatten)]
    dist: Distribution,
    /// The prompt's next token (none after the last position).
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<Actual>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lens: Option<Vec<LensRow>>,
}

pub(super) fn distribution(s: &Session, row: &[f32], k: usize) -> Distribution {
    let (top, entropy) = top_k(row, k);
    let top = top.iter().map(|c| Candidate { id: c.id, token: s.label(c.id), logit: c.logit, prob: c.prob }).collect();
    Distribution { top, entropy }
}

pub(super) fn print_top(top: &[Candidate]) -> Result<()> {
    outln!("  {:>4} {:>6}  {:<18} {:>10} {:>9}", "rank", "id", "token", "logit", "prob");
    for (r, t) in top.iter().enumerate() {
        outln!("  {:>4} {:>6}  {:<18} {:>10.4} {:>9.5}", r + 1, t.id, format!("{:?}", t.token), t.logit, t.prob);
    }
    Ok(())
}

pub(super) fn logits(c: &Common, k: usize, position: Option<usize>, all: bool, lens: bool) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let (t, v, ch) = (s.ids.len(), cfg.vocab_size, cfg.n_embd);
    if let Some(p) = position {
        if p >= t {
            bail!("--position {p} is out of range: the prompt has {t} tokens (positions 0..{})", t - 1);
        }
    }
    let spec = TraceSpec {
        generate: 0,
        want: if lens { |p| matches!(p, Point::Embed | Point::Block(_)) } else { |_| false },
        all_logits: true,
        prefill: None,
    };
    let tr = trace(m, &s.ids, &spec)?;
    let positions: Vec<usize> = if all { (0..t).collect() } else { vec![position.unwrap_or(t - 1)] };
    // The logit lens: the residual stream after the embeddings and after each block, through ln_f
    // and the vocabulary projection. After the last block this is exactly the model's logits.
    let mut hidden = Vec::new();
    if lens {
        hidden.extend(tr.rows(Point::Embed).context("no embeddings recorded")?.1);
        for l in 0..cfg.n_layer {
            hidden.extend(tr.rows(Point::Block(l)).context("no block output recorded")?.1);
        }
    }
    let views: Vec<LogitsView> = positions
        .iter()
        .map(|&p| {
            let row = &tr.logits[p * v..(p + 1) * v];
            let next = s.ids.get(p + 1).map(|&id| {
                let sc = kvgpt_views::score::token_score(row, id, p + 1, p + 1);
                Actual { id, token: s.label(id), rank: sc.rank, prob: sc.prob, surprisal: sc.surprisal }
            });
            let lens = lens.then(|| {
                let rows: Vec<f32> =
                    (0..=cfg.n_layer).flat_map(|l| hidden[(l * t + p) * ch..][..ch].iter().copied()).collect();
                let lens_logits = m.logits_of_hidden(&rows);
                (0..=cfg.n_layer)
                    .map(|l| LensRow {
                        layer: if l == 0 { json!("embed") } else { json!(l - 1) },
                        dist: distribution(&s, &lens_logits[l * v..(l + 1) * v], k),
                    })
                    .collect()
            });
            LogitsView { position: p, token: s.label(s.ids[p]), dist: distribution(&s, row, k), next, lens }
        })
        .collect();
    if c.io.json {
        let v = if all { serde_json::to_value(&views)? } else { serde_json::to_value(&views[0])? };
        print_json(&v)?;
    } else {
        for view in &views {
            outln!(
                "position {} ({:?}): next-token distribution, entropy {:.4} nats",
                view.position,
                view.token,
                view.dist.entropy
            );
            print_top(&view.dist.top)?;
            if let Some(n) = &view.next {
                outln!(
                    "  the prompt's next token {:?} (id {}): rank {}, prob {}, surprisal {:.3} nats",
                    n.token,
                    n.id,
                    n.rank,
                    render::prob(n.prob),
                    n.surprisal
                );
            }
            if let Some(lens) = &view.lens {
                outln!("  logit lens (ln_f + vocabulary projection of the residual stream after each layer):");
                for e in lens {
                    let tops: Vec<String> = e.dist.top.iter().map(|t| format!("{:?} {:.3}", t.token, t.prob)).collect();
                    let name = match e.layer.as_str() {
                        Some(s) => s.to_string(),
                        None => format!("layer {}", e.layer),
                    };
                    outln!("    {name:<9} H={:.3}  {}", e.dist.entropy, tops.join(", "));
                }
            }
            outln!("");
        }
    }
    let mut tensors = vec![Named { name: "logits".into(), shape: vec![t, v], data: &tr.logits }];
    if lens {
        tensors.push(Named { name: "hidden".into(), shape: vec![cfg.n_layer + 1, t, ch], data: &hidden });
    }
    do_export(c, &tensors)
}
