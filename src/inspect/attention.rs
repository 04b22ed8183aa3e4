//! `inspect attention`: per-head weights, or one query over every head, as a terminal heatmap
//! fitted to the terminal's width, JSON, an SVG picture and an HTML viewer — one set of grids
//! drawn in each format.

use super::session::{do_export, selected, write_text, Common, Select, Session};
use crate::common::print_json;
use anyhow::Result;
use clap::Args;
use kvgpt_core::export::Named;
use kvgpt_core::units::count;
use kvgpt_views::inspect::attention::{AttentionAsk, AttentionView};
use kvgpt_views::render::term::{self, Colors};
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

impl ColorWhen {
    /// The colours to paint with, if any: always, never, or on a terminal without NO_COLOR.
    pub fn colors(self) -> Option<Colors> {
        match self {
            ColorWhen::Always => Some(Colors::detect()),
            ColorWhen::Never => None,
            ColorWhen::Auto => (std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()))
            .then(Colors::detect),
        }
    }
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
    /// With no --layer or --head, print every heatmap even when there are more than 12 (else a
    /// summary of every head, and how to pick one).
    #[arg(long)]
    pub all: bool,
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
    let cfg = &s.loaded.model.config;
    let ask = AttentionAsk {
        layers: selected(a.sel.layer, cfg.n_layer, "layer")?,
        heads: selected(a.sel.head, cfg.n_head, "head")?,
        generate: a.generate,
        query: a.query,
    };
    let view = AttentionView::compute(&s.loaded, &s.ids, ask)?;
    let keys = view.keys();
    if let Some(p) = &a.svg {
        let (picture, n) = view.svg(a.last.map_or(keys, |l| l as usize));
        write_text(p, &picture)?;
        errln!("[kvgpt] wrote {} ({})", p.display(), count(n, "heatmap"));
    }
    if let Some(p) = &a.html {
        write_text(p, &view.html())?;
        let (l, h) = (count(view.layers.len(), "layer"), count(view.heads.len(), "head"));
        errln!("[kvgpt] wrote {} (a viewer of {l} × {h})", p.display());
    }
    if c.io.json {
        print_json(&view.json())?;
    } else if a.svg.is_none() && a.html.is_none() {
        // With a picture asked for, the picture is the answer: the terminal gets its path only.
        let unpicked = a.sel.layer.is_none() && a.sel.head.is_none() && a.query.is_none();
        if unpicked && !a.all && view.layers.len() * view.heads.len() > SUMMARY_PAST {
            out!("{}", view.summary(width_to_fit(a)));
        } else {
            print_text(&view, a)?;
        }
    }
    if c.export.is_none() {
        return Ok(());
    }
    let (shape, data) = view.tensor();
    do_export(c, &[Named { name: "attention".into(), shape, data: &data }])
}

/// The heatmaps on the terminal: as many keys as `--last` or the width lets fit.
fn print_text(view: &AttentionView, a: &AttentionArgs) -> Result<()> {
    let keys = view.keys();
    // Row labels are tokens (the window's own), or for one query heads, unlabelled.
    let mut widest = vec![0usize; keys + 1]; // widest[n]: of the last n positions' labels
    if view.query.is_none() {
        for n in 1..=keys {
            widest[n] = widest[n - 1].max(term::row_label_width(&view.labels[keys - n]));
        }
    }
    let width = width_to_fit(a);
    let fit = width.map(|w| term::window_that_fits(w, keys, keys - 1, |n| widest[n]));
    let shown = a.last.map(|l| l as usize).or(fit).unwrap_or(keys).min(keys);
    let why = match (a.last, a.width) {
        (Some(l), _) => format!("--last {l}"),
        (None, Some(w)) => format!("to fit --width {w}"),
        (None, None) => "to fit the terminal's width".to_string(),
    };
    out!("{}", view.text(shown, a.color.colors(), width, &why));
    Ok(())
}

/// Heatmaps past which, with no --layer or --head, the terminal gets the summary instead.
const SUMMARY_PAST: usize = 12;
