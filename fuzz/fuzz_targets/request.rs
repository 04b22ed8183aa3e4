//! The server's request bodies: the parser of `kvgpt serve` itself, included as a module.
#![no_main]

#[path = "../../serve/src/api.rs"]
#[allow(dead_code)]
mod api;

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
