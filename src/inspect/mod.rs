//! `kvgpt inspect …` and `kvgpt explain`: the learner's views of the forward pass, with the
//! engine's real numbers, as text, JSON, heatmaps and exported tensors.

use crate::common::{ModelArgs, Outcome};
use anyhow::{bail, Result};
use clap::Subcommand;
use kvgpt_core::export;
use std::path::{Path, PathBuf};

mod attention;
mod cache;
mod draft;
mod embeddings;
mod explain;
mod logits;
mod session;
mod tokens;

use attention::{attention, AttentionArgs};
use cache::{cache, CacheArgs};
use draft::{draft, DraftViewArgs};
use embeddings::embeddings;
pub use explain::{explain, ExplainArgs};
use logits::logits;
use session::{check_writable, Common};
use tokens::tokens;

#[derive(Subcommand)]
pub enum InspectCmd {
    /// Token ids, pieces (raw bytes where a piece is part of a UTF-8 character) and byte offsets.
    Tokens(Common),
    /// Per position: the wte row, the wpe row and their sum (first numbers and norms).
    Embeddings {
        #[command(flatten)]
        c: Common,
        /// How many leading numbers of each row to show.
        #[arg(long, default_value_t = 8)]
        dims: usize,
    },
    /// Attention weights [query, key] per layer and head (or one query over every head), as a
    /// heatmap that fits the terminal, JSON, SVG or an HTML viewer.
    Attention {
        #[command(flatten)]
        c: Common,
        #[command(flatten)]
        a: AttentionArgs,
    },
    /// Top-k next-token probabilities, logits and entropy; `--lens` adds the logit lens per layer.
    Logits {
        #[command(flatten)]
        c: Common,
        /// How many of the most likely tokens to show.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
        top_k: u32,
        /// The position whose next-token distribution to show (default: the last).
        #[arg(long, conflicts_with = "all_positions")]
        position: Option<usize>,
        /// Show every position.
        #[arg(long)]
        all_positions: bool,
        /// The logit lens: each layer's residual stream through ln_f and the vocabulary projection.
        #[arg(long)]
        lens: bool,
    },
    /// The KV cache step by step (the prefill, then each decode step): what each step writes and
    /// reads, its work against the same step without the cache, the scores before the softmax
    /// and the K/V values of a head (terminal, JSON, --svg or --html).
    Cache {
        #[command(flatten)]
        c: Common,
        #[command(flatten)]
        a: CacheArgs,
    },
    /// Speculative decoding round by round: the drafted tokens, which the model accepted, its own
    /// token, and its cache before the step and after the rollback (terminal, JSON or --html).
    Draft {
        #[command(flatten)]
        c: Common,
        #[command(flatten)]
        a: DraftViewArgs,
    },
}

/// What every inspect command takes.
impl InspectCmd {
    pub fn model_args(&self) -> &ModelArgs {
        &self.common().io.model
    }

    fn common(&self) -> &Common {
        match self {
            InspectCmd::Tokens(c)
            | InspectCmd::Embeddings { c, .. }
            | InspectCmd::Attention { c, .. }
            | InspectCmd::Logits { c, .. }
            | InspectCmd::Cache { c, .. }
            | InspectCmd::Draft { c, .. } => c,
        }
    }
}

pub fn run(cmd: InspectCmd) -> Result<Outcome> {
    let c = cmd.common();
    if let (InspectCmd::Tokens(_), Some(_)) = (&cmd, &c.export) {
        bail!("inspect tokens has no tensor to --export; --json prints the ids, tokens, bytes and offsets");
    }
    let mut outputs: Vec<&Path> = Vec::new();
    if let Some(p) = &c.export {
        export::Format::of(p)?;
        outputs.push(p);
    }
    if let InspectCmd::Attention { a, .. } = &cmd {
        outputs.extend(a.svg.iter().chain(&a.html).map(PathBuf::as_path));
    }
    if let InspectCmd::Cache { a, .. } = &cmd {
        outputs.extend(a.svg.iter().chain(&a.html).map(PathBuf::as_path));
    }
    let mut drafts = None;
    if let InspectCmd::Draft { a, .. } = &cmd {
        outputs.extend(a.html.as_deref());
        drafts = Some(&a.draft);
    }
    if !outputs.is_empty() {
        let files = crate::common::locate(&c.io.model)?;
        let prompt_file = c.io.prompt.prompt_file.as_deref().map(|p| (p, "the prompt file"));
        let inputs = crate::draft::inputs(&c.io.model, &files, drafts, prompt_file.as_slice())?;
        for p in outputs {
            check_writable(p)?;
            inputs.refuse_as_output(p)?;
        }
    }
    match &cmd {
        InspectCmd::Tokens(c) => tokens(c),
        InspectCmd::Embeddings { c, dims } => embeddings(c, *dims),
        InspectCmd::Attention { c, a } => attention(c, a),
        InspectCmd::Logits { c, top_k, position, all_positions, lens } => {
            logits(c, *top_k as usize, *position, *all_positions, *lens)
        }
        InspectCmd::Cache { c, a } => cache(c, a),
        InspectCmd::Draft { c, a } => draft(c, a),
    }?;
    Ok(Outcome::Done)
}
