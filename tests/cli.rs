//! The `kvgpt` binary as a user runs it, against the reference.

mod common;

use common::*;
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn kvgpt(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(args)
        .env_remove("HF_HUB_OFFLINE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

#[test]
fn generate_streams_the_reference_continuation() {
    let reference = Reference::load();
    for (p, raw) in reference.prompts().iter().zip(reference.json["prompts"].as_array().unwrap()) {
        let n = p.greedy_ids.len().to_string();
        let (out, err) = ok(&kvgpt(&["generate", &p.text, "--model", &model(), "-n", &n, "--ignore-eos"], None));
        assert_eq!(out, format!("{}\n", raw["greedy"]["full_text"].as_str().unwrap()), "{}", p.key);
        assert!(err.contains("prefill") && err.contains("ms/token") && err.contains("load"), "{err}");
    }
}

#[test]
fn every_instruction_set_generates_the_reference_text_and_a_missing_one_is_refused() {
    let reference = Reference::load();
    let (p, raw) = (&reference.prompts()[0], &reference.json["prompts"][0]);
    let n = p.greedy_ids.len().to_string();
    for isa in kvgpt_kernels::Isa::available() {
        let args = ["generate", &p.text, "--model", &model(), "-n", &n, "--ignore-eos", "--isa", isa.name()];
        let (out, _) = ok(&kvgpt(&args, None));
        assert_eq!(out, format!("{}\n", raw["greedy"]["full_text"].as_str().unwrap()), "{}", isa.name());
    }
    let out = kvgpt(&["generate", "x", "--model", &model(), "--isa", "sse9"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--isa \"sse9\": this CPU offers scalar"), "{err}");
}

#[test]
fn generate_json_has_the_documented_fields_and_reference_ids() {
    let reference = Reference::load();
    let p = &reference.prompts()[0];
    let m = model();
    for extra in [&[][..], &["--no-cache"][..]] {
        let mut args = vec!["generate", "The cat sat on", "--model", &m, "-n", "40", "--json", "--ignore-eos"];
        args.extend_from_slice(extra);
        let (out, _) = ok(&kvgpt(&args, None));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        let ids: Vec<u32> = j["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, p.greedy_ids);
        assert_eq!(j["text"], p.greedy_text.as_str());
        assert_eq!(j["prompt"], "The cat sat on");
        assert_eq!(j["prompt_ids"], serde_json::json!([464, 3797, 3332, 319]));
        assert_eq!(j["finish_reason"], "length");
        assert!(j["model"].as_str().unwrap().contains("tiny-gpt2"));
        for k in ["load_ms", "prefill_ms", "decode_ms", "decode_tokens_per_s"] {
            assert!(j["timings"][k].as_f64().unwrap() >= 0.0, "{k}");
        }
    }
}

#[test]
fn generate_counts_choosing_each_token_in_its_timings() {
    // Issue #17 item 8: a step is its forward pass and choosing its token, so the prefill and
    // decode figures include sampling (greedy's argmax too), which is also reported alone.
    let m = model();
    for sampler in [&[][..], &["--temperature", "1"][..], &["--temperature", "0.8", "--top-p", "0.9", "--top-k", "40"]]
    {
        let mut args = vec!["generate", "The cat sat on", "--model", &m, "-n", "12", "--json", "--ignore-eos"];
        args.extend_from_slice(sampler);
        let (out, err) = ok(&kvgpt(&args, None));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        let t = &j["timings"];
        let ms = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("timings.{k} in {t}"));
        assert_eq!(t["sample_tokens"], 12, "{t}");
        assert_eq!(t["decode_steps"], 11, "{t}");
        assert!(ms("sample_ms") > 0.0, "{t}");
        assert!(ms("sample_ms") <= ms("prefill_ms") + ms("decode_ms"), "sampling is inside prefill and decode: {t}");
        assert!((ms("sample_ms_per_token") - ms("sample_ms") / 12.0).abs() < 1e-9, "{t}");
        assert!(err.contains(" ms/token (") && err.contains("| sampling "), "{err}");
    }
}

#[test]
fn prompts_come_from_stdin_files_or_nothing() {
    let reference = Reference::load();
    let p = &reference.prompts()[1];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, format!("{}\n", p.text)).unwrap();
    let m = model();
    let runs = [
        kvgpt(&["generate", "--model", &m, "-n", "3", "--json"], Some(&format!("{}\n", p.text))),
        kvgpt(&["generate", "-", "--model", &m, "-n", "3", "--json"], Some(&p.text)),
        kvgpt(&["generate", "--prompt-file", file.to_str().unwrap(), "--model", &m, "-n", "3", "--json"], None),
    ];
    for out in &runs {
        let j: serde_json::Value = serde_json::from_str(&ok(out).0).unwrap();
        let ids: Vec<u32> = j["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, p.ids);
        assert_eq!(j["generated_ids"][0], p.greedy_ids[0]);
    }
    // An empty prompt starts from <|endoftext|>.
    let (out, _) = ok(&kvgpt(&["generate", "", "--model", &m, "-n", "2", "--json"], None));
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["prompt_ids"], serde_json::json!([50256]));
}

#[test]
fn sampling_is_reproducible_and_seed_dependent() {
    let m = model();
    let run = |seed: &str| {
        let args = [
            "generate",
            "Hello",
            "--model",
            &m,
            "-n",
            "20",
            "--temperature",
            "1.5",
            "--top-k",
            "100",
            "--top-p",
            "0.95",
            "--seed",
            seed,
            "--json",
            "--ignore-eos",
        ];
        let j: serde_json::Value = serde_json::from_str(&ok(&kvgpt(&args, None)).0).unwrap();
        j["generated_ids"].clone()
    };
    assert_eq!(run("7"), run("7"));
    assert_ne!(run("7"), run("8"));
    // --top-k 1 is greedy whatever the seed.
    let args = ["generate", "The cat sat on", "--model", &m, "-n", "10", "--top-k", "1", "--seed", "5", "--json"];
    let j: serde_json::Value = serde_json::from_str(&ok(&kvgpt(&args, None)).0).unwrap();
    let ids: Vec<u32> = j["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    assert_eq!(ids, Reference::load().prompts()[0].greedy_ids[..10]);
}

#[test]
fn tokenize_prints_ids_and_pieces() {
    let (out, _) = ok(&kvgpt(&["tokenize", "The cat sat on", "--model", &model(), "--json"], None));
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["ids"], serde_json::json!([464, 3797, 3332, 319]));
    assert_eq!(j["tokens"], serde_json::json!(["The", " cat", " sat", " on"]));
    let (out, _) = ok(&kvgpt(&["tokenize", "The cat", "--model", &model()], None));
    assert!(out.contains("3797") && out.contains("\" cat\""), "{out}");
}

#[test]
fn bad_input_gets_a_clear_error_and_a_failing_exit() {
    let m = model();
    let cases: &[(&[&str], &str)] = &[
        (&["generate", "x", "--model", &m, "-n", "200"], "exceeds the model's 128 positions"),
        (&["generate", "x", "--model", &m, "--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (&["generate", "x", "--model", &m, "--temperature", "-1"], "--temperature must be"),
        (&["generate", "x", "--model", "/no/such/folder"], "not found"),
        (&["generate", "--prompt-file", "/no/such/file", "--model", &m], "could not read the prompt file"),
        (&["generate", "x", "--model", "distilbert/distilgpt2", "--offline"], "not in the local Hugging Face cache"),
        // The library says what is wrong; the CLI adds what to do in its own flags.
        (
            &["generate", "x", "--model", &m, "-n", "200"],
            "hint: shorten the prompt or lower --max-new-tokens to at most 128",
        ),
        (
            &["inspect", "attention", "x", "--model", &m, "--generate", "200"],
            "hint: shorten the prompt or lower --generate",
        ),
        (&["generate", "x", "--model", "/no/such/folder"], "hint: pass a local folder with --model"),
        (&["generate", "x", "--model", "distilbert/distilgpt2", "--offline"], "hint: run once without --offline"),
        // Without the Hub, the hint names the bundled model (relative: the tests run in the
        // source folder), a folder that every command accepts.
        (
            &["generate", "x", "--model", "distilbert/distilgpt2", "--offline"],
            "to try every command now, use the small bundled model: --model tests/fixtures/tiny-gpt2 (random",
        ),
    ];
    for (args, msg) in cases {
        let out = kvgpt(args, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Flags clap rejects exit with 2 and a usage message.
    for args in [&["generate", "x", "-n", "0"][..], &["generate", "x", "--top-k", "0"], &["generate", "--bogus"]] {
        let out = kvgpt(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn bench_times_sampled_decoding_beside_greedy() {
    // Issue #17 item 8: with a sampler, every cached decode row has a sampled twin whose steps
    // include sampling, interleaved with it, and the table of their ratio.
    let m = model();
    let base = ["bench", "--model", &m, "-p", "4,8", "-n", "3", "-r", "2", "--probe-mib", "0", "--no-uncached"];
    let mut args = base.to_vec();
    args.extend(["--temperature", "1", "--top-p", "0.9", "-o", "json"]);
    let (js, _) = ok(&kvgpt(&args, None));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&js).unwrap();
    let modes: Vec<(&str, u64, &str)> = rows
        .iter()
        .filter(|r| r["gen_tokens"] == 3)
        .map(|r| (r["mode"].as_str().unwrap(), r["prompt_tokens"].as_u64().unwrap(), r["sampler"].as_str().unwrap()))
        .collect();
    let sampler = "sampled T=1 seed=0 top-p=0.9";
    assert_eq!(
        modes,
        [("cached", 4, "greedy"), ("sampled", 4, sampler), ("cached", 8, "greedy"), ("sampled", 8, sampler)]
    );
    assert!(rows
        .iter()
        .filter(|r| r["mode"] == "sampled")
        .all(|r| r["reps"] == 2 && r["p50_ms"].as_f64().unwrap() > 0.0));
    let mut args = base.to_vec();
    args.extend(["--top-k", "40"]);
    let (md, _) = ok(&kvgpt(&args, None));
    assert!(md.contains("| tg3 | 4 | sampled |"), "{md}");
    assert!(md.contains("| decode | context (prompt) | greedy ms/token | sampled ms/token (sampled T=1 seed=0 top-k=40) | × greedy |"), "{md}");
    let (md, _) = ok(&kvgpt(&base, None));
    assert!(!md.contains("| sampled |") && !md.contains("× greedy"), "no sampled rows without a sampler: {md}");
}

#[test]
fn bench_reports_every_row_in_every_format() {
    let m = model();
    let (out, err) = ok(&kvgpt(
        &["bench", "--model", &m, "-p", "4,8", "-n", "3", "-r", "2", "--probe-mib", "1", "-o", "json"],
        None,
    ));
    assert!(err.contains("runs"), "progress on stderr: {err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let key = |r: &serde_json::Value| {
        (
            r["test"].as_str().unwrap().to_string(),
            r["mode"].as_str().unwrap().to_string(),
            r["prompt_tokens"].as_u64().unwrap(),
        )
    };
    let keys: Vec<_> = rows.iter().map(key).collect();
    for want in [
        ("pp4", "cached", 4),
        ("pp8", "cached", 8),
        ("tg3", "cached", 4),
        ("tg3", "uncached", 4),
        ("tg3", "cached", 8),
        ("tg3", "uncached", 8),
    ] {
        assert!(keys.contains(&(want.0.to_string(), want.1.to_string(), want.2)), "{want:?} missing from {keys:?}");
    }
    for r in &rows {
        assert_eq!(r["dtype"], "f32");
        assert_eq!(r["reps"], 2);
        for k in ["tok_s_avg", "tok_s_sd", "p50_ms", "p90_ms", "p99_ms", "peak_rss_mb"] {
            assert!(r[k].as_f64().unwrap() >= 0.0, "{k} in {r}");
        }
        assert!(r["threads"].as_u64().unwrap() >= 1 && r["git"].is_string() && r["cpu_features"].is_array());
    }
    let (md, _) = ok(&kvgpt(&["bench", "--model", &m, "-p", "4", "-n", "2", "-r", "1", "--probe-mib", "1"], None));
    assert!(md.contains("A decode step is timed from choosing its token"), "{md}");
    assert!(md.contains("| decode | context (prompt) | cached tok/s | uncached tok/s | speedup |"), "{md}");
    assert!(md.contains("load to first token (4-token prompt): ") && md.contains(" decode steps of "), "{md}");
    // Batched rows: B sequences per forward, B·N tokens per repetition, and their ratio table.
    let (md, _) = ok(&kvgpt(
        &[
            "bench",
            "--model",
            &m,
            "-p",
            "4",
            "-n",
            "3",
            "-r",
            "1",
            "--probe-mib",
            "0",
            "--no-uncached",
            "--batch",
            "1,4",
        ],
        None,
    ));
    assert!(md.contains("| tg3x4 | 4 | batched |"), "{md}");
    assert!(md.contains("| batched decode | context (prompt) | sequences |"), "{md}");
    let (js, _) = ok(&kvgpt(
        &["bench", "--model", &m, "-p", "4", "-n", "3", "-r", "1", "--probe-mib", "0", "--batch", "3", "-o", "json"],
        None,
    ));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&js).unwrap();
    let b = rows.iter().find(|r| r["mode"] == "batched").expect("a batched row");
    assert_eq!((b["test"].as_str(), b["batch"].as_u64(), b["gen_tokens"].as_u64()), (Some("tg3x3"), Some(3), Some(3)));
    let err = String::from_utf8_lossy(&kvgpt(&["bench", "--model", &m, "--batch", "0"], None).stderr).into_owned();
    assert!(err.contains("--batch takes batch sizes from 1 to 256"), "{err}");
    let (csv, _) = ok(&kvgpt(
        &[
            "bench",
            "--model",
            &m,
            "-p",
            "4",
            "-n",
            "2",
            "-r",
            "1",
            "--probe-mib",
            "0",
            "--no-uncached",
            "--dtype",
            "q8",
            "-o",
            "csv",
        ],
        None,
    ));
    let mut lines = csv.lines();
    assert!(lines.next().unwrap().starts_with("test,mode,prompt_tokens,gen_tokens,dtype"));
    assert_eq!(lines.filter(|l| l.contains(",q8,")).count(), 2);
    // W8A8 through the CLI: cached and uncached decoding give the same bits with int8
    // activations too.
    let (out, _) = ok(&kvgpt(&["verify", "cache", "--model", &m, "--dtype", "w8a8", "--json", "Hello there"], None));
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(j["pass"] == true && j["max_abs_diff"] == 0.0 && j["steps"] == 20, "{j}");
    let out = kvgpt(&["bench", "--model", &m, "-p", "100", "-n", "100"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-p 100 with -n 100 does not fit the model's 128 positions: lower -p or -n"), "{err}");
    assert!(err.contains("(with -p 100, -n at most 28)"), "{err}");
}

#[test]
fn generate_with_a_draft_gives_the_reference_text_and_reports_the_drafts() {
    let reference = Reference::load();
    let m = model();
    for (p, raw) in reference.prompts().iter().zip(reference.json["prompts"].as_array().unwrap()) {
        let n = p.greedy_ids.len().to_string();
        for draft in
            [&["--draft", "lookup"][..], &["--draft", "self:w8a8"], &["--draft", "self:q8"], &["--draft-model", &m]]
        {
            // Drafting does not pay on this tiny model: --draft-min has it draft anyway.
            let mut args = vec!["generate", &p.text, "--model", &m, "-n", &n, "--ignore-eos", "--draft-min", "2"];
            args.extend_from_slice(draft);
            let (out, err) = ok(&kvgpt(&args, None));
            assert_eq!(out, format!("{}\n", raw["greedy"]["full_text"].as_str().unwrap()), "{} {draft:?}", p.key);
            assert!(err.contains(&format!("[kvgpt] draft {}: accepted ", draft[1])), "{err}");
            args.push("--json");
            let (out, _) = ok(&kvgpt(&args, None));
            let j: serde_json::Value = serde_json::from_str(&out).unwrap();
            let ids: Vec<u32> =
                j["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            assert_eq!(ids, p.greedy_ids, "{} {draft:?}", p.key);
            let s = &j["speculative"];
            assert_eq!(s["draft"], draft[1]);
            let (drafted, accepted) = (s["drafted_tokens"].as_u64().unwrap(), s["accepted_tokens"].as_u64().unwrap());
            assert!(accepted <= drafted && (drafted > 0 || p.greedy_ids.len() < 3), "{s}");
            // Every forward call makes one token, and each accepted draft one more.
            assert_eq!(j["timings"]["forwards"].as_u64().unwrap() + accepted, p.greedy_ids.len() as u64, "{j}");
        }
    }
    for (args, want) in [
        (&["--draft", "self:f64"][..], "--draft \"self:f64\": the kinds are lookup, self:w8a8 and self:q8"),
        (&["--draft", "lookup", "--no-cache"], "--draft needs the KV cache"),
        (&["--draft-model", "/nonexistent/model"], "/nonexistent/model"),
        (&["--draft", "lookup", "--draft-min", "17"], "--draft-min 17 is more than --draft-max 16"),
    ] {
        let mut a = vec!["generate", "x", "--model", &m];
        a.extend_from_slice(args);
        let out = kvgpt(&a, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(want), "{want} in {err}");
    }
}
