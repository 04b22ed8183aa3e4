//! `generate --json`'s timings account for the run: the parts (loading the model and the draft,
//! prefill, decode with its drafting, and the rest) add up to its `wall_ms`, and that is the wall
//! time a caller measures around the process, within 5%, or within 15 ms, what starting and
//! ending a process takes outside any clock inside it (5–11 ms on the 2-core VMs). On e3c743f the
//! parts covered 84% of a plain run and 43% of one with `--draft self:w8a8`, whose quantized copy
//! of the model was made outside every timing.

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
        // The closest of three: a run's own time is what is measured, not the machine's hiccups.
        let gap = |(doc, outside): &(serde_json::Value, f64)| outside - doc["timings"]["wall_ms"].as_f64().unwrap();
        let runs: Vec<(serde_json::Value, f64)> = (0..3).map(|_| timed(args)).collect();
        let (doc, outside) = runs.into_iter().min_by(|a, b| gap(a).total_cmp(&gap(b))).unwrap();
        let t = &doc["timings"];
        let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("timings.{k} in {t}"));
        let parts = ["load_ms", "draft_load_ms", "prefill_ms", "decode_ms", "other_ms"].map(f);
        let wall = f("wall_ms");
        assert!((parts.iter().sum::<f64>() - wall).abs() < 0.01, "{t}");
        // Drafting is inside prefill (the draft reads the prompt, drafts the first tokens) and
        // decode.
        assert!(parts.iter().all(|&p| p >= 0.0) && f("draft_ms") <= f("prefill_ms") + f("decode_ms"), "{t}");
        let covered = wall / outside;
        println!(
            "{}: wall_ms {wall:.1} of {outside:.1} ms measured around the process ({:.1}%)",
            args.len(),
            100.0 * covered
        );
        let close = covered >= 0.95 || outside - wall <= 15.0;
        assert!(close && wall <= outside, "{:?}: wall_ms {wall:.1} against {outside:.1} ms: {t}", args);
    }
}
