//! Shared test helpers: the tiny-gpt2 fixture and its Hugging Face reference outputs.
#![allow(dead_code)]

pub mod browser;
pub mod chat_session;
pub mod gguf_edit;
pub mod hub_server;
pub mod random_model;
pub mod redis;
pub mod server;
pub mod views;

use kvgpt_core::{hub, Loaded};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::path::PathBuf;

pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gpt2")
}

/// The fixture folder as a `--model` argument.
pub fn model() -> String {
    fixture_dir().display().to_string()
}

/// The output of a `kvgpt` run that must succeed: (stdout, stderr).
pub fn ok(out: &std::process::Output) -> (String, String) {
    let (o, e) = (String::from_utf8(out.stdout.clone()).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "kvgpt failed: {e}");
    (o, e)
}

pub fn load_fixture() -> Loaded {
    kvgpt_core::load(&hub::local_folder(&fixture_dir()).expect("fixture folder")).expect("fixture loads")
}

/// reference.json and reference.safetensors.
pub struct Reference {
    pub json: Value,
    bytes: Vec<u8>,
}

pub struct RefPrompt {
    pub key: String,
    pub text: String,
    pub ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_text: String,
    pub top5_ids: Vec<u32>,
    pub top5_probs: Vec<f64>,
    pub top5_logits: Vec<f64>,
    pub loss: Option<f64>,
}

impl Reference {
    pub fn load() -> Reference {
        let dir = fixture_dir();
        let json: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
        let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
        Reference { json, bytes }
    }

    pub fn prompts(&self) -> Vec<RefPrompt> {
        let ids =
            |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
        let f64s = |v: &Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
        self.json["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| RefPrompt {
                key: p["key"].as_str().unwrap().into(),
                text: p["text"].as_str().unwrap().into(),
                ids: ids(&p["input_ids"]),
                greedy_ids: ids(&p["greedy"]["ids"]),
                greedy_text: p["greedy"]["text"].as_str().unwrap().into(),
                top5_ids: ids(&p["top5_next"]["ids"]),
                top5_probs: f64s(&p["top5_next"]["probs"]),
                top5_logits: f64s(&p["top5_next"]["logits"]),
                loss: p.get("loss").and_then(|l| l.as_f64()),
            })
            .collect()
    }

    /// An f32 tensor: (shape, data); None if absent.
    pub fn tensor(&self, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).ok()?;
        assert_eq!(t.dtype(), Dtype::F32, "{name}");
        let data = t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        Some((t.shape().to_vec(), data))
    }

    pub fn input_ids(&self, key: &str) -> Vec<u32> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(&format!("{key}.input_ids")).unwrap();
        assert_eq!(t.dtype(), Dtype::I64);
        t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect()
    }
}

/// tests/fixtures/sampling_reference.json: Hugging Face's greedy ids with repetition penalties
/// (`cases`) and a chat's turns (`chat`).
pub fn sampling_reference() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sampling_reference.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The fixture's GGUF of type `t` (`tests/fixtures/gguf/tiny-gpt2-{t}.gguf`).
pub fn gguf_fixture(t: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/gguf/tiny-gpt2-{t}.gguf"))
}

/// The logits at every position of `ids`, in one forward pass from an empty cache (held as the
/// model's `--kv-dtype` says).
pub fn all_logits(model: &kvgpt_core::Model, ids: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache(model.config.n_positions);
    let mut scratch = kvgpt_core::Scratch::new(&model.config, ids.len());
    let mut logits = vec![0.0; ids.len() * model.config.vocab_size];
    model.forward(ids, &mut cache, &mut scratch, &mut kvgpt_core::NoTap, &mut logits).unwrap();
    logits
}

/// The bit patterns of `x`, for assertions of bit equality.
pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|f| f.to_bits()).collect()
}

/// `model` against every Hugging Face logits tensor the reference ships: the largest |Δlogit|,
/// and how many positions' argmax agree out of how many.
pub fn against_hf(model: &kvgpt_core::Model, reference: &Reference) -> (f32, usize, usize) {
    let v = model.config.vocab_size;
    let (mut worst, mut agree, mut n) = (0.0f32, 0, 0);
    for p in reference.prompts() {
        if let Some((_, want)) = reference.tensor(&format!("{}.logits", p.key)) {
            let got = all_logits(model, &p.ids);
            worst = worst.max(max_abs_diff(&got, &want));
            for (x, y) in got.chunks_exact(v).zip(want.chunks_exact(v)) {
                agree += usize::from(kvgpt_core::sampler::argmax(x) == kvgpt_core::sampler::argmax(y));
                n += 1;
            }
        }
    }
    (worst, agree, n)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Asserts |a - b| <= tol everywhere and returns the max difference.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    let d = max_abs_diff(got, want);
    assert!(d <= tol, "{what}: max |Δ| = {d:e} > {tol:e}");
    d
}

/// Copies the fixture's tokenizer and config files into `dir` (for variant checkpoints).
pub fn copy_side_files(dir: &std::path::Path) {
    for f in ["config.json", "tokenizer.json", "vocab.json", "merges.txt"] {
        std::fs::copy(fixture_dir().join(f), dir.join(f)).unwrap();
    }
}

/// `kvgpt args` with `env` set and `input` on stdin, as it ends; fails the test if it runs past
/// 60 s (a hang).
pub fn kvgpt_within(args: &[&str], env: &[(&str, &str)], input: &str) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("kvgpt {args:?} hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
