//! `kvgpt bench` with llama-bench's habits: `-m`, lists for `-t`, defaults that fit the model,
//! no carriage returns in a log, and rows that name the model.

mod common;

use common::views::kvgpt;
use common::*;

#[test]
fn bench_defaults_fit_the_model_and_logs_get_no_carriage_returns() {
    // llama-bench's -m; the defaults (-p 4,128,512 -n 128) clipped to the fixture's 128 positions,
    // with a note; every position of the context usable; no progress line rewritten in a file.
    let m = model();
    let out = kvgpt(&["bench", "-m", &m, "-r", "1", "--probe-mib", "0", "--no-uncached", "-o", "json"]);
    let (json, err) = ok(&out);
    assert!(err.contains("the defaults (-p 4,128,512 -n 128) clipped to the model's 128 positions: -p 4 -n 124"));
    assert!(!err.contains('\r'), "{err:?}");
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    let tests: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp4", "tg124"]);
    // One repetition has no spread: the table says so instead of "0.0".
    let (md, _) = ok(&kvgpt(&["bench", "-m", &m, "-p", "4", "-n", "2", "-r", "1", "--probe-mib", "0"]));
    let row = md.lines().find(|l| l.contains("| pp4 |")).unwrap();
    assert_eq!(row.split('|').nth(10).unwrap().trim(), "–", "{row}");
    // llama-bench's columns: the model, its size as held, its parameters (derived here from
    // config.json: wte, wpe, ln_f, and per layer two LayerNorms, four matrices and their biases),
    // the backend and the threads.
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_dir().join("config.json")).unwrap()).unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap();
    let (c, l, v, p) = (n("n_embd"), n("n_layer"), n("vocab_size"), n("n_positions"));
    let params =
        v * c + p * c + 2 * c + l * (4 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * 4 * c + 4 * c) + (4 * c * c + c));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!([cells[1], cells[3], cells[4]], [m.as_str(), &format!("{:.2} M", params as f64 / 1e6), "CPU"]);
    // f32 weights as held: the parameters' bytes, give or take the panels' padding.
    let mib: f64 = cells[2].strip_suffix(" MiB").unwrap().parse().unwrap();
    let want = (4 * params) as f64 / 1048576.0;
    assert!(mib >= want - 0.01 && mib < want * 1.01, "{mib} MiB vs {want}");
    let (json, _) = ok(&kvgpt(&["bench", "-m", &m, "-p", "4", "-n", "2", "-r", "1", "--probe-mib", "0", "-o", "json"]));
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(rows[0]["model"], m.as_str());
    assert_eq!(rows[0]["model_params"].as_u64(), Some(params));
    assert_eq!(rows[0]["backend"], "CPU");
}

#[test]
fn a_list_of_thread_counts_runs_every_row_at_each() {
    let m = model();
    let args = ["bench", "-m", &m, "-p", "4", "-n", "2", "-r", "1", "--probe-mib", "0", "--no-uncached", "-t", "1,2"];
    let (json, _) = ok(&kvgpt(&[&args[..], &["-o", "json"]].concat()));
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    let seen: Vec<(String, u64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["test"].as_str().unwrap().to_string(), r["threads"].as_u64().unwrap()))
        .collect();
    let want = [("pp4", 1), ("tg2", 1), ("pp4", 2), ("tg2", 2)].map(|(t, n)| (t.to_string(), n));
    assert_eq!(seen, want);
    let (md, _) = ok(&kvgpt(&args));
    // One report, as llama-bench prints a list: one header naming the counts, one table of every row.
    assert_eq!(md.matches("kvgpt bench —").count(), 1, "{md}");
    assert!(md.contains("| threads 1, 2 |"), "{md}");
    let table: Vec<&str> =
        md.lines().skip_while(|l| !l.starts_with("| model")).take_while(|l| l.starts_with('|')).collect();
    let at = |n: &str| table.iter().filter(|l| l.contains(&format!("| CPU | {n} | "))).count();
    assert_eq!((at("1"), at("2"), table.len()), (2, 2, 6), "{md}");
    // Elsewhere -t takes one count.
    let out = kvgpt(&["generate", "x", "-m", &m, "-t", "1,2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("-t takes one thread count here"));
}

/// Rows of a JSON run: (test, prompt_tokens, n_depth).
fn rows_of(args: &[&str]) -> Vec<(String, u64, u64)> {
    let m = model();
    let base = ["bench", "-m", &m, "-r", "1", "--probe-mib", "0", "--no-uncached", "-o", "json"];
    let (json, _) = ok(&kvgpt(&[&base[..], args].concat()));
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    let u = |v: &serde_json::Value| v.as_u64().unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| (r["test"].as_str().unwrap().into(), u(&r["prompt_tokens"]), u(&r["n_depth"])))
        .collect()
}

#[test]
fn zero_skips_a_test_and_depths_are_named_as_llama_bench_names_them() {
    let own = |v: &[(&str, u64, u64)]| v.iter().map(|&(t, p, d)| (t.to_string(), p, d)).collect::<Vec<_>>();
    // -n 0: prefill rows only; -p 0: decode rows only (from the start of the context).
    assert_eq!(rows_of(&["-p", "8,16", "-n", "0"]), own(&[("pp8", 8, 0), ("pp16", 16, 0)]));
    assert_eq!(rows_of(&["-p", "0", "-n", "4"]), own(&[("tg4", 0, 0)]));
    // -p 0 alone: the default -n clipped to what follows the one token a decode row starts from.
    assert_eq!(rows_of(&["-p", "0"]), own(&[("tg127", 0, 0)]));
    // -d alone: the default prompts that fit after the depth.
    assert_eq!(rows_of(&["-d", "100", "-n", "4"]), own(&[("pp4 @ d100", 4, 100), ("tg4 @ d100", 100, 100)]));
    // -d: every prefill row after each depth, the decode rows at each depth, named `@ dN`.
    assert_eq!(
        rows_of(&["-p", "16", "-n", "4", "-d", "0,32"]),
        own(&[("pp16 @ d0", 16, 0), ("pp16 @ d32", 16, 32), ("tg4 @ d0", 0, 0), ("tg4 @ d32", 32, 32)])
    );
    // With depths no decode row follows the 4-token prompt: the time to the first token is
    // given without a count of decode steps.
    let m = model();
    let args = ["bench", "-m", &m, "-p", "4", "-n", "2", "-d", "0,8", "-r", "1", "--probe-mib", "0", "--no-uncached"];
    let (md, _) = ok(&kvgpt(&args));
    let line = md.lines().find(|l| l.starts_with("load to first token")).unwrap();
    assert!(line.ends_with(" ms") && !line.contains("decode steps"), "{line}");
    let out = kvgpt(&["bench", "-m", &m, "-p", "64", "-d", "100", "-n", "4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1) && err.contains("-d 100 with -p 64 does not fit the model's 128 positions"),
        "{err}"
    );
    assert!(err.contains("(with -d 100, -p at most 28)"), "{err}");
    let out = kvgpt(&["bench", "-m", &m, "-p", "0", "-n", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("-p 0 and -n 0 leave nothing to run"));
}

/// `-o json` rows carry llama-bench's keys beside kvgpt's, so a script written for
/// `llama-bench -o json` reads them: the model's size and parameters, the threads, the test's
/// prompt and generated tokens, the K/V type, and the timings in its units — tokens per second
/// (avg_ts, stddev_ts, samples_ts: one per repetition) and nanoseconds per run of the test.
#[test]
fn json_rows_carry_llama_benchs_keys() {
    let m = model();
    let args = ["bench", "-m", &m, "-p", "4", "-n", "2", "-r", "3", "--probe-mib", "0", "--no-uncached", "-o", "json"];
    let (json, _) = ok(&kvgpt(&args));
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    for r in rows.as_array().unwrap() {
        assert_eq!(
            (&r["model_filename"], &r["model_size"], &r["model_n_params"]),
            (&r["model"], &r["model_size_bytes"], &r["model_params"])
        );
        assert_eq!(
            (&r["n_threads"], &r["n_prompt"], &r["n_gen"]),
            (&r["threads"], &r["prompt_tokens"], &r["gen_tokens"])
        );
        assert_eq!((&r["type_k"], &r["type_v"]), (&r["kv_dtype"], &r["kv_dtype"]));
        let ts: Vec<f64> = r["samples_ts"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let ns: Vec<f64> = r["samples_ns"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(ts.len(), 3, "{r}");
        let mean = ts.iter().sum::<f64>() / 3.0;
        assert!((r["avg_ts"].as_f64().unwrap() - mean).abs() <= 1e-9 * mean, "{r}");
        let tokens = if r["n_gen"].as_u64().unwrap() > 0 {
            r["n_gen"].as_u64().unwrap()
        } else {
            r["n_prompt"].as_u64().unwrap()
        };
        for (t, n) in ts.iter().zip(&ns) {
            assert!(
                (n * t / 1e9 - tokens as f64).abs() < 1e-6 * tokens as f64,
                "{n} ns at {t} tok/s for {tokens} tokens"
            );
        }
    }
}
