//! kvgpt: a from-scratch GPT-2 / DistilGPT-2 inference engine with a per-layer KV cache.
//!
//! Data flow: text → [`Tokenizer`] → ids → [`Model::forward`] (writes K/V into a [`KvCache`],
//! reports named points to a [`Tap`]) → logits → [`Sampler`] → next id, looped by [`generate()`].
//!
//! ```
//! use kvgpt::{generate, GenerateOptions, KvCache, Point, Recorder, Scratch, Step};
//!
//! // Any folder with config.json, model.safetensors and tokenizer.json (`Locate` resolves Hub ids).
//! let loaded = kvgpt::load(&kvgpt::hub::local_folder("tests/fixtures/tiny-gpt2".as_ref())?)?;
//! let (model, tok) = (&loaded.model, &loaded.tokenizer);
//! let ids = tok.encode("The cat sat on")?;
//!
//! // Greedy generation with the KV cache (the callback sees each token as it comes).
//! let opts = GenerateOptions { max_new_tokens: 5, ..GenerateOptions::default() };
//! let g = generate(model, &ids, &opts, &mut |_id, _logits| Ok(Step::Go))?;
//! println!("{}", tok.decode(&g.generated_ids));
//!
//! // One forward pass with a tap: layer 0's attention weights, [NH, T, T].
//! let mut tap = Recorder::only(|p| p == Point::AttnProbs(0));
//! let mut logits = vec![0.0; model.config.vocab_size];
//! let (mut cache, mut scratch) = (KvCache::new(&model.config), Scratch::new(&model.config, ids.len()));
//! model.forward(&ids, &mut cache, &mut scratch, &mut tap, &mut logits)?;
//! let probs = tap.last(Point::AttnProbs(0)).unwrap();
//! assert_eq!(probs.shape, [model.config.n_head, ids.len(), ids.len()]);
//!
//! // Both as Hugging Face transformers computed them on this fixture (its reference.json).
//! let reference: serde_json::Value =
//!     serde_json::from_slice(&std::fs::read("tests/fixtures/tiny-gpt2/reference.json")?)?;
//! let hf_greedy = &reference["prompts"][0]["greedy"]["ids"];
//! for (i, id) in g.generated_ids.iter().enumerate() {
//!     assert_eq!(hf_greedy[i].as_u64(), Some(*id as u64));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

pub mod bench;
pub mod cache_replay;
pub mod cache_report;
pub mod chat;
pub mod config;
pub mod engine;
pub mod error;
pub mod export;
pub mod generate;
pub mod hub;
pub mod info;
pub mod inspect;
pub mod kv_cache;
pub mod kv_events;
pub mod logprobs;
pub mod model;
pub mod prefix_cache;
pub mod prompt_file;
pub mod sampler;
pub mod score;
pub mod sequence;
pub mod speculative;
pub mod stop;
pub mod tap;
pub mod tokenizer;
pub mod verify;
pub mod views;
pub mod weights;
pub mod work;

pub use config::Config;
pub use error::{Error, Result};
pub use generate::{generate, generate_from, generate_text, FinishReason, GenerateOptions, Generation, Step, Timings};
pub use hub::{Locate, ModelFiles, TokenizerFiles};
pub use kv_cache::{KvCache, KvPart};
pub use model::{Model, Rows, Scratch};
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
