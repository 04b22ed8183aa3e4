//! The safetensors header and tensor table: the input is a whole weights file. Parsed from bytes,
//! then written out and opened as a checkpoint, checked against the fixture's config and read.
#![no_main]
mod common;

use kvgpt_core::weights::{parse_header, Checkpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = parse_header(data, data.len() as u64);
    let path = std::env::temp_dir().join(format!("kvgpt-fuzz-{}.safetensors", std::process::id()));
    std::fs::write(&path, data).unwrap();
    match Checkpoint::open(&path) {
        Ok(ck) => {
            assert!(parsed.is_ok(), "opened a file whose header does not parse");
            if ck.check(common::config()).is_ok() {
                for (name, dims) in kvgpt_core::weights::expected(common::config()) {
                    let shape: Vec<usize> = dims.iter().map(|d| d.1).collect();
                    let _ = ck.tensor(&name, &shape);
                }
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
