//! Loading a model: its files located ([`crate::hub`]), the weights held as asked, the tokenizer
//! checked against the config. [`LoadSpec`] is what every front end asks for (the CLI's
//! `--model --offline --dtype --isa --kv-block-size`, the server's, Python's `kvgpt.load`).

use crate::error::{Error, Result};
use crate::hub::{Locate, ModelFiles};
use crate::kv_cache::KvSpec;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use crate::weights;
use kvgpt_kernels::{Isa, WeightType};

/// A loaded model with its tokenizer.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub files: ModelFiles,
}

/// What to load and how.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// A model folder, a GGUF file or a Hugging Face Hub id.
    pub model: String,
    /// Only the local Hugging Face cache, never the network.
    pub offline: bool,
    /// How the weight matrices are held (None: as the file stores them; f32 from safetensors).
    pub dtype: Option<WeightType>,
    /// The kernels' instruction set (None: the best this CPU has).
    pub isa: Option<Isa>,
    /// How its caches hold K/V (`--kv-block-size`).
    pub kv: KvSpec,
}

impl LoadSpec {
    /// The model's files, found (and fetched, unless offline) where the spec says.
    pub fn locate(&self) -> Result<ModelFiles> {
        Locate::from_env(self.offline).resolve(&self.model)
    }

    /// Loads the model; `say` hears, before a long conversion starts, what `dtype` does to a
    /// GGUF stored as another type.
    pub fn load(&self, say: &mut dyn FnMut(&str)) -> Result<Loaded> {
        let files = self.locate()?;
        if let Some(note) = self.conversion_note(&files) {
            say(&note);
        }
        let mut loaded = load_holding(&files, self.dtype)?;
        if let Some(isa) = self.isa {
            loaded.model = loaded.model.with_isa(isa);
        }
        loaded.model = loaded.model.with_kv(self.kv);
        Ok(loaded)
    }

    /// What `dtype` does to a GGUF stored as another type (the header is read only when a
    /// type is asked for).
    fn conversion_note(&self, files: &ModelFiles) -> Option<String> {
        let ty = self.dtype?;
        let stored = weights::gguf_main_type(&files.weights).filter(|&s| s != ty)?;
        let float = |t: WeightType| matches!(t, WeightType::F32 | WeightType::F16 | WeightType::Bf16);
        let how = match (float(stored), float(ty)) {
            // A file's quantized values, read back as f32, quantized anew.
            (false, false) => "quantizes them again from their f32 values: the weights are no longer the file's",
            (true, false) => "quantizes them: the weights are no longer the file's",
            (false, true) => "converts them from their f32 values (widened exactly)",
            (true, true) if ty == WeightType::F32 => "widens them exactly",
            (true, true) => "rounds them to the nearest value it holds: the weights are no longer the file's",
        };
        Some(format!(
            "note: {} holds {} weights; --dtype {} {how} (without --dtype they are held as they are)",
            files.weights.display(),
            stored.name(),
            ty.name()
        ))
    }
}

/// Loads the model (weights held in f32) and tokenizer of `files` and checks that they agree.
pub fn load(files: &ModelFiles) -> Result<Loaded> {
    load_as(files, WeightType::F32)
}

/// As [`load`], holding the weight matrices as `dtype` (converted or quantized at load time).
pub fn load_as(files: &ModelFiles, dtype: WeightType) -> Result<Loaded> {
    load_holding(files, Some(dtype))
}

/// As [`load`], holding the weight matrices as `dtype`, or with None as the file stores them (a
/// GGUF's own types, e.g. Q4_0 blocks as they are; f32 from safetensors).
pub fn load_holding(files: &ModelFiles, dtype: Option<WeightType>) -> Result<Loaded> {
    let (tokenizer, model) = rayon::join(
        || Tokenizer::from_files(&files.tokenizer),
        || Model::load_holding(&files.config, &files.weights, dtype),
    );
    // The model's error first: a GGUF of another architecture has no GPT-2 tokenizer either.
    let model = model?;
    let tokenizer = tokenizer?;
    if tokenizer.vocab_size() != model.config.vocab_size {
        return Err(Error::Tokenizer(format!(
            "the tokenizer has {} tokens but the model's vocabulary (vocab_size in {}) has {}; \
             use the tokenizer that belongs to this model",
            tokenizer.vocab_size(),
            files.config.display(),
            model.config.vocab_size
        )));
    }
    Ok(Loaded { model, tokenizer, files: files.clone() })
}
