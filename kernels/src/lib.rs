//! Hand-written numeric kernels for kvgpt.
//!
//! Conventions (after llm.c): plain functions over flat row-major `f32` buffers, outputs first,
//! dimensions last, one dimension vocabulary: `T` tokens in this call, `P` tokens already in the
//! cache, `C` channels, `NH` heads, `HS` head size, `K` reduction length, `N` output columns.
//!
//! Exactness rule: every output element is reduced in one fixed order that depends only on the
//! reduction length, never on how many rows are processed, how the work is split between threads,
//! or which instruction set runs it. Every product-sum is a chain of fused multiply-adds, so the
//! scalar path (`f32::mul_add`, correctly rounded) and the SIMD paths give the same bits. That is
//! what makes cached and uncached decoding bit-identical in the engine.
//!
//! Instruction sets: each kernel has one body (`#[inline(always)]`), compiled once plainly (the
//! scalar reference, always present) and once inside a thin `#[target_feature]` wrapper. The
//! [`Isa`] is detected once by the caller and passed in; tests run every path against the scalar one.
//!
//! Modules by concern, each importing only those above it in this list:
//! - `isa` (the instruction sets and their detection), `par` (the threads' split), `aligned`,
//!   `math` (the elementary functions), `packed` (weight storage: layout, formats, filling);
//! - `lanes`: the register vocabulary, a panel row in each ISA's registers; `kv`: how K/V rows
//!   are held (`KvType`) and read as values or lanes;
//! - `dispatch`: the one `kernels!` macro, which each concern below invokes for its own kernels;
//! - `slab`: one allocation for a pool's K/V blocks, one token per block to reach it;
//! - `rows` (dot, sum, max, LayerNorm, softmax, GELU), `attention` (its one home), `int8`
//!   (activation quantization and the integer block dot products of W8A8 and llama.cpp's types), `gemm` (sources, tiles, drivers; the reference).
//!
//! This file only re-exports.

mod aligned;
mod attention;
mod dispatch;
mod gemm;
mod int8;
mod isa;
mod kv;
mod lanes;
mod math;
mod packed;
mod par;
mod peak;
mod rows;
mod slab;

pub use attention::{
    attention, attention_blocks, attention_scores, attention_scores_blocks, AttnDims, KvBlocks, ATTENTION_TILE,
};
pub use gemm::{matmul, matmul_packed};
pub use int8::QuantizedActs;
pub use isa::{cpu_features, Isa};
pub use kv::{kv_load, kv_store, KvType};
pub use math::{exp_approx, gelu_new_scalar, tanh_approx};
pub use packed::{
    bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, quantize_blocks, widen_blocks, PackedMatrix,
    WeightType, NR, Q8_BLOCK, W8_BLOCK,
};
pub use peak::{dot_ops_per_round, dot_peak, fma_flops_per_round, fma_peak, read_all};
pub use rows::{add_inplace, exp_weights, gelu_new, layernorm, softmax_inplace, sum};
pub use slab::{Slab, SlabBlock};
