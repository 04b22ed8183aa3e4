//! `--draft`: speculative decoding's flags, shared by `generate`, `chat`, `bench` and `serve`.

use crate::common::{chosen_isa, Dtype, ModelArgs};
use anyhow::{bail, Result};
use clap::Args;
use kvgpt::speculative::{Costs, DraftConfig, DraftSource};
use kvgpt::{Loaded, Locate};
use std::sync::Arc;

/// Longest n-gram the lookup draft matches.
const LOOKUP_NGRAM: usize = 3;

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
    /// none when drafting does not pay.
    #[arg(long, value_name = "K", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub draft_max: u16,
    /// Draft at least K tokens a step, whatever the costs say (llama.cpp's --draft-min; K =
    /// --draft-max drafts that many every step).
    #[arg(long, value_name = "K", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=32))]
    pub draft_min: u16,
}

/// A loaded draft and its name.
pub struct Drafting {
    pub config: DraftConfig,
    pub name: String,
}

impl Drafting {
    /// What the `--json` outputs say about it.
    pub fn json(&self, stats: Option<kvgpt::speculative::DraftStats>) -> serde_json::Value {
        let s = stats.unwrap_or_default();
        serde_json::json!({
            "draft": self.name,
            "max_k": self.config.max_k,
            "min_k": self.config.min_k,
            "row_cost": self.config.costs.row,
            "draft_cost": self.config.costs.draft,
            "steps": s.steps,
            "drafted_tokens": s.drafted,
            "accepted_tokens": s.accepted,
            "acceptance": s.acceptance(),
        })
    }
}

impl DraftArgs {
    /// The draft these flags ask for, if any, for the model `loaded` (read with `m`'s flags).
    pub fn load(&self, m: &ModelArgs, loaded: &Loaded) -> Result<Option<Drafting>> {
        let (source, name) = match (&self.draft, &self.draft_model) {
            (None, None) => return Ok(None),
            (Some(kind), _) if kind == "lookup" => (DraftSource::Lookup { max_ngram: LOOKUP_NGRAM }, kind.clone()),
            (Some(kind), _) => {
                let dtype = match kind.as_str() {
                    "self:w8a8" => kvgpt::WeightType::W8A8,
                    "self:q8" => kvgpt::WeightType::Q8,
                    _ => bail!(
                        "--draft {kind:?}: the kinds are lookup, self:w8a8 and self:q8; for another model \
                         use --draft-model MODEL"
                    ),
                };
                let draft = kvgpt::load_as(&loaded.files, dtype)?;
                (DraftSource::Model(Arc::new(with_isa(m, draft.model)?)), kind.clone())
            }
            (None, Some(name)) => {
                let files = Locate::from_env(m.offline).resolve(name)?;
                let draft = kvgpt::load_as(&files, self.draft_dtype.weight_type())?;
                same_tokens(&loaded.tokenizer, &draft.tokenizer, name)?;
                (DraftSource::Model(Arc::new(with_isa(m, draft.model)?)), name.clone())
            }
        };
        source.check(&loaded.model)?;
        let (max_k, min_k) = (self.draft_max as usize, self.draft_min as usize);
        if min_k > max_k {
            bail!("--draft-min {min_k} is more than --draft-max {max_k}; lower it or raise --draft-max");
        }
        let costs = Costs::measure(&loaded.model, &source, max_k)?;
        Ok(Some(Drafting { config: DraftConfig { source, max_k, min_k, costs }, name }))
    }
}

fn with_isa(m: &ModelArgs, model: kvgpt::Model) -> Result<kvgpt::Model> {
    Ok(match chosen_isa(m)? {
        Some(isa) => model.with_isa(isa),
        None => model,
    })
}

/// Errors unless both tokenizers give every id the same bytes.
fn same_tokens(a: &kvgpt::Tokenizer, b: &kvgpt::Tokenizer, draft: &str) -> Result<()> {
    if let Some(id) = (0..a.vocab_size().min(b.vocab_size()) as u32).find(|&i| a.token_bytes(i) != b.token_bytes(i)) {
        bail!(
            "--draft-model {draft}: its tokenizer differs from the model's at id {id} ({:?} against {:?}); \
             a draft must use the same tokenizer",
            b.token_label(id),
            a.token_label(id)
        );
    }
    Ok(())
}
