//! `generate --json`'s timings account for the run: the parts (loading the model and the draft,
//! prefill, decode with its drafting, and the rest) add up to its `wall_ms`, and that is the wall
//! time a caller measures around the process, within 5% (the rest is starting and ending a
//! process). On e3c743f the parts covered 84% of a plain run and 43% of one with `--draft
//! self:w8a8`, whose quantized copy of the model was made outside every timing.

mod common;

use common::*;
use std::process::Command;
use std::time::Instant;

fn timed(args: &[&str]) -> (serde_json::Value, f64) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap();
    let outside = t.elapsed().as_secs_f64() * 1e3;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_slice(&out.stdout).unwrap(), outside)
}

#[test]
fn the_timings_add_up_to_the_wall_time() {
    let m = model();
    let plain = ["generate", "-m", &m, "-n", "120", "--ignore-eos", "--json", "-t", "1", "Hello"];
    let draft = [&plain[..], &["--draft", "self:w8a8"]].concat();
    for args in [&plain[..], &draft[..]] {
        // The best of three: a run's own time is what is measured, not the machine's hiccups.
        let runs: Vec<(serde_json::Value, f64)> = (0..3).map(|_| timed(args)).collect();
        let (doc, outside) = runs.into_iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
        let t = &doc["timings"];
        let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("timings.{k} in {t}"));
        let parts = ["load_ms", "draft_load_ms", "prefill_ms", "decode_ms", "other_ms"].map(f);
        let wall = f("wall_ms");
        assert!((parts.iter().sum::<f64>() - wall).abs() < 0.01, "{t}");
        assert!(parts.iter().all(|&p| p >= 0.0) && f("draft_ms") <= f("decode_ms"), "{t}");
        let covered = wall / outside;
        println!(
            "{}: wall_ms {wall:.1} of {outside:.1} ms measured around the process ({:.1}%)",
            args.len(),
            100.0 * covered
        );
        assert!((0.95..=1.0).contains(&covered), "{:?}: wall_ms {wall:.1} against {outside:.1} ms: {t}", args);
    }
}
