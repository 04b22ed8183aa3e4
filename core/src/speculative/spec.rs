//! How a draft is asked for and loaded (`--draft KIND` or `--draft-model MODEL`, with
//! `--draft-max` and `--draft-min`), for every front end that decodes speculatively.

use super::{Costs, DraftConfig, DraftSource, DraftStats};
use crate::error::{Error, Result};
use crate::load::{load_as, LoadSpec, Loaded};
use crate::tokenizer::Tokenizer;
use kvgpt_kernels::WeightType;
use std::sync::Arc;

/// Longest n-gram the lookup draft matches.
const LOOKUP_NGRAM: usize = 3;

/// Which draft.
#[derive(Clone, Debug, PartialEq)]
pub enum DraftKind {
    /// n-gram prompt lookup: the tokens that followed the last occurrence of the latest words.
    Lookup,
    /// The same checkpoint held a second time as this integer type (`self:w8a8`, `self:q8`).
    SelfAs(WeightType),
    /// Another GPT-2-family model with the same tokenizer, held as `dtype`.
    Model { name: String, dtype: WeightType },
}

/// A draft as asked for: which, and how many tokens a step.
#[derive(Clone, Debug)]
pub struct DraftSpec {
    pub kind: DraftKind,
    /// Draft at most this many tokens a step.
    pub max_k: usize,
    /// Draft at least this many a step, whatever the costs say.
    pub min_k: usize,
}

impl DraftKind {
    /// `--draft KIND`: lookup, self:w8a8 or self:q8.
    pub fn parse(kind: &str) -> Result<DraftKind> {
        match kind {
            "lookup" => Ok(DraftKind::Lookup),
            "self:w8a8" => Ok(DraftKind::SelfAs(WeightType::W8A8)),
            "self:q8" => Ok(DraftKind::SelfAs(WeightType::Q8)),
            _ => Err(Error::Invalid(format!(
                "--draft {kind:?}: the kinds are lookup, self:w8a8 and self:q8; for another model use --draft-model MODEL"
            ))),
        }
    }

    /// The name the reports give it: the kind as written, or the draft model's name.
    pub fn name(&self) -> String {
        match self {
            DraftKind::Lookup => "lookup".into(),
            DraftKind::SelfAs(t) => format!("self:{}", t.name()),
            DraftKind::Model { name, .. } => name.clone(),
        }
    }
}

/// A loaded draft and its name.
pub struct Drafting {
    pub config: DraftConfig,
    pub name: String,
}

impl DraftSpec {
    /// Loads the draft for the model `loaded` (which `model` loaded: its offline setting and
    /// instruction set are the draft's too), and times what a verify row and a drafted token
    /// cost.
    pub fn load(&self, model: &LoadSpec, loaded: &Loaded) -> Result<Drafting> {
        if self.min_k > self.max_k {
            return Err(Error::Invalid(format!(
                "--draft-min {} is more than --draft-max {}; lower it or raise --draft-max",
                self.min_k, self.max_k
            )));
        }
        let source = match &self.kind {
            DraftKind::Lookup => DraftSource::Lookup { max_ngram: LOOKUP_NGRAM },
            DraftKind::SelfAs(dtype) => {
                // Converted from the target's f32 matrices where it holds them (the file's values:
                // the same bytes as loading it again, without the reading); loaded otherwise.
                let draft = match loaded.model.held_as(*dtype) {
                    Some(m) => m,
                    None => load_as(&loaded.files, *dtype)?.model,
                };
                DraftSource::Model(Arc::new(with_isa(model, draft)))
            }
            DraftKind::Model { name, dtype } => {
                let spec = LoadSpec { model: name.clone(), dtype: Some(*dtype), ..model.clone() };
                let draft = load_as(&spec.locate()?, *dtype)?;
                same_tokens(&loaded.tokenizer, &draft.tokenizer, name)?;
                DraftSource::Model(Arc::new(with_isa(model, draft.model)))
            }
        };
        source.check(&loaded.model)?;
        let costs = Costs::measure(&loaded.model, &source, self.max_k)?;
        let config = DraftConfig { source, max_k: self.max_k, min_k: self.min_k, costs };
        Ok(Drafting { config, name: self.kind.name() })
    }
}

impl Drafting {
    /// What the `--json` outputs say about it.
    pub fn json(&self, stats: Option<DraftStats>) -> serde_json::Value {
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

fn with_isa(spec: &LoadSpec, model: crate::model::Model) -> crate::model::Model {
    match spec.isa {
        Some(isa) => model.with_isa(isa),
        None => model,
    }
}

/// Errors unless both tokenizers give every id the same bytes.
fn same_tokens(a: &Tokenizer, b: &Tokenizer, draft: &str) -> Result<()> {
    if let Some(id) = (0..a.vocab_size().min(b.vocab_size()) as u32).find(|&i| a.token_bytes(i) != b.token_bytes(i)) {
        return Err(Error::Invalid(format!(
            "--draft-model {draft}: its tokenizer differs from the model's at id {id} ({:?} against {:?}); \
             a draft must use the same tokenizer",
            b.token_label(id),
            a.token_label(id)
        )));
    }
    Ok(())
}
