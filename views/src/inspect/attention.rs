//! `inspect attention`'s view: the selected layers' and heads' attention weights over a traced
//! run (the prompt, and any tokens decoded after it with the cache on), as the grids every
//! picture draws, JSON, and the one tensor `--export` writes.

use super::{check_indices, trace, TraceSpec};
use crate::render::attention_html::{self, Viewer};
use crate::render::{axis_label, svg, term, Grid, Tick};
use kvgpt_core::error::{Error, Result};
use kvgpt_core::tap::Point;
use kvgpt_core::units::count;
use kvgpt_core::Loaded;
use serde::Serialize;
use serde_json::Value;

/// What to show.
pub struct AttentionAsk {
    pub layers: Vec<usize>,
    pub heads: Vec<usize>,
    /// Greedy decode steps after the prompt, with the cache on.
    pub generate: usize,
    /// One query (0-based; negative counts from the end) over every selected head.
    pub query: Option<i64>,
}

/// The weights of a traced run.
pub struct AttentionView {
    pub title: String,
    pub ids: Vec<u32>,
    /// Each position's token, as the axes label it.
    pub labels: Vec<String>,
    pub prompt_len: usize,
    pub generated: usize,
    pub layers: Vec<usize>,
    pub heads: Vec<usize>,
    /// The one query shown over every head, if asked for.
    pub query: Option<usize>,
    /// Positions: `[S]`.
    s: usize,
    /// Per selected layer, every head's `[NH, S, S]`.
    per_layer: Vec<Vec<f32>>,
}

/// What both JSON views say of the sequence and the selection.
#[derive(Serialize)]
struct SequenceJson<'a> {
    ids: &'a [u32],
    tokens: &'a [String],
    prompt_len: usize,
    generated: usize,
    layers: &'a [usize],
    heads: &'a [usize],
}

/// The whole sequence as JSON: `attention[layer][head][query][key]`.
#[derive(Serialize)]
struct MatricesJson<'a> {
    #[serde(flatten)]
    seq: SequenceJson<'a>,
    attention: Vec<Vec<Vec<&'a [f32]>>>,
}

/// One query as JSON: `weights[layer][head][key]` over keys 0..=query.
#[derive(Serialize)]
struct QueryJson<'a> {
    #[serde(flatten)]
    seq: SequenceJson<'a>,
    query: usize,
    token: &'a str,
    weights: Vec<Vec<&'a [f32]>>,
}

/// `--query P` as a position of a sequence of `s`.
fn query_position(p: i64, s: usize) -> Result<usize> {
    let at = if p < 0 { s as i64 + p } else { p };
    if at < 0 || at >= s as i64 {
        return Err(Error::Invalid(format!(
            "--query {p} is out of range: the sequence has {s} positions (0..{}, or -1..-{s} from the end)",
            s - 1
        )));
    }
    Ok(at as usize)
}

impl AttentionView {
    /// Traces `ids` (and `ask.generate` decode steps) recording the attention weights.
    pub fn compute(loaded: &Loaded, ids: &[u32], ask: AttentionAsk) -> Result<AttentionView> {
        let cfg = &loaded.model.config;
        check_indices(&ask.layers, cfg.n_layer, "layer")?;
        check_indices(&ask.heads, cfg.n_head, "head")?;
        let spec = TraceSpec {
            generate: ask.generate,
            want: |p| matches!(p, Point::AttnProbs(_)),
            all_logits: false,
            prefill: None,
        };
        let tr = trace(&loaded.model, ids, &spec)?;
        let s = tr.len();
        let query = ask.query.map(|p| query_position(p, s)).transpose()?;
        let per_layer = ask
            .layers
            .iter()
            .map(|&l| {
                tr.attention(l)
                    .map(|(_, a)| a)
                    .ok_or_else(|| Error::Invalid("attention weights were not recorded".into()))
            })
            .collect::<Result<_>>()?;
        let title = format!(
            "attention of {} ({}{})",
            loaded.files.name,
            count(tr.prompt_len, "prompt token"),
            if ask.generate > 0 { format!(" + {} decoded with the KV cache", ask.generate) } else { String::new() }
        );
        let labels = tr.ids.iter().map(|&i| loaded.tokenizer.token_label(i)).collect();
        let (layers, heads, generated) = (ask.layers, ask.heads, ask.generate);
        Ok(AttentionView {
            title,
            ids: tr.ids,
            labels,
            prompt_len: tr.prompt_len,
            generated,
            layers,
            heads,
            query,
            s,
            per_layer,
        })
    }

    /// Layer `li`'s (of the selected) head `hi`'s `[S, S]`.
    fn matrix(&self, li: usize, hi: usize) -> &[f32] {
        let (s, h) = (self.s, self.heads[hi]);
        &self.per_layer[li][h * s * s..(h + 1) * s * s]
    }

    /// Every selected matrix, `[layer index][head index]`.
    fn matrices(&self) -> Vec<Vec<&[f32]>> {
        (0..self.per_layer.len()).map(|li| (0..self.heads.len()).map(|hi| self.matrix(li, hi)).collect()).collect()
    }

    /// The keys a picture can show: every position, or with a query those up to it.
    pub fn keys(&self) -> usize {
        self.query.map_or(self.s, |q| q + 1)
    }

    /// The grids to draw over the last `shown` keys: every layer × head, or with a query each
    /// layer's heads.
    pub fn grids(&self, shown: usize) -> Vec<Grid> {
        let start = self.keys() - shown.min(self.keys());
        let mut out = Vec::new();
        for li in 0..self.layers.len() {
            match self.query {
                None => out.extend((0..self.heads.len()).map(|hi| self.head_grid(li, hi, start))),
                Some(q) => out.push(self.query_grid(li, q, start)),
            }
        }
        out
    }

    fn tick(&self, i: usize) -> Tick {
        Tick { index: i, label: self.labels[i].clone() }
    }

    /// One head's queries × keys over positions `start..`.
    fn head_grid(&self, li: usize, hi: usize, start: usize) -> Grid {
        let (s, m) = (self.s, self.matrix(li, hi));
        let rows = start..s;
        let before = |q: usize| m[q * s..q * s + start].iter().sum::<f32>();
        Grid {
            title: format!("layer {} head {}", self.layers[li], self.heads[hi]),
            corner: "q\\k",
            rows: rows.clone().map(|i| self.tick(i)).collect(),
            cols: rows.clone().map(|i| self.tick(i)).collect(),
            cells: rows.clone().flat_map(|q| (start..s).map(move |k| (k <= q).then(|| m[q * s + k]))).collect(),
            before: (start > 0).then(|| rows.clone().map(before).collect()),
            // Where the window shows prompt rows and decoded ones, the line between them; a
            // window of decoded rows only says so in its note.
            decoded_from: (start <= self.prompt_len && self.prompt_len < s).then(|| self.prompt_len - start),
        }
    }

    /// Query `q` over keys `start..=q`, one row per head.
    fn query_grid(&self, li: usize, q: usize, start: usize) -> Grid {
        let s = self.s;
        let row = |hi: usize| &self.matrix(li, hi)[q * s..q * s + s];
        Grid {
            title: format!("layer {}: query {q} “{}” over every head", self.layers[li], axis_label(&self.labels[q])),
            corner: "head",
            rows: self.heads.iter().map(|&h| Tick { index: h, label: String::new() }).collect(),
            cols: (start..=q).map(|i| self.tick(i)).collect(),
            cells: (0..self.heads.len()).flat_map(|hi| row(hi)[start..=q].iter().map(|&x| Some(x))).collect(),
            before: (start > 0).then(|| (0..self.heads.len()).map(|hi| row(hi)[..start].iter().sum()).collect()),
            decoded_from: None,
        }
    }

    /// The heatmaps as one SVG picture, over the last `shown` keys.
    pub fn svg(&self, shown: usize) -> (String, usize) {
        let gs = self.grids(shown);
        let per_row = if self.query.is_some() { 2 } else { self.heads.len() };
        (svg::svg(&gs, per_row, &self.title), gs.len())
    }

    /// The self-contained HTML viewer.
    pub fn html(&self) -> String {
        attention_html::html(&Viewer {
            title: &self.title,
            tokens: &self.labels,
            prompt_len: self.prompt_len,
            layers: &self.layers,
            heads: &self.heads,
            weights: self.matrices(),
            query: self.query,
        })
    }

    /// `--json`: every matrix, or the query's weights.
    pub fn json(&self) -> Value {
        let seq = SequenceJson {
            ids: &self.ids,
            tokens: &self.labels,
            prompt_len: self.prompt_len,
            generated: self.generated,
            layers: &self.layers,
            heads: &self.heads,
        };
        let n = self.s;
        let v = match self.query {
            None => serde_json::to_value(MatricesJson {
                seq,
                attention: self.matrices().iter().map(|l| l.iter().map(|m| m.chunks(n).collect()).collect()).collect(),
            }),
            Some(q) => serde_json::to_value(QueryJson {
                seq,
                query: q,
                token: &self.labels[q],
                weights: self.matrices().iter().map(|l| l.iter().map(|m| &m[q * n..=q * n + q]).collect()).collect(),
            }),
        };
        v.expect("attention as JSON") // numbers and strings only
    }

    /// The terminal's heatmaps over the last `shown` keys, with the title, the legend and, when
    /// not every key fits, a note saying why (`why`: the flag or width that cut it).
    pub fn text(&self, shown: usize, colors: Option<term::Colors>, width: Option<usize>, why: &str) -> String {
        let keys = self.keys();
        let axes = if self.query.is_some() { "rows are heads, columns keys" } else { "rows are queries, columns keys" };
        let mut out = format!("{}\n", term::wrap(&format!("{}; {axes}; “·” is a space", self.title), width));
        let legend = term::legend(colors);
        out += &format!("{}\n", if colors.is_some() { legend } else { term::wrap(&legend, width) });
        if shown < keys {
            let decoded = if self.query.is_none() && keys - shown > self.prompt_len {
                "; every row shown was decoded with the KV cache on"
            } else {
                ""
            };
            let note = format!(
                "showing the last {shown} of {keys} {} ({why}){decoded}; the ‹ column is each row's weight on the \
                 keys before them; --last N or --width COLUMNS to choose",
                if self.query.is_some() { "keys" } else { "positions" }
            );
            out += &format!("{}\n", term::wrap(&note, width));
        }
        for g in self.grids(shown) {
            out += &format!("\n{}\n{}", g.title, term::heatmap(&g, colors));
        }
        out
    }

    /// Every selected head at a glance (bertviz's habit: one view of all heads), for a terminal
    /// that every heatmap would flood: for each head and layer, the key the last position
    /// weighs most, and that weight; then how to pick one.
    pub fn summary(&self, width: Option<usize>) -> String {
        let q = self.s - 1;
        let n = self.layers.len() * self.heads.len();
        let last = self.labels[q].replace(' ', "·");
        let mut out = term::wrap(
            &format!(
                "{}. All {n} heads at a glance: where the last position, “{last}” (position {q}), puts most of its \
                 weight — the key's position and its weight.",
                self.title
            ),
            width,
        );
        out += "\n\n        ";
        for &l in &self.layers {
            out += &format!("{:>9}", format!("layer {l}"));
        }
        for (hi, &h) in self.heads.iter().enumerate() {
            out += &format!("\nhead {h:<3}");
            for li in 0..self.layers.len() {
                let row = &self.matrix(li, hi)[q * self.s..(q + 1) * self.s];
                let (k, w) = row.iter().enumerate().fold((0, f32::MIN), |b, (k, &w)| if w > b.1 { (k, w) } else { b });
                out += &format!("{:>9}", format!("{k} {w:.2}"));
            }
        }
        let lines = n * (self.keys() + 3);
        let pick = format!(
            "Pick one to see its heatmap: --layer L --head H (--layer L alone for a layer's heads); --all shows \
             every heatmap (about {lines} lines here); --html FILE opens them all in a viewer."
        );
        out + "\n\n" + &term::wrap(&pick, width) + "\n"
    }

    /// `--export`: `attention` as `[layers, heads, S, S]`.
    pub fn tensor(&self) -> (Vec<usize>, Vec<f32>) {
        let n = self.s;
        (vec![self.layers.len(), self.heads.len(), n, n], self.matrices().concat().concat())
    }
}
