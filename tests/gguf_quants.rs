//! GGUFs of llama.cpp's block types, written by llama.cpp itself from the fixture
//! (`scripts/fixtures/make_fixture_gguf.sh`: the converter for Q8_0, `llama-quantize --pure` for Q4_0,
//! Q4_1, Q5_0 and Q5_1): held as the file stores them by default, they are the blocks `--dtype`
//! makes of the safetensors source (llama.cpp's reference quantizers), so the logits are the same
//! bits; the weights held are the file's, widened exactly; and they track Hugging Face's logits.

mod common;

use common::*;
use kvgpt_core::{Model, WeightType};
use std::process::Command;

const TYPES: [(&str, WeightType); 5] = [
    ("q8_0", WeightType::Q8_0),
    ("q4_0", WeightType::Q4_0),
    ("q4_1", WeightType::Q4_1),
    ("q5_0", WeightType::Q5_0),
    ("q5_1", WeightType::Q5_1),
];

fn load(path: &std::path::Path, ty: Option<WeightType>) -> Model {
    let files = kvgpt_core::Locate::from_env(true).resolve(path.to_str().unwrap()).unwrap();
    kvgpt_core::load_holding(&files, ty).unwrap().model
}

#[test]
fn llama_cpp_blocks_are_what_dtype_makes_of_the_source() {
    let reference = Reference::load();
    for (name, ty) in TYPES {
        let stored = load(&gguf_fixture(name), None);
        assert_eq!(stored.weights_dtype(), name, "a {name} GGUF is held as {name} by default");
        let source =
            Model::load_as(&fixture_dir().join("config.json"), &fixture_dir().join("model.safetensors"), ty).unwrap();
        assert_eq!(stored.weight_bytes(), source.weight_bytes(), "{name}: bytes held");
        for p in reference.prompts().iter().take(4) {
            assert_eq!(bits(&all_logits(&stored, &p.ids)), bits(&all_logits(&source, &p.ids)), "{name} {}", p.key);
        }
    }
}

#[test]
fn the_weights_held_are_the_files_and_track_hf() {
    let reference = Reference::load();
    for (name, _) in TYPES {
        let stored = load(&gguf_fixture(name), None);
        // The same file widened to f32 (ggml's dequantization): the held weights are those values.
        let widened = load(&gguf_fixture(name), Some(WeightType::F32));
        for c in [0, 1, 17, 50256] {
            assert_eq!(bits(&stored.wte.column(c)), bits(&widened.wte.column(c)), "{name}: wte column {c}");
        }
        let (a, b) = (&stored.h[1].c_fc.weight, &widened.h[1].c_fc.weight);
        assert_eq!(bits(&a.unpack()), bits(&b.unpack()), "{name}: h.1.mlp.c_fc");
        // Held 4-bit types take under a fifth of f32's bytes, 5- and 8-bit ones under a third.
        let ratio = widened.weight_bytes() as f64 / stored.weight_bytes() as f64;
        assert!(ratio > if name.starts_with("q4") { 5.0 } else { 3.0 }, "{name}: {ratio}");
        let (worst, agree, n) = against_hf(&stored, &reference);
        let (worst_w, _, _) = against_hf(&widened, &reference);
        println!("{name} GGUF held as {name}: max |Δlogit| {worst:.3} against HF (widened to f32: {worst_w:.3}), top-1 agreement {agree}/{n}");
        // The 4- and 5-bit formats move this tiny random model's logits by themselves (the widened
        // weights with f32 activations do as much); the int8 activations add little to that.
        assert!(worst <= 1.25 * worst_w + 0.15 && agree * 2 >= n, "{name}: {worst} vs {worst_w}, {agree}/{n}");
    }
}

#[test]
fn dtype_converts_a_gguf_only_when_asked_and_says_so() {
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap();
    let m = gguf_fixture("q4_0").to_string_lossy().into_owned();
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::Deserializer::from_slice(&out.stdout).into_iter().next().unwrap().unwrap()
    };
    let out = run(&["generate", "-m", &m, "-n", "4", "--json", "Hello"]);
    assert_eq!(json(&out)["dtype"], "q4_0");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"), "no conversion, no note");
    let out = run(&["generate", "-m", &m, "-n", "4", "--json", "--dtype", "f32", "Hello"]);
    assert_eq!(json(&out)["dtype"], "f32");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds q4_0 weights; --dtype f32 converts them"), "{err}");
    let out = run(&["generate", "-m", &m, "-n", "4", "--json", "--dtype", "q8", "Hello"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--dtype q8 quantizes them again") && err.contains("no longer the file's"), "{err}");
    // An f32 file's weights were never quantized: not "again"; f16 from f32 is rounded, not widened.
    let f32_file = gguf_fixture("f32").to_string_lossy().into_owned();
    for (dtype, says) in [("q8", "--dtype q8 quantizes them: the weights"), ("f16", "--dtype f16 rounds them")] {
        let out = run(&["generate", "-m", &f32_file, "-n", "2", "--json", "--dtype", dtype, "Hello"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("holds f32 weights") && err.contains(says) && !err.contains("again"), "{err}");
    }
    let info = String::from_utf8_lossy(&run(&["info", "-m", &m]).stdout).into_owned();
    assert!(info.contains("q4_0") && info.contains("(as the file stores it; the default)"), "{info}");
}

/// A block whose scale is not a number is refused, naming the tensor, and the CLI says so without
/// a panic. (The fixture's last 18 bytes are the last Q4_0 block of `blk.1.ffn_up.weight`, the
/// tensor llama-quantize wrote last: its f16 scale comes first.)
#[test]
fn a_block_no_quantizer_writes_is_refused_with_its_tensor() {
    let mut bytes = std::fs::read(gguf_fixture("q4_0")).unwrap();
    let at = bytes.len() - 18;
    bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes()); // f16 NaN
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan-scale.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["generate", "-m", path.to_str().unwrap(), "x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("tensor `blk.1.ffn_up.weight`: a block's scale is NaN") && !err.contains("panicked"), "{err}");
}
