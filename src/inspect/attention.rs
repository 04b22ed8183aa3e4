//! `inspect attention`: per-head weights, or one query over every head, as a terminal heatmap
//! fitted to the terminal's width, JSON, an SVG picture and an HTML viewer — one set of grids
//! drawn in each format.

use super::session::{do_export, selected, write_text, Common, Select, Session};
use crate::common::print_json;
use anyhow::{bail, Context, Result};
use clap::Args;
use kvgpt_core::export::Named;
use kvgpt_core::Point;
use kvgpt_views::inspect::{trace, TraceSpec};
use kvgpt_views::render;
use kvgpt_views::render::html::Viewer;
use kvgpt_views::render::term::{self, Colors};
use kvgpt_views::render::{Grid, Tick};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;

/// When the terminal heatmap is coloured.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum ColorWhen {
    /// When standard output is a terminal and NO_COLOR is not set.
    Auto,
    Always,
    Never,
}

/// What `inspect attention` shows and where.
#[derive(Args, Clone)]
pub struct AttentionArgs {
    #[command(flatten)]
    pub sel: Select,
    /// Also run N greedy decode steps with the KV cache on; the matrix covers the prompt and them.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub generate: usize,
    /// One query over every selected head: position P (0-based; -1 is the last, -2 the one
    /// before). Rows become heads.
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub query: Option<i64>,
    /// Show only the last N positions (rows and key columns; with --query, key columns) in the
    /// heatmap and the SVG, with a ‹ column holding each row's weight on the keys before them.
    /// Without it a terminal heatmap shows as many as fit. --json, --html and --export keep all.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub last: Option<u32>,
    /// The width in columns the heatmap must fit (default: the terminal's, else $COLUMNS, else
    /// no limit).
    #[arg(long, value_name = "COLUMNS", value_parser = clap::value_parser!(u32).range(20..))]
    pub width: Option<u32>,
    /// Colour the heatmap's cells on the scale the pictures use (white is 0, dark blue is 1).
    #[arg(long, value_enum, default_value_t = ColorWhen::Auto, value_name = "WHEN")]
    pub color: ColorWhen,
    /// Draw every selected layer × head (or, with --query, each layer) as labelled heatmaps
    /// into an SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// A self-contained HTML viewer (no network): layer and head pickers, lines from a token to
    /// what it attends to on hover, and the heatmap.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// `--query P` as a position of a sequence of `s`.
fn query_position(p: i64, s: usize) -> Result<usize> {
    let at = if p < 0 { s as i64 + p } else { p };
    if at < 0 || at >= s as i64 {
        bail!("--query {p} is out of range: the sequence has {s} positions (0..{}, or -1..-{s} from the end)", s - 1);
    }
    Ok(at as usize)
}

/// The selected layers' and heads' weights of a trace: `matrix(li, hi)` is `[S, S]`.
struct Weights {
    s: usize,
    heads: Vec<usize>,
    per_layer: Vec<Vec<f32>>,
}

impl Weights {
    fn matrix(&self, li: usize, hi: usize) -> &[f32] {
        let (s, h) = (self.s, self.heads[hi]);
        &self.per_layer[li][h * s * s..(h + 1) * s * s]
    }

    /// Every selected matrix, `[layer index][head index]`.
    fn matrices(&self) -> Vec<Vec<&[f32]>> {
        (0..self.per_layer.len()).map(|li| (0..self.heads.len()).map(|hi| self.matrix(li, hi)).collect()).collect()
    }
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

/// The grids to draw: every layer × head over positions `start..`, or with a query each layer's
/// heads over keys `start..=query`.
fn grids(
    w: &Weights,
    layers: &[usize],
    labels: &[String],
    prompt_len: usize,
    query: Option<usize>,
    start: usize,
) -> Vec<Grid> {
    let s = w.s;
    let tick = |i: usize| Tick { index: i, label: labels[i].clone() };
    let before = |row: &[f32]| row[..start].iter().sum::<f32>();
    let mut out = Vec::new();
    for (li, &l) in layers.iter().enumerate() {
        match query {
            None => {
                for (hi, &h) in w.heads.iter().enumerate() {
                    let m = w.matrix(li, hi);
                    let rows = start..s;
                    out.push(Grid {
                        title: format!("layer {l} head {h}"),
                        corner: "q\\k",
                        rows: rows.clone().map(tick).collect(),
                        cols: rows.clone().map(tick).collect(),
                        cells: rows
                            .clone()
                            .flat_map(|q| (start..s).map(move |k| (k <= q).then(|| m[q * s + k])))
                            .collect(),
                        before: (start > 0).then(|| rows.clone().map(|q| before(&m[q * s..q * s + s])).collect()),
                        // Where the window shows prompt rows and decoded ones, the line between
                        // them; a window of decoded rows only says so in its note.
                        decoded_from: (start <= prompt_len && prompt_len < s).then(|| prompt_len - start),
                    });
                }
            }
            Some(q) => {
                let row = |hi: usize| &w.matrix(li, hi)[q * s..q * s + s];
                out.push(Grid {
                    title: format!("layer {l}: query {q} “{}” over every head", render::axis_label(&labels[q])),
                    corner: "head",
                    rows: w.heads.iter().map(|&h| Tick { index: h, label: String::new() }).collect(),
                    cols: (start..=q).map(tick).collect(),
                    cells: (0..w.heads.len()).flat_map(|hi| row(hi)[start..=q].iter().map(|&x| Some(x))).collect(),
                    before: (start > 0).then(|| (0..w.heads.len()).map(|hi| before(row(hi))).collect()),
                    decoded_from: None,
                });
            }
        }
    }
    out
}

/// The terminal's width for the heatmap: --width, the terminal's, $COLUMNS, or no limit.
fn width_to_fit(a: &AttentionArgs) -> Option<usize> {
    if let Some(w) = a.width {
        return Some(w as usize);
    }
    if std::io::stdout().is_terminal() {
        if let Some((_, w)) = console::Term::stdout().size_checked() {
            return Some(w as usize);
        }
    }
    std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse().ok()).filter(|&w: &usize| w >= 20)
}

pub(super) fn attention(c: &Common, a: &AttentionArgs) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let layers = selected(a.sel.layer, cfg.n_layer, "layer")?;
    let heads = selected(a.sel.head, cfg.n_head, "head")?;
    let spec = TraceSpec {
        generate: a.generate,
        want: |p| matches!(p, Point::AttnProbs(_)),
        all_logits: false,
        prefill: None,
    };
    let tr = trace(m, &s.ids, &spec)?;
    let n = tr.len();
    let query = a.query.map(|p| query_position(p, n)).transpose()?;
    let per_layer: Vec<Vec<f32>> = layers
        .iter()
        .map(|&l| tr.attention(l).map(|(_, a)| a).context("attention weights were not recorded"))
        .collect::<Result<_>>()?;
    let w = Weights { s: n, heads: heads.clone(), per_layer };
    let labels = s.labels(&tr.ids);
    let title = format!(
        "attention of {} ({} prompt token{}{})",
        s.loaded.files.name,
        tr.prompt_len,
        if tr.prompt_len == 1 { "" } else { "s" },
        if a.generate > 0 { format!(" + {} decoded with the KV cache", a.generate) } else { String::new() }
    );
    // The positions a heatmap shows: the last `shown` of the keys it could show.
    let keys = query.map_or(n, |q| q + 1);
    // Row labels are tokens (the window's own), or for one query heads, unlabelled.
    let mut widest = vec![0usize; keys + 1]; // widest[n]: of the last n positions' labels
    if query.is_none() {
        for n in 1..=keys {
            widest[n] = widest[n - 1].max(term::row_label_width(&labels[keys - n]));
        }
    }
    let width = width_to_fit(a);
    let fit = width.map(|w| term::window_that_fits(w, keys, keys - 1, |n| widest[n]));
    let picture_shown = a.last.map_or(keys, |l| (l as usize).min(keys));
    let text_shown = a.last.map(|l| (l as usize).min(keys)).or(fit).unwrap_or(keys).min(keys);

    if let Some(p) = &a.svg {
        let gs = grids(&w, &layers, &labels, tr.prompt_len, query, keys - picture_shown);
        let per_row = if query.is_some() { 2 } else { heads.len() };
        write_text(p, &render::svg::svg(&gs, per_row, &title))?;
        errln!("[kvgpt] wrote {} ({})", p.display(), kvgpt_core::units::count(gs.len(), "heatmap"));
    }
    if let Some(p) = &a.html {
        let page = render::html::html(&Viewer {
            title: &title,
            tokens: &labels,
            prompt_len: tr.prompt_len,
            layers: &layers,
            heads: &heads,
            weights: w.matrices(),
            query,
        });
        write_text(p, &page)?;
        let (l, h) = (kvgpt_core::units::count(layers.len(), "layer"), kvgpt_core::units::count(heads.len(), "head"));
        errln!("[kvgpt] wrote {} (a viewer of {l} × {h})", p.display());
    }
    if c.io.json {
        let seq = SequenceJson {
            ids: &tr.ids,
            tokens: &labels,
            prompt_len: tr.prompt_len,
            generated: a.generate,
            layers: &layers,
            heads: &heads,
        };
        let v = match query {
            None => serde_json::to_value(MatricesJson {
                seq,
                attention: w.matrices().iter().map(|l| l.iter().map(|m| m.chunks(n).collect()).collect()).collect(),
            })?,
            Some(q) => serde_json::to_value(QueryJson {
                seq,
                query: q,
                token: &labels[q],
                weights: w.matrices().iter().map(|l| l.iter().map(|m| &m[q * n..=q * n + q]).collect()).collect(),
            })?,
        };
        print_json(&v)?;
    } else if a.svg.is_none() && a.html.is_none() {
        // With a picture asked for, the picture is the answer: the terminal gets its path only.
        let colors = match a.color {
            ColorWhen::Always => Some(Colors::detect()),
            ColorWhen::Never => None,
            ColorWhen::Auto => (std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()))
            .then(Colors::detect),
        };
        let axes = if query.is_some() { "rows are heads, columns keys" } else { "rows are queries, columns keys" };
        outln!("{}", term::wrap(&format!("{title}; {axes}; “·” is a space"), width));
        match colors {
            Some(_) => outln!("{}", term::legend(colors)),
            None => outln!("{}", term::wrap(&term::legend(None), width)),
        }
        if text_shown < keys {
            let why = match (a.last, a.width) {
                (Some(l), _) => format!("--last {l}"),
                (None, Some(w)) => format!("to fit --width {w}"),
                (None, None) => "to fit the terminal's width".to_string(),
            };
            let start = keys - text_shown;
            let decoded = if query.is_none() && start > tr.prompt_len {
                "; every row shown was decoded with the KV cache on"
            } else {
                ""
            };
            let note = format!(
                "showing the last {text_shown} of {keys} {} ({why}){decoded}; the ‹ column is each row's weight on \
                 the keys before them; --last N or --width COLUMNS to choose",
                if query.is_some() { "keys" } else { "positions" }
            );
            outln!("{}", term::wrap(&note, width));
        }
        for g in grids(&w, &layers, &labels, tr.prompt_len, query, keys - text_shown) {
            outln!("\n{}", g.title);
            out!("{}", term::heatmap(&g, colors));
        }
    }
    if c.export.is_none() {
        return Ok(());
    }
    let data: Vec<f32> = w.matrices().concat().concat();
    do_export(c, &[Named { name: "attention".into(), shape: vec![layers.len(), heads.len(), n, n], data: &data }])
}
