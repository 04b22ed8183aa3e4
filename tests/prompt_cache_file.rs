//! `kvgpt generate --prompt-cache FILE`: a second run reuses the saved prefix and computes only
//! the rest, with the bits of a cold run (and HF's greedy text); another model's file, another
//! dtype's, a truncated or corrupt one are refused with a clear error; a failed write leaves
//! nothing behind; the file can never be one of the command's inputs.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn kvgpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap()
}

fn run_json(model: &str, prompt: &str, extra: &[&str]) -> (Value, String) {
    let mut args = vec!["generate", prompt, "--model", model, "-n", "16", "--ignore-eos", "--json", "--logprobs", "2"];
    args.extend_from_slice(extra);
    let out = kvgpt(&args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (serde_json::from_slice(&out.stdout).unwrap(), err)
}

fn error_of(args: &[&str]) -> String {
    let out = kvgpt(args);
    assert!(!out.status.success(), "expected a failure: {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What must not change: ids, text and the logprob bits.
fn answer(v: &Value) -> (Value, Value, Value) {
    (v["generated_ids"].clone(), v["text"].clone(), v["logprobs"].clone())
}

#[test]
fn a_saved_prompt_is_reused_with_the_bits_of_a_cold_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.kvc");
    let f = file.to_str().unwrap();
    let model = fixture_dir().display().to_string();
    let reference = Reference::load();
    let p = reference.prompts().into_iter().find(|p| p.key == "p1").unwrap();
    let sampled = ["--temperature", "0.9", "--top-k", "50", "--seed", "3"];
    let (cold, _) = run_json(&model, &p.text, &sampled);
    let (first, err) = run_json(&model, &p.text, &[&sampled[..], &["--prompt-cache", f]].concat());
    assert!(err.contains("reused 0 of 14 prompt tokens"), "{err}");
    assert!(file.exists());
    let (second, err) = run_json(&model, &p.text, &[&sampled[..], &["--prompt-cache", f]].concat());
    assert!(err.contains("reused 13 of 14 prompt tokens"), "{err}");
    assert_eq!(second["prompt_cache"]["reused_tokens"], 13);
    assert_eq!(answer(&first), answer(&cold));
    assert_eq!(answer(&second), answer(&cold), "from the file = cold");
    // A longer prompt that starts with the saved one reuses all of it; greedy, it gives HF's text.
    let longer = format!("{} And more.", p.text);
    let (cold_long, _) = run_json(&model, &longer, &[]);
    let (warm_long, err) = run_json(&model, &longer, &["--prompt-cache", f]);
    assert!(err.contains("reused 14 of"), "{err}");
    assert_eq!(answer(&warm_long), answer(&cold_long));
    let (warm_ref, err) = run_json(&model, &p.text, &["--prompt-cache", f]);
    assert!(err.contains("reused 13 of 14"), "{err}");
    assert_eq!(warm_ref["text"].as_str().unwrap(), &p.greedy_text[..warm_ref["text"].as_str().unwrap().len()]);
    assert_eq!(
        warm_ref["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>(),
        p.greedy_ids[..16]
    );
}

fn fresh_file(dir: &Path, model: &str) -> String {
    let file = dir.join("p.kvc");
    run_json(model, "The cat sat on", &["--prompt-cache", file.to_str().unwrap()]);
    file.to_str().unwrap().to_string()
}

#[test]
fn bad_prompt_cache_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture_dir().display().to_string();
    let f = fresh_file(dir.path(), &model);
    let gen = |file: &str, extra: &[&str]| {
        let mut a = vec!["generate", "The cat sat on", "--model", &model, "-n", "2", "--prompt-cache", file];
        a.extend_from_slice(extra);
        error_of(&a)
    };
    // Another dtype: the K/V differ.
    let e = gen(&f, &["--dtype", "f16"]);
    assert!(e.contains("made with f32 weights") && e.contains("f16"), "{e}");
    // A corrupt byte in the middle, and a truncated file.
    let bytes = std::fs::read(&f).unwrap();
    let mut bad = bytes.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    std::fs::write(&f, &bad).unwrap();
    assert!(gen(&f, &[]).contains("checksum does not match"));
    std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    assert!(gen(&f, &[]).contains("checksum does not match"));
    std::fs::write(&f, b"hello").unwrap();
    assert!(gen(&f, &[]).contains("not a usable prompt cache file"));
    // Another model: the fixture with one wpe value changed.
    let other = tempfile::tempdir().unwrap();
    copy_side_files(other.path());
    let mut weights = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&weights).unwrap();
    let name = st.names().into_iter().find(|n| n.ends_with("wpe.weight")).unwrap();
    let off = st.tensor(name).unwrap().data().as_ptr() as usize - weights.as_ptr() as usize;
    weights[off + 1] ^= 1;
    std::fs::write(other.path().join("model.safetensors"), &weights).unwrap();
    std::fs::remove_file(&f).unwrap();
    let f = fresh_file(dir.path(), &model);
    let e = error_of(&["generate", "x", "--model", other.path().to_str().unwrap(), "--prompt-cache", &f]);
    assert!(e.contains("made by another model"), "{e}");
    // The file is never one of the inputs, and a failed write leaves nothing.
    let weights_path = fixture_dir().join("model.safetensors");
    let before = std::fs::metadata(&weights_path).unwrap().len();
    let e = gen(weights_path.to_str().unwrap(), &[]);
    assert!(e.contains("is the model's weights") && e.contains("which this run reads"), "{e}");
    assert_eq!(std::fs::metadata(&weights_path).unwrap().len(), before);
    let missing = dir.path().join("no/such/dir/p.kvc");
    let e = gen(missing.to_str().unwrap(), &[]);
    assert!(e.contains("no/such/dir"), "{e}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 1, "only the cache file: {left:?}");
}
