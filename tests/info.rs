//! `kvgpt info` against independent counts: the parameters in the fixture's safetensors file as
//! the `safetensors` crate reads it, the bytes each `--dtype` really allocates, the KV cache's.

mod common;

use common::*;
use kvgpt_core::{Model, WeightType};
use std::process::Command;

#[test]
fn info_counts_what_loading_holds() {
    let files = kvgpt_core::hub::local_folder(&fixture_dir()).unwrap();
    let info = kvgpt_views::info::describe(&files).unwrap();
    // Every tensor of the file, counted by the safetensors crate (the fixture has no mask buffers
    // and no lm_head: wte is tied).
    let bytes = std::fs::read(&files.weights).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let in_file: usize = st.tensors().iter().map(|(_, t)| t.shape().iter().product::<usize>()).sum();
    assert_eq!(info.parameters, in_file);
    assert_eq!(info.files.weights_file_bytes, bytes.len() as u64);
    for ty in WeightType::ALL {
        let model = Model::load_as(&files.config, &files.weights, ty).unwrap();
        let got = info.weight_bytes.iter().find(|d| d.dtype == ty.name()).unwrap().bytes;
        assert_eq!(got, model.weight_bytes(), "{}", ty.name());
    }
    let cfg = &load_fixture().model.config;
    // Every position of the context: 2 (K, V) × layers × C × 4 bytes each.
    assert_eq!(info.kv_cache.bytes_full_context, cfg.n_positions * 2 * cfg.n_layer * cfg.n_embd * 4);
    assert_eq!(info.config.n_positions, 128);
    assert_eq!((info.tokenizer.eos_token.as_str(), info.tokenizer.eos_token_id), ("<|endoftext|>", 50256));
    assert_eq!(info.kernels.available.first(), Some(&"scalar"));
}

#[test]
fn the_cli_prints_it() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(["info", "--model", &m]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for want in
        ["2 layers, 4 heads × 16 = 64 channels, MLP 256, vocabulary 50257, context 128 positions", "parameters 3"]
    {
        assert!(text.contains(want), "{want:?} in {text}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(["info", "--model", &m, "--json"]).output().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["kv_cache"]["bytes_per_token"], 2 * 2 * 64 * 4);
    // One entry per --dtype.
    let names: Vec<&str> = j["weight_bytes"].as_array().unwrap().iter().map(|d| d["dtype"].as_str().unwrap()).collect();
    assert_eq!(names, ["f32", "f16", "bf16", "q8", "w8a8", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k"]);
    let out =
        Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(["info", "--model", "/nonexistent/folder"]).output().unwrap();
    assert!(!out.status.success());
}
