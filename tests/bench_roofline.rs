//! `kvgpt bench --roofline`: each of the model's matrix shapes (read from config.json here) at the
//! asked row counts, with its FLOPs and bytes as the shapes imply and its roof as the measured
//! peaks and bandwidth give it. (Speed itself is shown by the tool, never asserted.)

mod common;

use common::*;
use std::process::Command;

fn kvgpt(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap()
}

#[test]
fn every_matrix_at_every_row_count_against_its_roof() {
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("config.json")).unwrap()).unwrap();
    let (c, v) = (cfg["n_embd"].as_u64().unwrap() as usize, cfg["vocab_size"].as_u64().unwrap() as usize);
    let m = model();
    for (dtype, bytes_per) in [("f32", 4.0), ("w8a8", 1.0)] {
        let args = ["bench", "--roofline", "-m", &m, "-t", "1", "--batch", "1,3", "-r", "1", "--probe-mib", "64"];
        let out = kvgpt(&[&args[..], &["--dtype", dtype, "-o", "json"]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let roof = &doc["roof"];
        let (peak, int_peak, bw, probe) =
            ["peak_gflops", "peak_int_gops", "read_gb_s", "probe_gb_s"].map(|k| roof[k].as_f64().unwrap()).into();
        assert!(peak > 0.0 && int_peak > 0.0 && probe > 0.0 && bw >= probe, "{roof}");
        let rows = doc["rows"].as_array().unwrap();
        // The memory roof: the probe's, or the fastest stream of weights if one was faster.
        let fastest = rows.iter().map(|r| r["weight_gb_s"].as_f64().unwrap()).fold(probe, f64::max);
        assert!((bw / fastest - 1.0).abs() < 1e-9, "{roof}");
        let shapes = [(c, 3 * c), (c, c), (c, 4 * c), (4 * c, c), (c, v)];
        assert_eq!(rows.len(), shapes.len() * 2);
        for (row, &(k, n)) in rows.iter().zip(shapes.iter().flat_map(|s| [s, s])) {
            let f = |key: &str| row[key].as_f64().unwrap();
            assert_eq!((row["k"].as_u64(), row["n"].as_u64()), (Some(k as u64), Some(n as u64)), "{row}");
            let t = row["rows"].as_u64().unwrap() as f64;
            let flops = 2.0 * t * (k * n) as f64;
            assert!((f("gflops") * f("ms") * 1e6 / flops - 1.0).abs() < 1e-9, "{row}");
            // The weights as held: the shape's values, padded to whole panels of 16 columns,
            // plus W8A8's scales (an f32 per 32 values).
            let bytes = f("weight_gb_s") * f("ms") * 1e6;
            let least = (k * n) as f64 * bytes_per;
            assert!(bytes >= least * 0.999 && bytes < least * 1.3 + 4096.0, "{dtype} {row}: {bytes} bytes");
            let compute = if dtype == "f32" { peak } else { int_peak };
            let want = (bytes / bw / 1e6).max(flops / compute / 1e6);
            assert!((f("roof_ms") / want - 1.0).abs() < 1e-6 && (f("of_roof") - want / f("ms")).abs() < 1e-6, "{row}");
        }
    }
    let err = |args: &[&str]| String::from_utf8_lossy(&kvgpt(args).stderr).into_owned();
    assert!(err(&["bench", "--roofline", "-m", &m, "-t", "1,2"]).contains("--roofline runs at one thread count"));
    assert!(err(&["bench", "--roofline", "-m", &m, "--probe-mib", "0"]).contains("needs the read-bandwidth probe"));
    for flag in [&["-p", "16"][..], &["--draft", "lookup"], &["--temperature", "0.7"]] {
        let e = err(&[&["bench", "--roofline", "-m", &m][..], flag].concat());
        assert!(e.contains("--roofline times matrices, not prefill and decode rows"), "{flag:?}: {e}");
    }
    assert!(err(&["bench", "--roofline", "-m", &m, "-o", "csv"]).contains("-o md or -o json, not csv"));
}
