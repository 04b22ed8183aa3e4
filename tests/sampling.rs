//! The sampling people expect: HF's repetition penalty against HF's `generate()`
//! (tests/fixtures/sampling_reference.json, from scripts/fixtures/make_sampling_reference.py), stop strings
//! against HF's greedy text, and what `--json` and the stats line report.

mod common;

use common::*;
use kvgpt_core::{generate, GenerateOptions, Sampling, Step};
use serde_json::Value;
use std::process::Command;

fn kvgpt(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn repetition_penalty_gives_hf_greedy_ids() {
    let loaded = load_fixture();
    for c in sampling_reference()["cases"].as_array().unwrap() {
        let theta = c["repetition_penalty"].as_f64().unwrap() as f32;
        let want = ids_of(&c["generated_ids"]);
        let opts = GenerateOptions {
            max_new_tokens: want.len(),
            sampling: Sampling { repetition_penalty: theta, ..Sampling::GREEDY },
            stop_at_eos: false,
            use_cache: true,
        };
        let g = generate(&loaded.model, &ids_of(&c["ids"]), &opts, &mut |_, _| Ok(Step::Go)).unwrap();
        assert_eq!(g.generated_ids, want, "{} θ={theta}", c["prompt"]);
    }
    // Through the CLI, with the other penalties' defaults.
    let c = &sampling_reference()["cases"][0];
    let p = Reference::load().prompts().into_iter().find(|p| p.key == c["prompt"]).unwrap();
    let m = fixture_dir().to_string_lossy().into_owned();
    let out = kvgpt(&[
        "generate",
        "--model",
        &m,
        "-n",
        "24",
        "--ignore-eos",
        "--repetition-penalty",
        "1.3",
        "--json",
        &p.text,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids_of(&j["generated_ids"]), ids_of(&c["generated_ids"]));
    assert_eq!(j["sampler"]["repetition_penalty"].as_f64().unwrap() as f32, 1.3);
    assert_eq!((j["sampler"]["mode"].as_str(), j["dtype"].as_str()), (Some("greedy"), Some("f32")));
    assert!(j["threads"].as_u64().unwrap() >= 1 && j["sampler"]["seed"] == 0);
}

#[test]
fn stop_strings_cut_hf_greedy_text_before_them() {
    let reference = Reference::load();
    let p = &reference.prompts()[0];
    let m = fixture_dir().to_string_lossy().into_owned();
    // A stop string from the middle of HF's greedy text: the output is the text before its first
    // occurrence (across token boundaries: the end of one token and the start of the next).
    let at = p.greedy_text.char_indices().nth(p.greedy_text.chars().count() / 2).unwrap().0;
    let stop: String = p.greedy_text[at..].chars().take(3).collect();
    let first = p.greedy_text.find(&stop).unwrap();
    let out =
        kvgpt(&["generate", "--model", &m, "-n", "40", "--stop", &stop, "--stop", "never seen §", "--json", &p.text]);
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["text"].as_str().unwrap(), &p.greedy_text[..first], "stop {stop:?}");
    assert_eq!(j["finish_reason"], "stop");
    assert!(j["generated_ids"].as_array().unwrap().len() < 40);
    // Streamed: the same text after the prompt, and the stats line says why it ended.
    let out = kvgpt(&["generate", "--model", &m, "-n", "40", "--stop", &stop, &p.text]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, format!("{}{}\n", p.text, &p.greedy_text[..first]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("| greedy |") && err.contains(" f32 ") && err.contains("finish: stop"), "{err}");
    // A stop string that never appears changes nothing.
    let out = kvgpt(&["generate", "--model", &m, "-n", "40", "--stop", "never seen §", "--json", &p.text]);
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["text"].as_str().unwrap(), p.greedy_text);
    assert_eq!(j["finish_reason"], "length");
}

#[test]
fn bad_sampling_flags_are_refused_and_temp_is_an_alias() {
    let m = fixture_dir().to_string_lossy().into_owned();
    for (args, says) in [
        (&["--repetition-penalty", "0"][..], "--repetition-penalty must be a number > 0"),
        (&["--presence-penalty", "3"], "--presence-penalty must be in [-2, 2]"),
        (&["--frequency-penalty", "-2.5"], "--frequency-penalty must be in [-2, 2]"),
        (&["--stop", ""], "--stop needs a non-empty string"),
    ] {
        let mut a = vec!["generate", "--model", &m, "x"];
        a.extend(args);
        let out = kvgpt(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(1) && err.contains(says), "{a:?}: {err}");
    }
    let run = |flag: &str| {
        let out = kvgpt(&["generate", "--model", &m, "-n", "6", flag, "0.9", "--seed", "4", "--json", "The cat"]);
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        (j["generated_ids"].clone(), j["sampler"]["temperature"].as_f64().unwrap() as f32)
    };
    assert_eq!(run("--temp"), run("--temperature"));
    assert_eq!(run("--temp").1, 0.9);
}
