//! `--draft`: speculative decoding's flags, shared by `generate`, `chat`, `bench` and `serve`.

use crate::common::{Dtype, ModelArgs};
use anyhow::Result;
use clap::Args;
use kvgpt_core::files::Inputs;
use kvgpt_core::speculative::{DraftKind, DraftSpec, Drafting};
use kvgpt_core::{Loaded, ModelFiles};
use std::path::Path;

#[derive(Args, Clone)]
pub struct DraftArgs {
    /// Decode speculatively, exactly: a draft proposes tokens and the model checks them all in
    /// one step, keeping the ones it would have chosen itself, so the answer is the same bits
    /// as without. KIND is `lookup` (n-gram prompt lookup: the tokens that followed the last
    /// occurrence of the latest words), `self:w8a8` or `self:q8` (the same checkpoint held a
    /// second time at int8), or use --draft-model.
    #[arg(long, value_name = "KIND", conflicts_with = "draft_model")]
    pub draft: Option<String>,
    /// Draft with another GPT-2-family model with the same tokenizer (a folder or Hub id, any
    /// number of layers and width), held as --draft-dtype.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// How the --draft-model's weights are held.
    #[arg(long, value_enum, default_value_t = Dtype::F32, requires = "draft_model")]
    pub draft_dtype: Dtype,
    /// Draft at most K tokens a step; how many is chosen each step from how often drafts were
    /// accepted and what a verify row and a drafted token cost (timed when the draft loads),
    /// none when drafting does not pay. 16 by default: a well-accepted self draft pays up to
    /// there (DESIGN.md, "Speculation, honestly timed").
    #[arg(long, value_name = "K", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub draft_max: u16,
    /// Draft at least K tokens a step, whatever the costs say (llama.cpp's --draft-min; K =
    /// --draft-max drafts that many every step).
    #[arg(long, value_name = "K", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=32))]
    pub draft_min: u16,
}

impl DraftArgs {
    /// The draft these flags ask for, if any.
    pub fn spec(&self) -> Result<Option<DraftSpec>> {
        let kind = match (&self.draft, &self.draft_model) {
            (None, None) => return Ok(None),
            (Some(kind), _) => DraftKind::parse(kind)?,
            (None, Some(name)) => DraftKind::Model { name: name.clone(), dtype: self.draft_dtype.weight_type() },
        };
        Ok(Some(DraftSpec { kind, max_k: self.draft_max as usize, min_k: self.draft_min as usize }))
    }

    /// The files of the --draft-model, if one is named (located as `m`'s flags locate the model).
    pub fn model_files(&self, m: &ModelArgs) -> Result<Option<ModelFiles>> {
        let Some(name) = &self.draft_model else { return Ok(None) };
        let spec = kvgpt_core::LoadSpec { model: name.clone(), ..m.spec()? };
        Ok(Some(spec.locate()?))
    }

    /// The draft these flags ask for, if any, loaded for the model `loaded` (read with `m`'s flags).
    pub fn load(&self, m: &ModelArgs, loaded: &Loaded) -> Result<Option<Drafting>> {
        let Some(spec) = self.spec()? else { return Ok(None) };
        Ok(Some(spec.load(&m.spec()?, loaded)?))
    }
}

/// The files a run reads: the model's `files`, the --draft-model's (if `draft` names one) and
/// `others` (each with what it is). No output may be written onto one of them.
pub fn inputs(
    m: &ModelArgs,
    files: &ModelFiles,
    draft: Option<&DraftArgs>,
    others: &[(&Path, &str)],
) -> Result<Inputs> {
    let mut inputs = files.inputs("the model's");
    if let Some(draft) = draft.map(|d| d.model_files(m)).transpose()?.flatten() {
        inputs = inputs.and(draft.inputs("the draft model's"));
    }
    Ok(others.iter().fold(inputs, |i, (path, what)| i.with(path, what)))
}
