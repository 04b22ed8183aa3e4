//! GGUF files: the input is a whole file. Opened, its config and tokenizer read from the
//! metadata, checked against its own config, and its tensors read.
#![no_main]

use kvgpt_core::weights::gguf::Gguf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("kvgpt-fuzz-{}.gguf", std::process::id()));
    std::fs::write(&path, data).unwrap();
    match Gguf::open(&path) {
        Ok(g) => {
            if let Ok(json) = g.tokenizer_json() {
                let _ = kvgpt_core::Tokenizer::from_json_bytes(&json, "fuzz");
            }
            if let Ok(cfg) = g.config() {
                if g.check(&cfg).is_ok() {
                    for (name, dims) in kvgpt_core::weights::expected(&cfg) {
                        let shape: Vec<usize> = dims.iter().map(|d| d.1).collect();
                        let _ = g.tensor(&name, &shape);
                    }
                }
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
