//! The inspection views against the reference: attention (also stitched from cached decode
//! steps), hidden states, K/V, top-k, the logit lens, exports, and the verify reports (the
//! attention drawings: tests/attention_views.rs and tests/viewer.rs).

mod common;

use common::*;
use kvgpt_core::{KvCache, Point, Recorder, Scratch};
use kvgpt_views::inspect::{trace, TraceSpec};
use serde_json::Value;
use std::process::{Command, Output};

const TOL: f32 = 1e-4;

fn kvgpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).env_remove("HF_HUB_OFFLINE").output().unwrap()
}

fn json_of(args: &[&str]) -> Value {
    let out = kvgpt(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    fn walk(v: &Value, out: &mut Vec<f32>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Number(n) => out.push(n.as_f64().unwrap() as f32),
            _ => panic!("not a number: {v}"),
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

/// The attention of `ids` computed by one cache-off forward over the whole sequence.
fn cache_off_attention(model: &kvgpt_core::Model, ids: &[u32], layer: usize) -> Vec<f32> {
    let cfg = &model.config;
    let mut rec = Recorder::only(|p| matches!(p, Point::AttnProbs(_)));
    let mut logits = vec![0.0; cfg.vocab_size];
    model.forward(ids, &mut KvCache::new(cfg), &mut Scratch::new(cfg, ids.len()), &mut rec, &mut logits).unwrap();
    rec.last(Point::AttnProbs(layer)).unwrap().data.clone()
}

#[test]
fn stitched_cache_on_attention_equals_the_cache_off_matrix() {
    let loaded = load_fixture();
    let reference = Reference::load();
    for p in reference.prompts().iter().take(4) {
        let spec =
            TraceSpec { generate: 12, want: |p| matches!(p, Point::AttnProbs(_)), all_logits: false, prefill: None };
        let tr = trace(&loaded.model, &p.ids, &spec).unwrap();
        assert_eq!(tr.ids[p.ids.len()..], p.greedy_ids[..12], "{}: the decode steps follow greedy", p.key);
        let (s, t) = (tr.len(), p.ids.len());
        for l in 0..2 {
            let (nh, stitched) = tr.attention(l).unwrap();
            let full = cache_off_attention(&loaded.model, &tr.ids, l);
            assert!(stitched == full, "{} layer {l}: stitched cache-on attention differs from cache-off", p.key);
            // The prompt block is the reference's attention.
            let (_, want) = reference.tensor(&format!("{}.attn.{l}", p.key)).unwrap();
            for h in 0..nh {
                for q in 0..t {
                    let got = &stitched[(h * s + q) * s..][..t];
                    assert_close("prompt attention", got, &want[(h * t + q) * t..][..t], TOL);
                }
            }
        }
    }
}

#[test]
fn attention_json_matches_the_reference_with_and_without_selection() {
    let reference = Reference::load();
    let m = model();
    let p = &reference.prompts()[1];
    let j = json_of(&["inspect", "attention", &p.text, "--model", &m, "--json"]);
    assert_eq!(j["tokens"].as_array().unwrap().len(), p.ids.len());
    for l in 0..2 {
        let (_, want) = reference.tensor(&format!("p1.attn.{l}")).unwrap();
        assert_close(&format!("attn.{l}"), &floats(&j["attention"][l]), &want, TOL);
    }
    let j = json_of(&["inspect", "attention", &p.text, "--model", &m, "--json", "--layer", "1", "--head", "2"]);
    let a = j["attention"].as_array().unwrap();
    assert_eq!((a.len(), a[0].as_array().unwrap().len()), (1, 1), "nesting kept: [layer][head][q][k]");
    let t = p.ids.len();
    let (_, want) = reference.tensor("p1.attn.1").unwrap();
    assert_close("layer 1 head 2", &floats(&a[0][0]), &want[2 * t * t..3 * t * t], TOL);
    // With --generate the matrix covers the decoded tokens too, and stays causal.
    let j = json_of(&["inspect", "attention", &p.text, "--model", &m, "--json", "--generate", "4", "--layer", "0"]);
    let s = t + 4;
    let mat = &j["attention"][0][0];
    assert_eq!(mat.as_array().unwrap().len(), s);
    for q in 0..s {
        let row = floats(&mat[q]);
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert!(row[q + 1..].iter().all(|&x| x == 0.0));
    }
    let ids: Vec<u32> = j["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    assert_eq!(ids[t..], p.greedy_ids[..4]);
}

#[test]
fn logits_top_k_and_the_logit_lens_match_the_reference() {
    let reference = Reference::load();
    let m = model();
    for p in reference.prompts() {
        let j = json_of(&["inspect", "logits", &p.text, "--model", &m, "--json", "--top-k", "5", "--lens"]);
        assert_eq!(j["position"], p.ids.len() - 1);
        let top = j["top"].as_array().unwrap();
        for (i, t) in top.iter().enumerate() {
            assert_eq!(t["id"], p.top5_ids[i], "{}", p.key);
            assert!((t["prob"].as_f64().unwrap() - p.top5_probs[i]).abs() < 1e-4, "{}", p.key);
            assert!((t["logit"].as_f64().unwrap() - p.top5_logits[i]).abs() < 1e-4, "{}", p.key);
        }
        let lens = j["lens"].as_array().unwrap();
        assert_eq!(lens.len(), 3, "embed + 2 layers");
        assert_eq!(lens[0]["layer"], "embed");
        let last = &lens[2]["top"];
        for (i, t) in last.as_array().unwrap().iter().enumerate() {
            assert_eq!(t["id"], p.top5_ids[i]);
            assert!((t["prob"].as_f64().unwrap() - p.top5_probs[i]).abs() < 1e-4);
        }
        let ent = j["entropy"].as_f64().unwrap();
        assert!(ent > 0.0 && ent < (50257f64).ln());
    }
    let p = &reference.prompts()[0];
    let all = json_of(&["inspect", "logits", &p.text, "--model", &m, "--json", "--all-positions", "--top-k", "3"]);
    let (_, want) = reference.tensor("p0.logits").unwrap();
    for (pos, view) in all.as_array().unwrap().iter().enumerate() {
        assert_eq!(view["position"], pos);
        let row = &want[pos * 50257..(pos + 1) * 50257];
        let best = kvgpt_core::sampler::argmax(row);
        assert_eq!(view["top"][0]["id"], best);
        assert!((view["top"][0]["logit"].as_f64().unwrap() - row[best as usize] as f64).abs() < 1e-4);
        // The prompt's actual next token: its probability and rank under HF's logits.
        match p.ids.get(pos + 1) {
            Some(&next) => {
                let target = row[next as usize];
                let z: f64 = row.iter().map(|&x| ((x - row[best as usize]) as f64).exp()).sum();
                let prob = ((target - row[best as usize]) as f64).exp() / z;
                assert_eq!(view["next"]["id"], next);
                assert!((view["next"]["prob"].as_f64().unwrap() - prob).abs() < 1e-6 + 1e-4 * prob, "{view}");
                let rank = 1 + row.iter().filter(|&&x| x > target).count();
                assert_eq!(view["next"]["rank"], rank);
            }
            None => assert!(view.get("next").is_none(), "no next token after the prompt's last"),
        }
    }
}

fn read_export(path: &std::path::Path, name: &str) -> (Vec<usize>, Vec<f32>) {
    kvgpt_core::export::read(path, Some(name)).unwrap()
}

#[test]
fn exports_hold_hidden_states_kv_attention_and_logits() {
    let reference = Reference::load();
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let p = &reference.prompts()[1];
    let t = p.ids.len();
    let f = dir.path().join("lens.safetensors");
    json_of(&["inspect", "logits", &p.text, "--model", &m, "--json", "--lens", "--export", f.to_str().unwrap()]);
    let (shape, hidden) = read_export(&f, "hidden");
    assert_eq!(shape, vec![3, t, 64]);
    let want = |n: &str| reference.tensor(&format!("p1.{n}")).unwrap().1;
    assert_close("hidden.0", &hidden[..t * 64], &want("hidden.0"), TOL);
    assert_close("hidden.1", &hidden[t * 64..2 * t * 64], &want("hidden.1"), TOL);
    assert_close("pre_lnf", &hidden[2 * t * 64..], &want("pre_lnf"), TOL);
    assert_close("logits", &read_export(&f, "logits").1, &want("logits"), TOL);

    let f = dir.path().join("kv.safetensors");
    json_of(&[
        "inspect",
        "cache",
        &p.text,
        "--model",
        &m,
        "--json",
        "--generate",
        "0",
        "--export",
        f.to_str().unwrap(),
    ]);
    let (shape, k) = read_export(&f, "k");
    assert_eq!(shape, vec![2, 4, t, 16]);
    let v = read_export(&f, "v").1;
    for l in 0..2 {
        let n = 4 * t * 16;
        assert_close("k", &k[l * n..(l + 1) * n], &want(&format!("k.{l}")), TOL);
        assert_close("v", &v[l * n..(l + 1) * n], &want(&format!("v.{l}")), TOL);
    }

    let f = dir.path().join("attn.npy");
    json_of(&["inspect", "attention", &p.text, "--model", &m, "--json", "--export", f.to_str().unwrap()]);
    let (shape, att) = kvgpt_core::export::read(&f, None).unwrap();
    assert_eq!(shape, vec![2, 4, t, t]);
    assert_close("attn.1 (npy)", &att[4 * t * t..], &want("attn.1"), TOL);

    let f = dir.path().join("emb.safetensors");
    let j = json_of(&[
        "inspect",
        "embeddings",
        &p.text,
        "--model",
        &m,
        "--json",
        "--dims",
        "4",
        "--export",
        f.to_str().unwrap(),
    ]);
    assert_close("embed", &read_export(&f, "embed").1, &want("hidden.0"), TOL);
    assert_close("sum[0][..4]", &floats(&j["positions"][0]["sum"]), &want("hidden.0")[..4], TOL);
}

#[test]
fn tokens_and_cache_views_report_real_values() {
    let m = model();
    let j = json_of(&["inspect", "tokens", "The cat 今天", "--model", &m, "--json"]);
    assert_eq!(j["ids"], serde_json::json!([464, 3797, 220, 20015, 232, 25465]));
    assert_eq!(j["partial_utf8"], serde_json::json!([false, false, false, true, true, false]));
    assert_eq!(j["tokens"][3], "\\xe4\\xbb");
    assert_eq!(j["offsets"][5], serde_json::json!([11, 14]));
    let j = json_of(&["inspect", "cache", "The cat sat on", "--model", &m, "--json", "--generate", "2"]);
    assert_eq!(j["steps"][0]["written"], serde_json::json!([0, 4]));
    assert_eq!(j["steps"][2]["kind"], "decode");
    assert_eq!(j["steps"][2]["cached_before"], 5);
    assert_eq!(j["steps"][2]["written"], serde_json::json!([5, 6]));
    assert_eq!(j["ids"][4], Reference::load().prompts()[0].greedy_ids[0]);
    assert_eq!(j["k"].as_array().unwrap().len(), 6);
    assert_eq!(j["v"][5].as_array().unwrap().len(), 16);
}

#[test]
fn verify_cache_reports_zero_divergence_and_catches_a_corrupted_cache() {
    let m = model();
    let j = json_of(&[
        "verify",
        "cache",
        "Hello, world! This is a test of the KV cache.",
        "--model",
        &m,
        "--steps",
        "30",
        "--json",
    ]);
    assert_eq!(j["steps"], 30);
    assert_eq!(j["max_abs_diff"], 0.0);
    assert_eq!(j["top1_agreement"], 1.0);
    assert_eq!(j["mean_kl"], 0.0);
    assert_eq!(j["first_divergent_step"], Value::Null);
    // A corrupted cache: one K value of layer 0 changed before decode step 3.
    let loaded = load_fixture();
    let ids = &Reference::load().prompts()[1].ids;
    let report = kvgpt_views::verify::cache_vs_recompute_tampered(&loaded.model, ids, 10, 0.0, &mut |cache, step| {
        if step == 3 {
            cache.nudge(0, kvgpt_core::KvPart::K, 0, 0, 5, 1.0);
        }
    })
    .unwrap();
    assert_eq!(report.first_divergent_step, Some(3));
    assert!(report.max_abs_diff > 1e-3 && !report.passes());
    assert!(report.mean_kl > 0.0);
}

#[test]
fn verify_reference_passes_on_golden_logits_and_fails_on_wrong_ones() {
    let m = model();
    let file = fixture_dir().join("reference.safetensors");
    let f = file.to_str().unwrap();
    let j = json_of(&[
        "verify",
        "reference",
        "The cat sat on",
        "--model",
        &m,
        "--logits",
        f,
        "--tensor",
        "p0.logits",
        "--json",
    ]);
    assert_eq!(j["steps"], 4);
    assert!(j["max_abs_diff"].as_f64().unwrap() < 1e-4);
    assert_eq!(j["pass"], true);
    // The last-row logits of another prompt: exit 1 with the report.
    let out =
        kvgpt(&["verify", "reference", "The cat sat on", "--model", &m, "--logits", f, "--tensor", "p2.last_logits"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than the tolerance"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let fail = text.lines().last().unwrap();
    assert!(fail.starts_with("FAIL: max |Δlogit| ") && fail.ends_with(" > tolerance 1.00e-4"), "{text}");
    // The golden logits in text: numbers as people read them and a PASS line.
    let out = kvgpt(&["verify", "reference", "The cat sat on", "--model", &m, "--logits", f, "--tensor", "p0.logits"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let diff = j["max_abs_diff"].as_f64().unwrap();
    assert!(text.contains(&format!("  max |Δlogit|         {diff:.2e}\n")), "{text}");
    assert!(text.ends_with(&format!("PASS: max |Δlogit| {diff:.2e} ≤ tolerance 1.00e-4\n")), "{text}");
    let out = kvgpt(&["verify", "cache", "The cat sat on", "--model", &m, "--steps", "3"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("max |Δlogit|         0 (the same bits)") && text.contains("PASS: max |Δlogit| 0 ≤ tolerance 0")
    );
    let out = kvgpt(&["verify", "reference", "The cat sat on", "--model", &m, "--logits", f]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tensor"));
}

#[test]
fn generate_logprobs_match_the_reference_distribution() {
    let reference = Reference::load();
    let p = &reference.prompts()[0];
    let j = json_of(&["generate", &p.text, "--model", &model(), "-n", "3", "--logprobs", "3", "--json"]);
    let lp = j["logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), 3);
    assert_eq!(lp[0]["id"], p.greedy_ids[0]);
    assert!((lp[0]["logprob"].as_f64().unwrap() - p.top5_probs[0].ln()).abs() < 1e-4);
    for (i, id) in p.top5_ids[..3].iter().enumerate() {
        assert_eq!(lp[0]["top"][i]["id"], *id);
    }
}

#[test]
fn explain_walks_through_with_real_numbers() {
    let out = kvgpt(&["explain", "The cat sat on", "--model", &model()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    let p = &Reference::load().prompts()[0];
    for needle in
        ["(1, 4)", "(1, 4, 64)", "(1, 4, 4, 16)", "(1, 4, 1, 5)", "(1, 1, 50257)", "\" male\"", "Cache length is now 5"]
    {
        assert!(text.contains(needle), "explain lacks {needle:?}:\n{text}");
    }
    assert!(text.contains(&format!("p = {:.4}", p.top5_probs[0])), "top-1 probability");
}

#[test]
fn bad_inspect_input_gets_clear_errors() {
    let m = model();
    let cases: &[(&[&str], &str)] = &[
        (&["inspect", "attention", "x", "--model", &m, "--layer", "9"], "--layer 9 is out of range"),
        (&["inspect", "attention", "x", "--model", &m, "--svg", "/no/such/dir/a.svg"], "does not exist"),
        (&["inspect", "logits", "x", "--model", &m, "--export", "out.txt"], ".safetensors"),
        (&["inspect", "logits", "a b", "--model", &m, "--position", "7"], "--position 7 is out of range"),
        (&["inspect", "attention", "x", "--model", &m, "--generate", "500"], "exceeds the model's 128 positions"),
        (
            &["inspect", "attention", "a b", "--model", &m, "--query", "2"],
            "--query 2 is out of range: the sequence has 2",
        ),
        (&["inspect", "attention", "a b", "--model", &m, "--query", "-3"], "--query -3 is out of range"),
        (&["verify", "reference", "x", "--model", &m, "--logits", "/no/file.npy"], "no such file"),
    ];
    for (args, msg) in cases {
        let out = kvgpt(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}
