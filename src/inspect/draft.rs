//! `inspect draft`: speculative decoding round by round — what the draft proposed, which tokens
//! the model kept, its own token, and its cache before the step, after the forward over the
//! drafts and after the rollback; in the terminal, as JSON, or as one self-contained HTML page.

use super::session::{write_text, Common, Session};
use crate::common::print_json;
use crate::draft::DraftArgs;
use anyhow::{bail, Result};
use clap::Args;
use kvgpt_views::inspect::draft::DraftView;
use std::path::PathBuf;

#[derive(Args)]
pub struct DraftViewArgs {
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Tokens to decode (greedy) after the prompt; each round drafts --draft-max of them.
    #[arg(long, short = 'n', default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..))]
    pub generate: u32,
    /// Also write the rounds as one self-contained HTML page (no network).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

pub(super) fn draft(c: &Common, a: &DraftViewArgs) -> Result<()> {
    let s = Session::open(c)?;
    let Some(drafting) = a.draft.load(&c.io.model, &s.loaded)? else {
        bail!("inspect draft shows a draft at work: give one with --draft lookup|self:w8a8|self:q8 or --draft-model M");
    };
    let view = DraftView::compute(&s.loaded, &s.ids, &drafting, a.generate as usize)?;
    if let Some(path) = &a.html {
        write_text(path, &view.html()?)?;
        errln!("[kvgpt] wrote {}", path.display());
    }
    if c.io.json {
        return print_json(&serde_json::to_value(&view)?);
    }
    if a.html.is_some() {
        return Ok(()); // the page is the answer, as with every view's pictures
    }
    out!("{}", view.text());
    Ok(())
}
