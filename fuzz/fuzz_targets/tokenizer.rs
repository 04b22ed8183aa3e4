//! tokenizer.json from bytes, then used once.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = kvgpt_core::Tokenizer::from_json_bytes(data, "tokenizer.json") {
        if let Ok(ids) = t.encode("The cat sat on the mat") {
            for id in ids {
                let _ = (t.token_bytes(id), t.token_label(id));
            }
        }
    }
});
