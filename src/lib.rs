//! kvgpt: a from-scratch GPT-2 / DistilGPT-2 inference engine with a per-layer KV cache.
//!
//! Data flow: text → [`Tokenizer`] → ids → [`Model::forward`] (writes K/V into a [`KvCache`],
//! reports named points to a [`Tap`]) → logits → [`Sampler`] → next id, looped by [`generate()`].

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod export;
pub mod generate;
pub mod hub;
pub mod info;
pub mod inspect;
pub mod kv_cache;
pub mod model;
pub mod prefix_cache;
pub mod prompt_file;
pub mod sampler;
pub mod scheduler;
pub mod score;
pub mod sequence;
pub mod stop;
pub mod tap;
pub mod tokenizer;
pub mod verify;

pub use config::Config;
pub use error::{Error, Result};
pub use generate::{generate, generate_from, FinishReason, GenerateOptions, Generation, Step, Timings};
pub use hub::{Locate, ModelFiles, TokenizerFiles};
pub use kv_cache::{KvCache, KvPart};
pub use model::{Batched, Model, Rows, Scratch};
pub use sampler::{Sampler, Sampling};
pub use sequence::Sequence;
pub use tap::{NoTap, Point, Recorder, Tap};
pub use tokenizer::{StreamDecoder, Tokenizer};

/// A loaded model with its tokenizer.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub files: ModelFiles,
}

pub use kvgpt_kernels::WeightType;

/// Loads the model (weights held in f32) and tokenizer of `files` and checks that they agree.
pub fn load(files: &ModelFiles) -> Result<Loaded> {
    load_as(files, WeightType::F32)
}

/// As [`load`], holding the weight matrices as `dtype` (converted or quantized at load time).
pub fn load_as(files: &ModelFiles, dtype: WeightType) -> Result<Loaded> {
    let (tokenizer, model) = rayon::join(
        || Tokenizer::from_files(&files.tokenizer),
        || Model::load_as(&files.config, &files.weights, dtype),
    );
    let (tokenizer, model) = (tokenizer?, model?);
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
