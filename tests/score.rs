//! `kvgpt score` against Hugging Face: the loss of `labels=ids` (whole texts), the sliding-window
//! loss of HF's perplexity guide (tests/fixtures/score_reference.json, written by
//! scripts/fixtures/make_score_reference.py), and each token's surprisal and rank from HF's logits.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;

const TOL: f64 = 1e-4;

fn score_reference() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/score_reference.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn the_loss_is_hf_labels_loss() {
    let loaded = load_fixture();
    let n = loaded.model.config.n_positions;
    let mut checked = 0;
    for p in Reference::load().prompts() {
        let Some(want) = p.loss else { continue };
        let s = kvgpt_views::score::score(&loaded.model, &p.ids, n, n / 2).unwrap();
        println!("{}: loss {} (HF {want}), perplexity {}", p.key, s.mean_loss, s.perplexity);
        assert!((s.mean_loss - want).abs() <= TOL, "{}: loss {} vs HF {want}", p.key, s.mean_loss);
        assert_eq!(s.tokens.len(), p.ids.len() - 1);
        assert!((s.perplexity - want.exp()).abs() <= TOL * want.exp());
        checked += 1;
    }
    assert_eq!(checked, 2, "the fixture's p1 and p2 carry a loss");
}

#[test]
fn sliding_windows_give_hf_perplexity_guide_loss() {
    let loaded = load_fixture();
    for c in score_reference()["cases"].as_array().unwrap() {
        let ids: Vec<u32> = c["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let (window, stride) = (c["window"].as_u64().unwrap() as usize, c["stride"].as_u64().unwrap() as usize);
        let s = kvgpt_views::score::score(&loaded.model, &ids, window, stride).unwrap();
        let want = c["loss"].as_f64().unwrap();
        assert!((s.mean_loss - want).abs() <= TOL, "window {window} stride {stride}: {} vs HF {want}", s.mean_loss);
        assert_eq!(s.tokens.len() as u64, c["tokens_scored"].as_u64().unwrap(), "window {window} stride {stride}");
    }
}

#[test]
fn each_token_matches_hf_logits() {
    let loaded = load_fixture();
    let reference = Reference::load();
    let v = loaded.model.config.vocab_size;
    for key in ["p1", "p3"] {
        let ids = reference.input_ids(key);
        let (_, logits) = reference.tensor(&format!("{key}.logits")).unwrap();
        let s = kvgpt_views::score::score(&loaded.model, &ids, 128, 64).unwrap();
        for t in &s.tokens {
            let row: Vec<f64> = logits[(t.position - 1) * v..t.position * v].iter().map(|&x| x as f64).collect();
            let max = row.iter().cloned().fold(f64::MIN, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            let target = row[t.id as usize];
            assert!((t.surprisal - (lse - target)).abs() <= TOL, "{key} position {}: surprisal", t.position);
            // The rank within HF's logits, allowing for logits within the tolerance of the target's.
            let above = |d: f64| 1 + row.iter().filter(|&&x| x > target + d).count();
            assert!((above(1e-4)..=above(-1e-4)).contains(&t.rank), "{key} position {}: rank {}", t.position, t.rank);
            assert_eq!(t.id, ids[t.position]);
            assert!((t.prob - (-t.surprisal).exp()).abs() < 1e-12);
        }
    }
}

fn kvgpt(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap()
}

#[test]
fn the_cli_prints_it_as_text_and_json() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let reference = Reference::load();
    let p1 = reference.prompts().into_iter().find(|p| p.key == "p1").unwrap();
    let out = kvgpt(&["score", "--model", &m, "--json", &p1.text]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!((j["mean_loss"].as_f64().unwrap() - p1.loss.unwrap()).abs() <= TOL, "{j}");
    assert_eq!(j["tokens_scored"], 13);
    assert_eq!(j["tokens"][0]["token"], ",");
    let out = kvgpt(&["score", "--model", &m, "--window", "5", "--stride", "2", &p1.text]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("window 5, stride 2"), "{text}");
    let last = text.lines().last().unwrap();
    let want = score_reference()["cases"].as_array().unwrap().iter().find(|c| c["prompt"] == "p1").unwrap()["loss"]
        .as_f64()
        .unwrap();
    assert!(last.starts_with(&format!("mean loss {want:.4} nats/token | perplexity")), "{last}");
    for (args, says) in [
        (vec!["--window", "1"], "invalid value '1'"),
        (vec!["--window", "500"], "it must hold 2 to 128"),
        (vec!["--window", "8", "--stride", "9"], "a stride of 9"),
        (vec!["--stride", "0"], "invalid value '0'"),
    ] {
        let mut a = vec!["score", "--model", &m];
        a.extend(args);
        a.push("Hello there");
        let out = kvgpt(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{a:?}: {err}");
    }
    let out = kvgpt(&["score", "--model", &m, "Hello"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 2 are needed"));
}
