//! The server's request bodies: the parser `kvgpt serve` and the Python package answer through
//! (`kvgpt_core::openai`).
#![no_main]

use kvgpt_core::openai as api;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = api::object(data) {
        for r in [
            api::completion(&m).map(drop),
            api::chat(&m).map(drop),
            api::text_field(&m).map(drop),
            api::tokens_field(&m).map(drop),
        ] {
            if let Err(e) = r {
                assert!(e.status.is_client_error() && !e.message.is_empty());
            }
        }
    }
});
