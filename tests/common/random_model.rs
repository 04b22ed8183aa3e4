//! Random GPT-2 checkpoints of any shape, written as Hugging Face folders with the fixture's
//! tokenizer: for contexts longer than the fixture's 128 positions, and for draft models of
//! another size.

use super::fixture_dir;
use std::path::Path;

#[derive(Clone, Copy)]
pub struct Shape {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_positions: usize,
    pub seed: u64,
    /// Zero the embeddings of `<|endoftext|>` and every token holding a newline, so that greedy
    /// never picks them and answers run on.
    pub endless: bool,
}

/// Writes config.json, tokenizer.json and model.safetensors (f32) into `dir`.
pub fn write(dir: &Path, s: Shape) {
    let (c, l, p, v, f) = (s.n_embd, s.n_layer, s.n_positions, 50257usize, 4 * s.n_embd);
    let config = serde_json::json!({
        "model_type": "gpt2", "n_embd": c, "n_layer": l, "n_head": s.n_head, "n_positions": p,
        "vocab_size": v, "n_inner": f, "layer_norm_epsilon": 1e-5, "bos_token_id": 50256,
        "eos_token_id": 50256,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(fixture_dir().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let tok = kvgpt_core::Tokenizer::from_json_file(&dir.join("tokenizer.json")).unwrap();
    let mut state = 0x2545_F491_4F6C_DD1Du64 ^ s.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut rand = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut wte = rand(v * c, 0.3);
    if s.endless {
        for id in 0..v as u32 {
            if id == 50256 || tok.token_bytes(id).contains(&b'\n') {
                wte[id as usize * c..(id as usize + 1) * c].fill(0.0);
            }
        }
    }
    tensors.push(("wte.weight".into(), vec![v, c], wte));
    tensors.push(("wpe.weight".into(), vec![p, c], rand(p * c, 0.1)));
    for i in 0..l {
        for (name, shape) in [
            ("ln_1.weight", vec![c]),
            ("ln_1.bias", vec![c]),
            ("attn.c_attn.weight", vec![c, 3 * c]),
            ("attn.c_attn.bias", vec![3 * c]),
            ("attn.c_proj.weight", vec![c, c]),
            ("attn.c_proj.bias", vec![c]),
            ("ln_2.weight", vec![c]),
            ("ln_2.bias", vec![c]),
            ("mlp.c_fc.weight", vec![c, f]),
            ("mlp.c_fc.bias", vec![f]),
            ("mlp.c_proj.weight", vec![f, c]),
            ("mlp.c_proj.bias", vec![c]),
        ] {
            let n = shape.iter().product();
            let data = if name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") {
                vec![1.0; n]
            } else {
                rand(n, 0.1)
            };
            tensors.push((format!("h.{i}.{name}"), shape, data));
        }
    }
    tensors.push(("ln_f.weight".into(), vec![c], vec![1.0; c]));
    tensors.push(("ln_f.bias".into(), vec![c], vec![0.0; c]));
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.into_iter().map(|(n, s, d)| (n, s, d.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(n, s, d)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// A small draft model (1 layer, 32 wide) with the fixture's tokenizer, in a folder of its own.
pub fn small_draft_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let shape = Shape { n_embd: 32, n_layer: 1, n_head: 2, n_positions: 512, seed: 7, endless: false };
    write(dir.path(), shape);
    dir
}
