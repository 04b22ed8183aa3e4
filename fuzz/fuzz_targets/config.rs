//! config.json: parsed, then checked against the fixture's tensor table.
#![no_main]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    if let Ok(cfg) = kvgpt_core::Config::from_json(&json, std::path::Path::new("config.json")) {
        let ck = kvgpt_core::weights::Checkpoint::open(&common::fixture().join("model.safetensors")).unwrap();
        let _ = ck.check(&cfg);
        let _ = (cfg.head_dim(), cfg.qkv_width(), cfg.attn_scale(cfg.n_layer - 1));
    }
});
