//! kvgpt's core: a from-scratch GPT-2 / DistilGPT-2 inference engine with a per-layer KV cache,
//! and the serving engine over it. No HTTP, no terminal, no command-line parser: the views
//! (`kvgpt-views`), the server (`kvgpt-serve`), the `kvgpt` binary and the Python package are
//! built over it.
//!
//! Data flow: text → [`Tokenizer`] → ids → [`Model::forward`] (writes K/V into a [`KvCache`],
//! reports named points to a [`Tap`]) → logits → [`Sampler`] → next id, looped by [`generate()`].
//!
//! ```
//! use kvgpt_core::{generate, GenerateOptions, KvCache, Point, Recorder, Scratch, Step};
//!
//! // Any folder with config.json, model.safetensors and tokenizer.json (`Locate` resolves Hub ids).
//! # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-gpt2");
//! let loaded = kvgpt_core::load(&kvgpt_core::hub::local_folder(fixture.as_ref())?)?;
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
//!     serde_json::from_slice(&std::fs::read(format!("{fixture}/reference.json"))?)?;
//! let hf_greedy = &reference["prompts"][0]["greedy"]["ids"];
//! for (i, id) in g.generated_ids.iter().enumerate() {
//!     assert_eq!(hf_greedy[i].as_u64(), Some(*id as u64));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

// Loading: where a model comes from and what it is.
pub mod config;
pub mod convert;
pub mod error;
pub mod files;
pub mod hub;
pub mod load;
pub mod tokenizer;
pub mod weights;

// The model: one forward pass, the K/V it leaves, what it computes and costs.
pub mod kv_cache;
pub mod model;
pub mod tap;
pub mod threads;
pub mod work;

// Choosing tokens.
pub mod logprobs;
pub mod sampler;

// Generating: one sequence, its text, speculation, a conversation.
pub mod chat;
pub mod generate;
pub mod sequence;
pub mod speculative;
pub mod stop;

// The prompt cache, its files and what it tells routers and users.
pub mod cache_report;
pub mod export;
pub mod kv_events;
pub mod prefix_cache;
pub mod prompt_file;
pub mod store;

// Serving: many sequences batched on one thread, and the OpenAI API's shapes over it.
pub mod engine;
pub mod openai;

// Words for readers.
pub mod units;

pub use config::Config;
pub use error::{Error, Result};
pub use generate::{generate, generate_from, generate_text, GenerateOptions, Generation, Step, Timings};
pub use hub::{Locate, ModelFiles, TokenizerFiles};
pub use kv_cache::{KvCache, KvPart, KvSpec};
pub use kvgpt_kernels::{cpu_features, Isa, KvType, WeightType};
pub use load::{load, load_as, load_holding, LoadSpec, Loaded};
pub use model::{Model, Rows, Scratch};
pub use sampler::{Sampler, Sampling};
pub use sequence::{FinishReason, Sequence};
pub use tap::{NoTap, Point, Recorder, Tap};
pub use tokenizer::{StreamDecoder, Tokenizer};
