//! `inspect logits`: next-token distributions, the prompt's actual next token, the logit lens.

use super::{trace, TraceSpec};
use kvgpt_core::error::{Error, Result};
use kvgpt_core::logprobs::top_k;
use kvgpt_core::tap::Point;
use kvgpt_core::{Loaded, Tokenizer};
use serde::Serialize;
use serde_json::{json, Value};
use std::fmt::Write as _;

/// One candidate next token.
#[derive(Serialize)]
pub struct Candidate {
    id: u32,
    token: String,
    logit: f32,
    prob: f64,
}

/// A next-token distribution: its top candidates and entropy.
#[derive(Serialize)]
pub struct Distribution {
    top: Vec<Candidate>,
    entropy: f64,
}

/// How the model rated the token that actually comes next in the prompt.
#[derive(Serialize)]
pub struct Actual {
    id: u32,
    token: String,
    rank: usize,
    prob: f64,
    surprisal: f64,
}

/// One layer of the logit lens.
#[derive(Serialize)]
pub struct LensRow {
    /// "embed", or the block's index.
    layer: Value,
    #[serde(flatten)]
    dist: Distribution,
}

/// What `inspect logits` shows of one position.
#[derive(Serialize)]
pub struct LogitsView {
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

/// What to show.
pub struct LogitsAsk {
    /// Candidates per distribution.
    pub top_k: usize,
    /// The positions whose next-token distributions to show.
    pub positions: Vec<usize>,
    /// Add the logit lens.
    pub lens: bool,
}

/// The views of the positions asked for, and the tensors `--export` writes.
pub struct LogitsReport {
    pub views: Vec<LogitsView>,
    /// `[T, V]`: every position's logits.
    pub logits: Vec<f32>,
    /// With the lens, `[L + 1, T, C]`: the residual stream after the embeddings and each block.
    pub hidden: Option<Vec<f32>>,
}

fn distribution(tok: &Tokenizer, row: &[f32], k: usize) -> Distribution {
    let (top, entropy) = top_k(row, k);
    let top = top
        .iter()
        .map(|c| Candidate { id: c.id, token: tok.token_label(c.id), logit: c.logit, prob: c.prob })
        .collect();
    Distribution { top, entropy }
}

/// Runs `ids` once, recording every position's logits (and, with the lens, the residual stream).
pub fn logits(loaded: &Loaded, ids: &[u32], ask: &LogitsAsk) -> Result<LogitsReport> {
    let (m, cfg, t) = (&loaded.model, &loaded.model.config, ids.len());
    if let Some(p) = ask.positions.iter().find(|&&p| p >= t) {
        return Err(Error::Invalid(format!(
            "--position {p} is out of range: the prompt has {t} tokens (positions 0..{})",
            t.saturating_sub(1)
        )));
    }
    let spec = TraceSpec {
        generate: 0,
        want: if ask.lens { |p| matches!(p, Point::Embed | Point::Block(_)) } else { |_| false },
        all_logits: true,
        prefill: None,
    };
    let tr = trace(m, ids, &spec)?;
    // The logit lens: the residual stream after the embeddings and after each block, through ln_f
    // and the vocabulary projection. After the last block this is exactly the model's logits.
    let hidden = if ask.lens {
        let mut hidden = tr.rows(Point::Embed).ok_or_else(|| missing("the embeddings"))?.1;
        for l in 0..cfg.n_layer {
            hidden.extend(tr.rows(Point::Block(l)).ok_or_else(|| missing("a block's output"))?.1);
        }
        Some(hidden)
    } else {
        None
    };
    let views = ask.positions.iter().map(|&p| view(loaded, ids, &tr.logits, hidden.as_deref(), p, ask.top_k)).collect();
    Ok(LogitsReport { views, logits: tr.logits, hidden })
}

fn missing(what: &str) -> Error {
    Error::Invalid(format!("{what} were not recorded"))
}

/// Position `p`'s distribution, the prompt's actual next token, and the lens over `hidden`.
fn view(loaded: &Loaded, ids: &[u32], logits: &[f32], hidden: Option<&[f32]>, p: usize, k: usize) -> LogitsView {
    let (m, tok) = (&loaded.model, &loaded.tokenizer);
    let (t, v, ch, nl) = (ids.len(), m.config.vocab_size, m.config.n_embd, m.config.n_layer);
    let row = &logits[p * v..(p + 1) * v];
    let next = ids.get(p + 1).map(|&id| {
        let sc = crate::score::token_score(row, id, p + 1, p + 1);
        Actual { id, token: tok.token_label(id), rank: sc.rank, prob: sc.prob, surprisal: sc.surprisal }
    });
    let lens = hidden.map(|hidden| {
        let rows: Vec<f32> = (0..=nl).flat_map(|l| hidden[(l * t + p) * ch..][..ch].iter().copied()).collect();
        let lens_logits = m.logits_of_hidden(&rows);
        (0..=nl)
            .map(|l| LensRow {
                layer: if l == 0 { json!("embed") } else { json!(l - 1) },
                dist: distribution(tok, &lens_logits[l * v..(l + 1) * v], k),
            })
            .collect()
    });
    LogitsView { position: p, token: tok.token_label(ids[p]), dist: distribution(tok, row, k), next, lens }
}

/// A distribution's candidates as a table.
fn top_text(out: &mut String, top: &[Candidate]) {
    let _ = writeln!(out, "  {:>4} {:>6}  {:<18} {:>10} {:>9}", "rank", "id", "token", "logit", "prob");
    for (r, t) in top.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {:>4} {:>6}  {:<18} {:>10.4} {:>9.5}",
            r + 1,
            t.id,
            format!("{:?}", t.token),
            t.logit,
            t.prob
        );
    }
}

impl LogitsView {
    /// The position's distribution, its next token's rank and the lens, as the terminal shows them.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "position {} ({:?}): next-token distribution, entropy {:.4} nats",
            self.position, self.token, self.dist.entropy
        );
        top_text(&mut out, &self.dist.top);
        if let Some(n) = &self.next {
            let _ = writeln!(
                out,
                "  the prompt's next token {:?} (id {}): rank {}, prob {}, surprisal {:.3} nats",
                n.token,
                n.id,
                n.rank,
                crate::render::prob(n.prob),
                n.surprisal
            );
        }
        if let Some(lens) = &self.lens {
            let _ =
                writeln!(out, "  logit lens (ln_f + vocabulary projection of the residual stream after each layer):");
            for e in lens {
                let tops: Vec<String> = e.dist.top.iter().map(|t| format!("{:?} {:.3}", t.token, t.prob)).collect();
                let name = match e.layer.as_str() {
                    Some(s) => s.to_string(),
                    None => format!("layer {}", e.layer),
                };
                let _ = writeln!(out, "    {name:<9} H={:.3}  {}", e.dist.entropy, tops.join(", "));
            }
        }
        out
    }
}
