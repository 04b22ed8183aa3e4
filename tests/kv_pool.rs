//! One K/V pool under pressure (issue #34): eight sequences that together need far more blocks
//! than the pool has are preempted and recomputed, and every answer is the bits of `generate()`
//! alone (the single-sequence path the HF tests check); cancelled ones included, every block
//! goes back to the pool; the gauges are the pool's own accounting; a request that could never
//! fit is refused naming --kv-mb.

mod common;

use common::*;
use kvgpt_core::engine::{self, block_on, CancelReason, EngineConfig, Event, Events, Gauges, Monitor, Request};
use kvgpt_core::{generate, GenerateOptions, Model, Sampling};
use std::sync::{Arc, Mutex};

/// Keeps the gauges of the engine's last step.
struct Last(Arc<Mutex<Gauges>>);
impl Monitor for Last {
    fn step(&mut self, g: &Gauges) {
        *self.0.lock().unwrap() = *g;
    }
}

/// The pool's block: the default (`--kv-block-size`).
const BLOCK: usize = kvgpt_core::kv_cache::DEFAULT_BLOCK;
/// The tiny model's K/V of one block: 16 positions × 2 layers × (K, V) × 64 floats × 4 bytes.
const BLOCK_BYTES: usize = BLOCK * 2 * 2 * 64 * 4;

fn config(blocks: usize) -> EngineConfig {
    EngineConfig {
        parallel: 8,
        batch_tokens: 64,
        cache_bytes: 16 << 20,
        max_queue: 64,
        draft: None,
        kv_events: false,
        kv_bytes: Some(blocks * BLOCK_BYTES),
    }
}

fn request(prompt: &[u32], max_new: usize, sampling: Sampling) -> Request {
    Request {
        prompt: prompt.to_vec(),
        max_new_tokens: max_new,
        sampling,
        stop_at_eos: false,
        logprobs: None,
        speculative: false,
    }
}

fn ids(rx: Events) -> Vec<u32> {
    let mut out = vec![];
    for e in rx {
        match e {
            Event::Token { id, .. } => out.push(id),
            Event::Done { .. } => break,
            Event::Error(e) => panic!("engine error: {e}"),
            Event::Started { .. } => {}
        }
    }
    out
}

#[test]
fn preempted_answers_are_solo_bits_and_every_block_comes_back() {
    let loaded = load_fixture();
    let model = Arc::new(Model::load(&loaded.files.config, &loaded.files.weights).unwrap());
    let sampled = Sampling { temperature: 0.9, top_k: Some(50), seed: 7, ..Sampling::GREEDY };
    // Eight prompts sharing a 20-token prefix, each asking 90 tokens: 7 blocks each, 56 in all,
    // against a pool of 16.
    let prompt = |i: u32| -> Vec<u32> { (0..20).map(|t| 100 + t).chain((0..3).map(|t| 500 + 10 * i + t)).collect() };
    let cases: Vec<(Vec<u32>, Sampling)> = (0..8)
        .map(|i| (prompt(i), if i % 2 == 0 { Sampling::GREEDY } else { Sampling { seed: 7 + i as u64, ..sampled } }))
        .collect();
    let alone: Vec<Vec<u32>> = cases
        .iter()
        .map(|(p, s)| {
            let opts = GenerateOptions { max_new_tokens: 90, sampling: *s, stop_at_eos: false, use_cache: true };
            generate(&model, p, &opts, &mut |_, _| Ok(kvgpt_core::Step::Go)).unwrap().generated_ids
        })
        .collect();
    let last = Arc::new(Mutex::new(Gauges::default()));
    let s = engine::spawn(model.clone(), config(16), Box::new(Last(last.clone())), None).unwrap();
    let rxs: Vec<Events> = cases.iter().map(|(p, smp)| s.handle.submit(request(p, 90, *smp)).unwrap()).collect();
    // Two more that are cancelled while they run or wait: their blocks must come back too.
    let cancelled: Vec<Events> =
        (8..10).map(|i| s.handle.submit(request(&prompt(i), 90, Sampling::GREEDY)).unwrap()).collect();
    for rx in &cancelled {
        s.handle.cancel(rx.id, CancelReason::Client);
    }
    for (i, (rx, want)) in rxs.into_iter().zip(&alone).enumerate() {
        assert_eq!(&ids(rx), want, "sequence {i}: preempted and recomputed = alone, bit for bit");
    }
    let g = *last.lock().unwrap();
    assert!(g.preemptions > 0, "a pool of 16 blocks for 56 forced preemptions: {g:?}");
    assert_eq!(g.pool_blocks, 16);
    assert!(g.pool_used <= 16);
    // Everything finished: only the prompt cache holds blocks; emptied, the pool is whole again.
    block_on(s.handle.flush_cache()).unwrap();
    s.handle.drain();
    s.thread.join().unwrap();
    let g = *last.lock().unwrap();
    assert_eq!((g.running, g.waiting, g.cache_tokens), (0, 0, 0));
    assert_eq!(g.pool_used, 0, "every block's count went back to zero: {g:?}");
}

#[test]
fn a_request_the_whole_pool_cannot_hold_is_refused_naming_kv_mb() {
    let loaded = load_fixture();
    let model = Arc::new(Model::load(&loaded.files.config, &loaded.files.weights).unwrap());
    let s = engine::spawn(model, config(4), Box::new(engine::NoMonitor), None).unwrap();
    let err = s.handle.submit(request(&[1, 2, 3], 100, Sampling::GREEDY)).err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("--kv-mb") && msg.contains("102 positions") && msg.contains("4 blocks"), "{msg}");
    // One that fits runs.
    let fits = s.handle.submit(request(&[1, 2, 3], 40, Sampling::GREEDY)).unwrap();
    assert_eq!(ids(fits).len(), 40);
}

#[test]
fn serve_refuses_a_pool_that_holds_no_block_and_a_size_that_is_not_one() {
    let model = fixture_dir();
    let model = model.to_str().unwrap();
    for (mb, want) in [
        ("0.001", "the K/V pool holds no block of 16384 bytes: give --kv-mb at least 0.02"),
        ("-3", "'-3' is not a size in megabytes"),
        ("0", "'0' is not a size in megabytes"),
        ("abc", "'abc' is not a size in megabytes"),
    ] {
        let out = kvgpt_within(&["serve", "--model", model, "--port", "0", "--kv-mb", mb], &[], "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "--kv-mb {mb}: {err}");
    }
}

/// `--kv-block-size` on the commands that decode: HF's greedy ids and the same surprisal bits
/// for blocks of 1, 3 and 16 positions and one block of the whole context (128).
#[test]
fn every_block_size_gives_hf_greedy_ids_and_the_same_surprisal_bits() {
    let (reference, m) = (Reference::load(), model());
    let prompts = reference.prompts();
    let long = prompts.iter().filter(|p| p.loss.is_some()).max_by_key(|p| p.ids.len()).unwrap();
    let mut surprisals = Vec::new();
    for block in ["1", "3", "16", "128"] {
        for p in &prompts {
            let n = p.greedy_ids.len().to_string();
            let args =
                ["generate", &p.text, "--model", &m, "-n", &n, "--ignore-eos", "--json", "--kv-block-size", block];
            let (out, _) = ok(&kvgpt_within(&args, &[], ""));
            let j: serde_json::Value = serde_json::from_str(&out).unwrap();
            let ids: Vec<u32> =
                j["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            assert_eq!(ids, p.greedy_ids, "{} with blocks of {block}", p.key);
        }
        let (out, _) =
            ok(&kvgpt_within(&["score", "--model", &m, "--json", "--kv-block-size", block, &long.text], &[], ""));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        let loss = j["mean_loss"].as_f64().unwrap();
        assert!(
            (loss - long.loss.unwrap()).abs() <= 1e-4,
            "blocks of {block}: loss {loss} vs HF {}",
            long.loss.unwrap()
        );
        let bits: Vec<u64> =
            j["tokens"].as_array().unwrap().iter().map(|t| t["surprisal"].as_f64().unwrap().to_bits()).collect();
        assert_eq!(bits.len(), long.ids.len() - 1);
        surprisals.push(bits);
    }
    assert!(surprisals.windows(2).all(|w| w[0] == w[1]), "every block size gives the same bits");
    for bad in ["0", "4097"] {
        let out = kvgpt_within(&["generate", "Hi", "--model", &m, "--kv-block-size", bad], &[], "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("a block holds 1 to 4096 positions"), "{bad}: {err}");
    }
}
