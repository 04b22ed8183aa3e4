//! A prompt cache file (`generate --prompt-cache`), checked against the fixture model. The
//! checksum is recomputed when asked (the first byte's low bit), so the fuzzer gets past it as a
//! hostile file would.
#![no_main]
mod common;

use kvgpt_core::prompt_file::{fnv1a, parse, FNV_OFFSET};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if bytes.first().is_some_and(|b| b & 1 == 1) && bytes.len() >= 8 {
        let n = bytes.len() - 8;
        let sum = fnv1a(FNV_OFFSET, &bytes[..n]);
        bytes[n..].copy_from_slice(&sum.to_le_bytes());
    }
    if let Ok(saved) = parse(&bytes, common::model(), std::path::Path::new("fuzz.kvpc")) {
        assert!(saved.ids.len() <= common::model().config.n_positions);
    }
});
