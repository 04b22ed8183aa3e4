//! The model: GPT-2 weights named as in the checkpoint (`wte`, `wpe`, `h[i].ln_1`, `c_attn`,
//! `c_proj`, `ln_2`, `c_fc`, `ln_f`) and one forward pass for every use.
//!
//! Dimensions: `T` tokens in this call, `P` tokens already cached, `C` channels, `NH` heads,
//! `HS` head size, `F` MLP width, `V` vocabulary, `R` rows whose logits are wanted.

mod fingerprint;
mod forward;
mod gpt2;
mod rows;
mod work;

pub use fingerprint::Fingerprint;
pub use gpt2::{Block, Conv1D, LayerNorm, Model};
pub use rows::{Rows, Scratch, CHUNK_ROWS};
