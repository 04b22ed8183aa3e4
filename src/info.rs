//! `kvgpt info`: what a model is, without running it.

use crate::common::{locate, print_json, ModelArgs, Outcome};
use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &InfoArgs) -> Result<Outcome> {
    let mut info = kvgpt_views::info::describe(&locate(&a.model)?)?;
    if let Some(isa) = crate::common::chosen_isa(&a.model)? {
        info.kernels.isa = isa.name();
    }
    if a.json {
        print_json(&serde_json::to_value(&info)?)?;
        return Ok(Outcome::Done);
    }
    let c = &info.config;
    // The type the weights would be held as: --dtype's, else the GGUF's own, else f32.
    let stored = info.gguf.as_ref().and_then(|g| g.main_type);
    let (chosen, why) = match (a.model.weight_type(), stored) {
        (Some(ty), _) => (ty, "(--dtype)"),
        (None, Some(ty)) => (ty, "(as the file stores it; the default)"),
        (None, None) => (kvgpt_core::WeightType::F32, "(the default)"),
    };
    outln!("model      {}", info.name);
    match &info.gguf {
        // One file holds the weights, the config and the tokenizer: said once, with its header.
        Some(g) => {
            let types: Vec<String> = g.tensor_types.iter().map(|(t, n)| format!("{n} {t}")).collect();
            outln!(
                "file       {} ({}): GGUF version {}, architecture {}, {} ({}), {}",
                info.files.weights,
                bytes(g.file_bytes as usize),
                g.version,
                g.architecture.as_deref().unwrap_or("not given"),
                kvgpt_core::units::count(g.tensors, "tensor"),
                types.join(", "),
                kvgpt_core::units::count(g.metadata_keys, "metadata key")
            );
            for (i, (k, v)) in g.metadata.iter().enumerate() {
                outln!("{:<10} {k} = {v}", if i == 0 { "metadata" } else { "" });
            }
        }
        None => {
            outln!(
                "files      {} ({}), {}",
                info.files.weights,
                bytes(info.files.weights_file_bytes as usize),
                info.files.config
            );
            outln!("tokenizer  {}", info.files.tokenizer.join(", "));
        }
    }
    outln!(
        "shape      {} layers, {} heads × {} = {} channels, MLP {}, vocabulary {}, context {} positions",
        c.n_layer,
        c.n_head,
        c.head_dim,
        c.n_embd,
        c.n_inner,
        c.vocab_size,
        c.n_positions
    );
    let scale = match (c.scale_attn_weights, c.scale_attn_by_inverse_layer_idx) {
        (true, false) => format!("× 1/√{}", c.head_dim),
        (true, true) => format!("× 1/√{} / (layer + 1)", c.head_dim),
        (false, true) => "× 1 / (layer + 1)".to_string(),
        (false, false) => "unscaled".to_string(),
    };
    outln!("           LayerNorm eps {:e}; attention scores {scale}", c.layer_norm_epsilon);
    outln!(
        "parameters {} ({:.1} M; wte is tied to the vocabulary projection)",
        info.parameters,
        info.parameters as f64 / 1e6
    );
    outln!("weights    held in memory, per --dtype:");
    for d in &info.weight_bytes {
        let mark = if d.dtype == chosen.name() { format!("  {why}") } else { String::new() };
        outln!("             {:<5} {:>10}{mark}", d.dtype, bytes(d.bytes));
    }
    outln!(
        "KV cache   {} per token (K and V, {} layers × {} floats each), {} at the full {} positions",
        bytes(info.kv_cache.bytes_per_token),
        c.n_layer,
        c.n_embd,
        bytes(info.kv_cache.bytes_full_context),
        c.n_positions
    );
    let t = &info.tokenizer;
    outln!(
        "tokens     {} ids, byte-level BPE; {:?} = {} ends a text (eos){}",
        t.vocab_size,
        t.eos_token,
        t.eos_token_id,
        if t.bos_token_id == t.eos_token_id {
            " and starts an empty prompt (bos)".to_string()
        } else {
            format!(", bos {}", t.bos_token_id)
        }
    );
    let k = &info.kernels;
    outln!("kernels    {} (available here: {}; CPU: {})", k.isa, k.available.join(", "), k.cpu_features.join(" "));
    Ok(Outcome::Done)
}

/// Bytes as people read them.
fn bytes(n: usize) -> String {
    let n = n as f64;
    if n >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", n / (1024.0 * 1024.0 * 1024.0))
    } else if n >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", n / (1024.0 * 1024.0))
    } else if n >= 1024.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{n} B")
    }
}
