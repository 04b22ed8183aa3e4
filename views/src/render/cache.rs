//! The cache view's data (built by `inspect cache`, drawn by [`super::cache_term`],
//! [`super::cache_svg`] and [`super::cache_html`]; `--json` prints it as it is).

use kvgpt_core::work::Work;
use serde::Serialize;

/// The work of one step with and without the cache, and how many times more the second is.
#[derive(Serialize)]
pub struct Compare {
    pub with_cache: Work,
    pub without_cache: Work,
    pub ratio: Ratio,
}

#[derive(Serialize)]
pub struct Ratio {
    pub macs: f64,
    pub weight_bytes: f64,
    pub kv_read_bytes: f64,
}

/// One step as the views show it.
#[derive(Serialize)]
pub struct StepView {
    pub step: usize,
    /// "prefill", "prompt" (a prompt token fed alone, after `--prefill N`) or "decode" (a
    /// generated token).
    pub kind: &'static str,
    /// Positions read from the cache (written by earlier steps).
    pub cached_before: usize,
    /// Positions `[from, to)` this step computed and wrote.
    pub written: [usize; 2],
    pub work: Compare,
    /// The step recomputed from an empty cache gave the same K/V and logits, bit for bit (null
    /// for the prefill, which is that computation).
    pub recomputed_same_bits: Option<bool>,
    /// `weights[layer][head][key]`: the step's last query over every key in the cache.
    pub weights: Vec<Vec<Vec<f32>>>,
    /// `scores[query][key]` of the chosen layer and head, before the softmax; `null` is −∞
    /// (masked: a key after the query).
    pub scores: Vec<Vec<Option<f32>>>,
}

/// One row of the cache's block table: logical block `logical` (positions `positions[0]..
/// positions[1]`) lives in the pool's block `physical`, taken when step `step` first wrote it.
#[derive(Serialize)]
pub struct BlockEntry {
    pub logical: usize,
    pub physical: usize,
    pub positions: [usize; 2],
    pub step: usize,
    /// With `--kv-disk`: where the block stands in that tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored: Option<StoredMark>,
}

/// A block against the tier under the pool: its content address (hex), the tier that holds it
/// (None: not held), and whether the stored rows are the bits this run computed (None: not
/// held, or refused by its checksum or header).
#[derive(Serialize)]
pub struct StoredMark {
    pub key: String,
    pub tier: Option<&'static str>,
    pub same_bits: Option<bool>,
}

impl StoredMark {
    /// In words, for the terminal and the HTML table.
    pub fn words(&self) -> &'static str {
        match (self.tier, self.same_bits) {
            (None, _) => "not stored",
            (Some(_), Some(true)) => "stored, the same bits",
            (Some(_), Some(false)) => "stored with OTHER bits",
            (Some(_), None) => "stored, refused (damaged)",
        }
    }
}

/// Everything the views show; `--json` prints it.
#[derive(Serialize)]
pub struct CacheView {
    pub model: String,
    pub dtype: &'static str,
    /// How K and V are held (`--kv-dtype`).
    pub kv_dtype: &'static str,
    pub n_layer: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_positions: usize,
    pub ids: Vec<u32>,
    pub tokens: Vec<String>,
    pub prompt_tokens: usize,
    pub prefill_tokens: usize,
    /// The cache this run held: the positions it may hold, bytes per position, its blocks (of
    /// `block_size` positions) and their bytes.
    pub capacity: usize,
    pub bytes_per_position: usize,
    pub block_size: usize,
    pub blocks: usize,
    /// The block table at the end: logical → physical, in position order.
    pub block_table: Vec<BlockEntry>,
    /// Positions filled at the end.
    pub positions_held: usize,
    pub bytes_allocated: usize,
    pub layer: usize,
    pub head: usize,
    pub steps: Vec<StepView>,
    /// K and V of the chosen layer and head after the last step, `[position][dim]`.
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}
