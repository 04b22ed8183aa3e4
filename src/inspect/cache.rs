//! `inspect cache`: the KV cache step by step — the prefill, then each decode step — with what
//! each step wrote and read, its work against the same step without the cache, the scores
//! before the softmax and the K/V values of a chosen head; as text, JSON, SVG and an HTML viewer.

use super::attention::ColorWhen;
use super::session::{do_export, selected, write_text, Common, Session};
use crate::common::print_json;
use crate::kv_disk::KvDiskArgs;
use anyhow::{bail, Result};
use clap::Args;
use kvgpt_core::export::Named;
use kvgpt_core::units::count;
use kvgpt_views::inspect::cache::{cache_view, CacheAsk, KvTensors};
use kvgpt_views::render;
use kvgpt_views::render::cache_term::steps_text;
use std::path::PathBuf;

/// What `inspect cache` shows and where.
#[derive(Args, Clone)]
pub struct CacheArgs {
    /// Greedy decode steps to run after the prompt (the cache at work: each reads what the steps
    /// before it wrote; 0 shows the prefill alone).
    #[arg(long, default_value_t = 3, value_name = "N")]
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
    /// Mark each block with where it stands in this --kv-disk directory (the one `serve` and
    /// `generate` keep): its content address, and whether the stored block is the bits this run
    /// computed. Read only: nothing is written.
    #[arg(long, value_name = "DIR")]
    pub kv_disk: Option<PathBuf>,
    /// Colour each query weight in the terminal's grid on the scale the pictures use (white is
    /// 0, dark blue is 1), as `inspect attention` does.
    #[arg(long, value_enum, default_value_t = ColorWhen::Auto, value_name = "WHEN")]
    pub color: ColorWhen,
}

pub(super) fn cache(c: &Common, a: &CacheArgs) -> Result<()> {
    let s = Session::open(c)?;
    let cfg = &s.loaded.model.config;
    let ask = CacheAsk {
        generate: a.generate,
        prefill: a.prefill,
        layer: selected(a.layer, cfg.n_layer, "layer")?[0],
        head: selected(a.head, cfg.n_head, "head")?[0],
    };
    if let Some(d) = a.kv_disk.as_ref().filter(|d| !d.is_dir()) {
        bail!(
            "--kv-disk {}: no such directory (give the one `serve --kv-disk` or `generate --kv-disk` keeps)",
            d.display()
        );
    }
    let store = KvDiskArgs { kv_disk: a.kv_disk.clone(), kv_disk_gb: f64::MAX }.open(&s.loaded.model)?;
    let (view, kv) = cache_view(&s.loaded, &s.ids, &ask, store.as_ref())?;
    let steps = view.steps.len();
    if let Some(st) = a.step.filter(|&st| st >= steps) {
        match steps {
            1 => bail!(
                "--step {st} is out of range: this run has only the prefill, step 0 (--generate N adds N decode steps)"
            ),
            n => bail!("--step {st} is out of range: this run has steps 0 (the prefill) to {}", n - 1),
        }
    }
    if let Some(p) = &a.svg {
        write_text(p, &render::cache_svg::svg(&view))?;
        errln!("[kvgpt] wrote {} ({})", p.display(), count(steps, "step"));
    }
    if let Some(p) = &a.html {
        write_text(p, &render::cache_html::html(&view)?)?;
        errln!("[kvgpt] wrote {} (a viewer of {})", p.display(), count(steps, "step"));
    }
    if c.io.json {
        print_json(&serde_json::to_value(&view)?)?;
    } else if a.svg.is_none() && a.html.is_none() {
        out!("{}", steps_text(&view, a.step, a.dims, a.color.colors()));
    }
    let KvTensors { shape, k, v } = kv;
    do_export(
        c,
        &[Named { name: "k".into(), shape: shape.clone(), data: &k }, Named { name: "v".into(), shape, data: &v }],
    )
}
