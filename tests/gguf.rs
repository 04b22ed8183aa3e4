//! GGUF files written by llama.cpp's converter (scripts/fixtures/make_fixture_gguf.sh) from the fixture:
//! the F32 one gives the safetensors source's bits, the F16 one the bits of the source held as
//! f16, Q8_0 tracks HF; the tokenizer comes from the GGUF's metadata and gives HF's ids.

mod common;

use common::*;
use kvgpt_core::{Model, WeightType};
use std::process::Command;

fn load(path: &std::path::Path, ty: WeightType) -> kvgpt_core::Loaded {
    let files = kvgpt_core::Locate::from_env(true).resolve(path.to_str().unwrap()).unwrap();
    kvgpt_core::load_as(&files, ty).unwrap()
}

#[test]
fn f32_gguf_gives_the_safetensors_bits_and_hf_ids() {
    let st = load_fixture();
    let g = load(&gguf_fixture("f32"), WeightType::F32);
    assert_eq!(g.model.config, st.model.config, "the config from the GGUF metadata");
    assert_eq!(g.model.weights_dtype(), "f32");
    let reference = Reference::load();
    for p in reference.prompts() {
        assert_eq!(g.tokenizer.encode(&p.text).unwrap(), p.ids, "{}: the GGUF's tokenizer gives HF's ids", p.key);
        assert_eq!(bits(&all_logits(&g.model, &p.ids)), bits(&all_logits(&st.model, &p.ids)), "{}", p.key);
        assert_eq!(g.tokenizer.decode(&p.greedy_ids), p.greedy_text);
    }
    assert_eq!(kvgpt_core::prompt_file::fingerprint(&g.model), kvgpt_core::prompt_file::fingerprint(&st.model));
}

#[test]
fn f16_gguf_is_the_source_held_as_f16() {
    let st16 =
        Model::load_as(&fixture_dir().join("config.json"), &fixture_dir().join("model.safetensors"), WeightType::F16)
            .unwrap();
    let g = load(&gguf_fixture("f16"), WeightType::F32);
    assert_eq!(g.model.weights_dtype(), "f32");
    for p in Reference::load().prompts().iter().take(3) {
        // The converter rounds to f16 as kvgpt does (to nearest even); both then widen exactly.
        assert_eq!(bits(&all_logits(&g.model, &p.ids)), bits(&all_logits(&st16, &p.ids)), "{}", p.key);
    }
}

#[test]
fn q8_0_gguf_tracks_hf() {
    let g = load(&gguf_fixture("q8_0"), WeightType::F32);
    let reference = Reference::load();
    let (worst, agree, n) = against_hf(&g.model, &reference);
    println!("q8_0 GGUF: max |Δlogit| {worst:.3} against HF, top-1 agreement {agree}/{n}");
    assert!(worst < 0.5 && agree * 10 >= n * 9, "{worst} {agree}/{n}");
}

#[test]
fn the_cli_takes_a_gguf_as_model_and_refuses_broken_ones() {
    let reference = Reference::load();
    let p = &reference.prompts()[0];
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap();
    let m = gguf_fixture("f32").to_string_lossy().into_owned();
    let out = run(&["generate", "--model", &m, "-n", "10", "--ignore-eos", "--json", &p.text]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = j["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    assert_eq!(ids, p.greedy_ids[..10]);
    let out = run(&["info", "--model", &m]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 layers, 4 heads × 16 = 64 channels"));
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(gguf_fixture("q8_0")).unwrap();
    for (name, data, says) in [
        ("cut.gguf", bytes[..bytes.len() / 2].to_vec(), "lies beyond the end of the file"),
        ("head.gguf", bytes[..100].to_vec(), "the header ends too soon"),
        ("v9.gguf", [&bytes[..4], &9u32.to_le_bytes()[..], &bytes[8..]].concat(), "GGUF version 9"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        let out = run(&["generate", "--model", path.to_str().unwrap(), "x"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(1) && err.contains(says) && !err.contains("panicked"), "{name}: {err}");
    }
    let not = dir.path().join("notes.txt");
    std::fs::write(&not, "hello").unwrap();
    let err = String::from_utf8_lossy(&run(&["generate", "--model", not.to_str().unwrap(), "x"]).stderr).into_owned();
    assert!(err.contains("it is a file but not a GGUF"), "{err}");
}

/// A GGUF header written here by the format's own layout (magic, version 3, counts, string
/// metadata, tensor infos), independent of kvgpt's reader.
fn handmade_gguf(meta: &[(&str, &str)], tensors: &[(&str, &[u64], u32)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        s(&mut b, k);
        b.extend(8u32.to_le_bytes()); // GGUF_TYPE_STRING
        s(&mut b, v);
    }
    for (name, dims, ty) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(ty.to_le_bytes());
        b.extend(0u64.to_le_bytes());
    }
    b.resize(b.len().div_ceil(32) * 32 + 4096, 0);
    b
}

fn open_error(bytes: &[u8], name: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let files = kvgpt_core::Locate::from_env(true).resolve(path.to_str().unwrap()).unwrap();
    let err = kvgpt_core::load_as(&files, WeightType::F32).err().expect("refused").to_string();
    assert!(!err.contains("safetensors file"), "a GGUF is not called a safetensors file: {err}");
    err
}

/// GGUFs kvgpt cannot run are named as GGUFs, with their ggml type or architecture by name, and a
/// missing `x.gguf` is a missing file, not a Hub lookup.
#[test]
fn bad_ggufs_are_named_as_ggufs_with_their_type_and_architecture() {
    let whole = std::fs::read(gguf_fixture("q8_0")).unwrap();
    let e = open_error(&whole[..100], "cut-header.gguf");
    assert!(e.contains("not a valid GGUF file") && e.contains("ends too soon"), "{e}");
    let e = open_error(&whole[..3_000_000], "cut-data.gguf");
    assert!(e.contains("not a valid GGUF file") && e.contains("beyond the end of the file"), "{e}");
    let e = open_error(
        &handmade_gguf(&[("general.architecture", "gpt2")], &[("token_embd.weight", &[256, 4], 10)]),
        "k.gguf",
    );
    assert!(e.contains("`token_embd.weight` is Q2_K (ggml type 10)") && e.contains("Q4_K"), "{e}");
    let e = open_error(&handmade_gguf(&[("general.architecture", "llama")], &[]), "llama.gguf");
    assert!(e.contains("a `llama` model") && e.contains("GPT-2"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    for spec in [missing.to_str().unwrap(), "nope.gguf"] {
        match kvgpt_core::Locate::from_env(true).resolve(spec) {
            Err(kvgpt_core::Error::MissingFile { path, .. }) => assert_eq!(path, std::path::Path::new(spec)),
            other => panic!("{spec}: {:?}", other.err().map(|e| e.to_string())),
        }
    }
}
