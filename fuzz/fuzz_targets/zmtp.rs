//! The KV-event sockets' ZMTP decoder (`kvgpt_serve::zmtp`), fed a peer's bytes in pieces of any
//! size: it returns items or refuses the peer, never panics, and never holds more than a frame.
#![no_main]

use kvgpt_serve::zmtp::{Decoder, Inbound, MAX_FRAME, MAX_FRAMES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else { return };
    let mut d = Decoder::default();
    for piece in bytes.chunks(usize::from(cut).max(1)) {
        match d.push(piece) {
            Ok(items) => {
                for item in items {
                    if let Inbound::Message(frames) = item {
                        assert!(frames.len() <= MAX_FRAMES && frames.iter().all(|f| f.len() <= MAX_FRAME));
                    }
                }
            }
            Err(e) => {
                assert!(!e.0.is_empty());
                return;
            }
        }
    }
});
