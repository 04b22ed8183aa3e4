//! `kvgpt info`: what a model is, without running it.

use crate::common::{locate, print_json, ModelArgs, Outcome};
use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &InfoArgs) -> Result<Outcome> {
    let mut info = kvgpt_views::info::describe(&locate(&a.model)?)?;
    if let Some(isa) = crate::common::chosen_isa(&a.model)? {
        info.kernels.isa = isa.name();
    }
    if a.json {
        print_json(&serde_json::to_value(&info)?)?;
        return Ok(Outcome::Done);
    }
    out!("{}", info.text(a.model.weight_type()));
    Ok(Outcome::Done)
}
