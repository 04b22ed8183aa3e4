//! `kvgpt explain`: one forward pass and one cached decode step as a short lesson
//! (`kvgpt_views::inspect::explain`).

use crate::common::{load, prompt_ids, read_prompt, ModelArgs, Outcome, PromptArgs};
use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn explain(a: &ExplainArgs) -> Result<Outcome> {
    let text = read_prompt(&a.prompt)?;
    let loaded = load(&a.model)?;
    let ids = prompt_ids(&loaded, &text)?;
    out!("{}", kvgpt_views::inspect::explain::explain(&loaded, &text, &ids)?);
    Ok(Outcome::Done)
}
