//! A prompt cache (and, with the block stores to come, any stored K/V) is keyed by the model's
//! fingerprint: every byte of every weight as held, the held types, the config's numbers and the
//! K/V layout. A file from a model that differs in any of them is refused — never reused for
//! other K/V than this model computes (on e3c743f the fingerprint sampled the weights and missed
//! the matrices: a merged LoRA, another quantization, another GGUF of the same source reused it).

mod common;

use common::*;
use kvgpt_core::{prompt_file, KvCache, Model, Scratch, WeightType};
use proptest::prelude::*;
use std::path::Path;

/// The fixture's ids run through `model`, saved as a prompt cache file's bytes.
fn saved_by(model: &Model, dir: &Path) -> Vec<u8> {
    let ids = [464u32, 3797, 3332, 319];
    let cfg = &model.config;
    let (mut cache, mut scratch) = (KvCache::new(cfg), Scratch::new(cfg, ids.len()));
    let mut logits = vec![0.0; cfg.vocab_size];
    model.run(&ids, &mut cache, &mut scratch, &mut logits).unwrap();
    let file = dir.join("saved.kvc");
    prompt_file::save(&file, model, &ids, &cache).unwrap();
    std::fs::read(file).unwrap()
}

/// A tensor's name and the range of the file's bytes that hold its values.
type Tensor = (String, std::ops::Range<usize>);

/// The fixture's model.safetensors, and its tensors.
fn fixture_tensors() -> (Vec<u8>, Vec<Tensor>) {
    let bytes = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut tensors: Vec<Tensor> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let o = &v["data_offsets"];
            (k.clone(), 8 + n + o[0].as_u64().unwrap() as usize..8 + n + o[1].as_u64().unwrap() as usize)
        })
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    (bytes, tensors)
}

/// A copy of the fixture with the f32 at `at` of tensor `t` moved to its next representable value.
fn nudged(dir: &Path, t: usize, at: usize) -> Model {
    let (mut bytes, tensors) = fixture_tensors();
    let (_, range) = &tensors[t % tensors.len()];
    let i = range.start + 4 * (at % (range.len() / 4));
    let x = u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
    let next = if f32::from_bits(x) == f32::MAX { x - 1 } else { x + 1 };
    bytes[i..i + 4].copy_from_slice(&next.to_le_bytes());
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(fixture_dir().join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    Model::load(&dir.join("config.json"), &dir.join("model.safetensors")).unwrap()
}

/// The type in "safetensors as q8_0" or "the q8_0 GGUF".
fn type_of(name: &str) -> Option<&str> {
    name.strip_prefix("safetensors as ").or_else(|| name.strip_prefix("the ")?.strip_suffix(" GGUF"))
}

fn refused_by(model: &Model, saved: &[u8]) -> bool {
    prompt_file::parse(saved, model, Path::new("saved.kvc")).is_err()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_file_from_a_model_one_weight_apart_is_refused(t in 0usize..64, at in any::<usize>()) {
        let dir = tempfile::tempdir().unwrap();
        let fixture = Model::load(&fixture_dir().join("config.json"), &fixture_dir().join("model.safetensors")).unwrap();
        let saved = saved_by(&fixture, dir.path());
        prop_assert!(!refused_by(&fixture, &saved), "its own file is reused");
        let other = nudged(dir.path(), t, at);
        prop_assert_ne!(other.fingerprint(), fixture.fingerprint());
        prop_assert!(refused_by(&other, &saved), "a file from a model one weight apart must be refused");
        prop_assert!(refused_by(&fixture, &saved_by(&other, dir.path())));
    }
}

/// A merged LoRA: every value of one matrix scaled by 1.5.
#[test]
fn a_file_from_a_model_with_a_scaled_matrix_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bytes, tensors) = fixture_tensors();
    let (_, range) = tensors.iter().find(|(k, _)| k.ends_with("h.0.attn.c_attn.weight")).unwrap().clone();
    for i in range.step_by(4) {
        let x = f32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()) * 1.5;
        bytes[i..i + 4].copy_from_slice(&x.to_le_bytes());
    }
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(fixture_dir().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let lora = Model::load(&dir.path().join("config.json"), &dir.path().join("model.safetensors")).unwrap();
    let fixture = Model::load(&fixture_dir().join("config.json"), &fixture_dir().join("model.safetensors")).unwrap();
    assert!(refused_by(&fixture, &saved_by(&lora, dir.path())));
    assert!(refused_by(&lora, &saved_by(&fixture, dir.path())));
}

/// Every way the fixture can be held (its safetensors at every --dtype, llama.cpp's GGUFs of it)
/// has a fingerprint of its own but for a GGUF and the safetensors held as its type, which hold
/// the same bits (and compute the same logits, checked); a file from one is refused by every
/// model of another key.
#[test]
fn every_held_type_and_gguf_has_its_own_key() {
    let dir = tempfile::tempdir().unwrap();
    let (config, weights) = (fixture_dir().join("config.json"), fixture_dir().join("model.safetensors"));
    let mut held: Vec<(String, Model)> = WeightType::ALL
        .iter()
        .map(|&ty| (format!("safetensors as {}", ty.name()), Model::load_as(&config, &weights, ty).unwrap()))
        .collect();
    for name in ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"] {
        let file = gguf_fixture(name);
        held.push((format!("the {name} GGUF"), Model::load_holding(&file, &file, None).unwrap()));
    }
    let same = |a: &str, b: &str| {
        // Each fixture GGUF (the converter's, or `llama-quantize --pure`'s) holds the bits the
        // safetensors hold as its type (tests/gguf.rs, tests/gguf_quants.rs): the same key.
        a.starts_with("safetensors") != b.starts_with("safetensors") && type_of(a) == type_of(b)
    };
    let files: Vec<Vec<u8>> = held.iter().map(|(_, m)| saved_by(m, dir.path())).collect();
    for (i, (a, ma)) in held.iter().enumerate() {
        for (_, (b, mb)) in held.iter().enumerate().filter(|&(j, _)| j != i) {
            let equal = ma.fingerprint() == mb.fingerprint();
            assert_eq!(equal, same(a, b), "{a} and {b}: fingerprints equal is {equal}");
            if equal {
                let bits =
                    |m: &Model| all_logits(m, &[464, 3797, 3332, 319]).iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(ma), bits(mb), "{a} and {b} share a key, so they compute the same bits");
            }
            assert_eq!(refused_by(mb, &files[i]), !same(a, b), "a file of {a} loaded by {b}");
        }
    }
}

/// `--draft self:w8a8` converts the target's f32 matrices instead of reading the file again: the
/// copy must be the model loading the file as W8A8 gives, every byte (the same fingerprint), and
/// a target not held in f32 (its values no longer the file's) is not converted.
#[test]
fn a_self_draft_converted_in_memory_is_the_model_loaded_as_its_type() {
    let dir = fixture_dir();
    let (config, weights) = (dir.join("config.json"), dir.join("model.safetensors"));
    let target = Model::load(&config, &weights).unwrap();
    for ty in [WeightType::W8A8, WeightType::Q8] {
        let loaded = Model::load_as(&config, &weights, ty).unwrap();
        let converted = target.held_as(ty).unwrap();
        assert_eq!(converted.fingerprint(), loaded.fingerprint(), "{}", ty.name());
        assert_eq!(converted.dtype, loaded.dtype);
    }
    let held_f16 = Model::load_as(&config, &weights, WeightType::F16).unwrap();
    assert!(held_f16.held_as(WeightType::W8A8).is_none());
}
