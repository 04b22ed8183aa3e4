//! The .npy reader of `verify reference`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((shape, values)) = kvgpt_core::export::read_npy(data) {
        assert_eq!(shape.iter().product::<usize>(), values.len());
    }
});
