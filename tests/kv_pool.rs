//! One K/V pool under pressure (issue #34): eight sequences that together need far more blocks
//! than the pool has are preempted and recomputed, and every answer is the bits of `generate()`
//! alone (the single-sequence path the HF tests check); cancelled ones included, every block
//! goes back to the pool; the gauges are the pool's own accounting; a request that could never
//! fit is refused naming --kv-mb.

mod common;

use common::*;
use kvgpt_core::engine::{self, block_on, CancelReason, EngineConfig, Event, Events, Gauges, Monitor, Request};
use kvgpt_core::kv_cache::Pool;
use kvgpt_core::{generate, GenerateOptions, KvCache, KvSpec, KvType, Model, Sampling};
use proptest::prelude::*;
use std::sync::{Arc, Mutex, OnceLock};

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
        store: None,
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
        ("-3", "'-3' is not a size in MiB"),
        ("0", "'0' is not a size in MiB"),
        ("abc", "'abc' is not a size in MiB"),
        // 858 TiB: more than a process's address space, refused before anything is served.
        ("900000000", "could not be allocated: give a smaller --kv-mb"),
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

/// What a client does next in the property test below.
#[derive(Clone, Debug)]
enum Op {
    /// `n` choices of one prompt: shared prefix `prefix` (of 3, 0..20 tokens) and its own tail.
    Submit { prefix: usize, tail: Vec<u32>, max_new: usize, n: usize, seed: Option<u64> },
    /// Cancels the `i`-th request submitted so far (modulo), finished or not.
    Cancel(usize),
    /// Drops the `i`-th request's event stream (the client leaves).
    Leave(usize),
    /// Reads the `i`-th request's answers to the end.
    Wait(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let submit = (0..3usize, prop::collection::vec(1..50_000u32, 1..6), 1..30usize, 1..4usize, any::<Option<u64>>())
        .prop_map(|(prefix, tail, max_new, n, seed)| Op::Submit { prefix, tail, max_new, n, seed });
    prop_oneof![4 => submit, 1 => any::<usize>().prop_map(Op::Cancel), 1 => any::<usize>().prop_map(Op::Leave),
        2 => any::<usize>().prop_map(Op::Wait)]
}

/// Checks on every step that the gauges are the pool's own accounting.
struct Audit {
    pool: Arc<OnceLock<Pool>>,
    wrong: Arc<Mutex<Vec<String>>>,
    last: Arc<Mutex<Gauges>>,
}
impl Monitor for Audit {
    fn step(&mut self, g: &Gauges) {
        *self.last.lock().unwrap() = *g;
        let Some(pool) = self.pool.get() else { return };
        let mut wrong = self.wrong.lock().unwrap();
        if g.pool_used != pool.used_blocks() || g.pool_blocks != pool.total_blocks() {
            wrong.push(format!("gauges {g:?} against the pool's {} of {}", pool.used_blocks(), pool.total_blocks()));
        }
        if g.pool_peak != pool.peak_blocks() {
            wrong.push(format!("peak gauge {} against the pool's {}", g.pool_peak, pool.peak_blocks()));
        }
        if g.blocks_shared > g.pool_used || g.pool_used > g.pool_peak || g.pool_peak > g.pool_blocks {
            wrong.push(format!("impossible counts {g:?}"));
        }
    }
}

/// One submitted request: its choices' streams, what each asked, and whether it was cancelled.
struct Sent {
    rxs: Vec<Option<Events>>,
    asks: Vec<(Vec<u32>, usize, Sampling)>,
    cancelled: bool,
}

/// Reads one stream to its end: the tokens, and whether it ended by cancellation.
fn read(rx: Events) -> Vec<u32> {
    rx.filter_map(|e| match e {
        Event::Token { id, .. } => Some(id),
        Event::Error(e) => panic!("engine error: {e}"),
        _ => None,
    })
    .collect()
}

fn solo(model: &Model, (prompt, max_new, sampling): &(Vec<u32>, usize, Sampling)) -> Vec<u32> {
    let opts = GenerateOptions { max_new_tokens: *max_new, sampling: *sampling, stop_at_eos: false, use_cache: true };
    generate(model, prompt, &opts, &mut |_, _| Ok(kvgpt_core::Step::Go)).unwrap().generated_ids
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]
    /// Random submits (with `n` choices sharing a prompt), cancels, departures and reads over
    /// pools of 64–256 positions in blocks of 1, 3 or 16, K/V held as each `--kv-dtype`: every
    /// finished answer is `generate()` alone's bits (with that type, in blocks of 16) and a
    /// cancelled one a prefix of them, the gauges equal the pool's accounting
    /// on every step, and once everything ended and the prompt cache is flushed every block is
    /// back (every reference count went to zero).
    #[test]
    fn random_clients_leave_every_block_back_and_the_gauges_true(
        ops in prop::collection::vec(op(), 1..24),
        block in prop::sample::select(vec![1usize, 3, 16]),
        positions in 64..256usize,
        ty in prop::sample::select(KvType::ALL.to_vec()),
    ) {
        static SOLO: OnceLock<Vec<Model>> = OnceLock::new();
        let loaded = load_fixture();
        let load = || Model::load(&loaded.files.config, &loaded.files.weights).unwrap();
        let solo = SOLO.get_or_init(|| KvType::ALL.iter().map(|&t| load().with_kv(KvSpec::default().with_type(t))).collect());
        let solo_model = &solo[KvType::ALL.iter().position(|&t| t == ty).unwrap()];
        let model = Arc::new(load().with_kv(KvSpec::new(block).unwrap().with_type(ty)));
        let bytes = positions.div_ceil(block) * block * KvCache::bytes_per_position_as(&model.config, ty);
        let cfg = EngineConfig { parallel: 4, kv_bytes: Some(bytes), ..config(0) };
        let (pool, wrong, last) = (Arc::new(OnceLock::new()), Arc::new(Mutex::new(vec![])), Arc::new(Mutex::new(Gauges::default())));
        let audit = Audit { pool: pool.clone(), wrong: wrong.clone(), last: last.clone() };
        let s = engine::spawn(model, cfg, Box::new(audit), None).unwrap();
        let _ = pool.set(s.handle.kv_pool().clone());
        let prefixes: Vec<Vec<u32>> = (0..3u32).map(|k| (0..[0, 8, 20][k as usize]).map(|t| 40 + 7 * t + k).collect()).collect();
        let mut sent: Vec<Sent> = vec![];
        for op in ops {
            match op {
                Op::Submit { prefix, tail, max_new, n, seed } => {
                    let prompt: Vec<u32> = prefixes[prefix].iter().copied().chain(tail).collect();
                    let sampling = |c: u64| seed.map_or(Sampling::GREEDY, |sd| Sampling { temperature: 0.9, seed: sd.wrapping_add(c), ..Sampling::GREEDY });
                    let asks: Vec<_> = (0..n as u64).map(|c| (prompt.clone(), max_new, sampling(c))).collect();
                    let rxs = s.handle.submit_all(asks.iter().map(|(p, m, smp)| request(p, *m, *smp)).collect()).unwrap();
                    sent.push(Sent { rxs: rxs.into_iter().map(Some).collect(), asks, cancelled: false });
                }
                Op::Cancel(i) | Op::Leave(i) | Op::Wait(i) if sent.is_empty() => { let _ = i; }
                Op::Cancel(i) => {
                    let j = i % sent.len();
                    let r = &mut sent[j];
                    r.cancelled = true;
                    for rx in r.rxs.iter().flatten() { s.handle.cancel(rx.id, CancelReason::Client); }
                }
                Op::Leave(i) => { let j = i % sent.len(); sent[j].rxs.iter_mut().for_each(|rx| drop(rx.take())); }
                Op::Wait(i) => {
                    let j = i % sent.len();
                    check_answers(solo_model, &mut sent[j]);
                }
            }
        }
        for r in &mut sent { check_answers(solo_model, r); }
        block_on(s.handle.flush_cache()).unwrap();
        s.handle.drain();
        s.thread.join().unwrap();
        let wrong = wrong.lock().unwrap();
        prop_assert!(wrong.is_empty(), "{:?}", &wrong[..wrong.len().min(3)]);
        let g = *last.lock().unwrap();
        prop_assert_eq!((g.running, g.waiting, g.pool_used), (0, 0, 0), "{:?}", g);
        prop_assert_eq!(s.handle.kv_pool().used_blocks(), 0);
    }
}

/// Reads a request's remaining streams: a finished answer is `generate()` alone's bits, a
/// cancelled one a prefix of them.
fn check_answers(model: &Model, r: &mut Sent) {
    for (rx, ask) in r.rxs.iter_mut().zip(&r.asks) {
        let Some(rx) = rx.take() else { continue };
        let (got, want) = (read(rx), solo(model, ask));
        if r.cancelled {
            assert!(want.starts_with(&got), "a cancelled answer is a prefix of the solo one: {got:?} vs {want:?}");
        } else {
            assert_eq!(got, want, "{ask:?}: the same bits as alone");
        }
    }
}

/// Found by the property test: two choices of a 22-token prompt asking 28 tokens each (4 blocks
/// each, the first shared) in a pool of 4 blocks. The second is preempted; the first must then
/// finish alone, taking the prompt cache's copy of the partly filled block.
#[test]
fn two_choices_in_a_pool_for_one_both_finish_as_alone() {
    let prompt: Vec<u32> = (0..20).map(|t| 42 + 7 * t).chain([1, 1]).collect();
    let sampling: Vec<Sampling> =
        (0..2).map(|c| Sampling { temperature: 0.9, seed: 11 + c, ..Sampling::GREEDY }).collect();
    let cfg = EngineConfig { parallel: 4, kv_bytes: Some(4 * BLOCK_BYTES), ..config(0) };
    choices_answer_as_alone(&prompt, 28, &sampling, cfg);
}

/// Submits one request per sampling of `prompt` at once and checks each against `generate()`
/// alone.
fn choices_answer_as_alone(prompt: &[u32], max_new: usize, sampling: &[Sampling], cfg: EngineConfig) {
    let loaded = load_fixture();
    let model = Model::load(&loaded.files.config, &loaded.files.weights).unwrap();
    let want: Vec<Vec<u32>> = sampling.iter().map(|&s| solo(&model, &(prompt.to_vec(), max_new, s))).collect();
    let s = engine::spawn(Arc::new(model), cfg, Box::new(engine::NoMonitor), None).unwrap();
    let rxs = s.handle.submit_all(sampling.iter().map(|&c| request(prompt, max_new, c)).collect()).unwrap();
    for (rx, want) in rxs.into_iter().zip(want) {
        assert_eq!(read(rx), want);
    }
}

/// A draft model of the pool's shape takes its blocks from the pool (issue #34: "running
/// sequences, their drafts, and the prompt cache"): four sequences drafting 4 tokens a step in a
/// pool too small for all of them answer as `generate()` alone, without a draft, bit for bit;
/// when the pool has no block for a draft the sequence decodes plainly that step, a preempted
/// sequence's draft gives its blocks back, and after a flush every block is back.
#[test]
fn drafts_take_their_blocks_from_the_pool_and_answers_stay_solo_bits() {
    use kvgpt_core::speculative::{Costs, DraftConfig, DraftSource};
    let loaded = load_fixture();
    let model = Arc::new(Model::load(&loaded.files.config, &loaded.files.weights).unwrap());
    let draft = DraftConfig {
        source: DraftSource::Model(model.clone()),
        max_k: 4,
        min_k: 4,
        costs: Costs { row: 0.0, draft: 0.0 },
    };
    let sampled = Sampling { temperature: 0.8, top_k: Some(20), seed: 3, ..Sampling::GREEDY };
    let prompt = |i: u32| -> Vec<u32> { (0..12).map(|t| 200 + t).chain([700 + i, 900 + i]).collect() };
    let cases: Vec<(Vec<u32>, Sampling)> = (0..4)
        .map(|i| (prompt(i), if i % 2 == 0 { Sampling::GREEDY } else { Sampling { seed: i as u64, ..sampled } }))
        .collect();
    let alone: Vec<Vec<u32>> = cases.iter().map(|(p, s)| solo(&model, &(p.clone(), 60, *s))).collect();
    let last = Arc::new(Mutex::new(Gauges::default()));
    // Each sequence needs 5 blocks, its draft as many again: 40 against a pool of 14.
    let cfg = EngineConfig { parallel: 4, draft: Some(draft), ..config(14) };
    let s = engine::spawn(model.clone(), cfg, Box::new(Last(last.clone())), None).unwrap();
    let speculative = |p: &Vec<u32>, smp| Request { speculative: true, ..request(p, 60, smp) };
    let rxs: Vec<Events> = cases.iter().map(|(p, smp)| s.handle.submit(speculative(p, *smp)).unwrap()).collect();
    for (i, (rx, want)) in rxs.into_iter().zip(&alone).enumerate() {
        assert_eq!(&read(rx), want, "sequence {i}: drafted in the pool = alone without a draft");
    }
    assert!(last.lock().unwrap().preemptions > 0, "a pool of 14 for 40 blocks preempted");
    block_on(s.handle.flush_cache()).unwrap();
    assert_eq!(s.handle.kv_pool().used_blocks(), 0, "drafts' blocks came back too");
    s.handle.drain();
    s.thread.join().unwrap();
}

/// Greedy choices of one prompt say the same thing, so they compute the same K/V: each
/// choice's decoded blocks go to the prompt cache as they fill (every 16 positions), and a
/// choice whose block the tree holds already maps the tree's in place of its own copy. Four
/// greedy choices of HF's 88-token prompt in blocks of 4 answer HF's greedy ids, each, and at
/// their peak hold one copy of the 128 positions (32 blocks) plus, per choice, at most the blocks
/// of 16 positions not yet shared, the one it writes into and one given up that step (6 each);
/// without a prompt cache (nothing to share with) each holds its own 32.
#[test]
fn greedy_choices_hold_the_blocks_they_share_once_and_answer_as_hf() {
    let reference = Reference::load();
    let p = reference.prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let loaded = load_fixture();
    let model =
        Arc::new(Model::load(&loaded.files.config, &loaded.files.weights).unwrap().with_kv(KvSpec::new(4).unwrap()));
    let peak = |cache_bytes: usize| -> usize {
        let cfg = EngineConfig { parallel: 4, cache_bytes, kv_bytes: Some(256 * 4 * 2 * 2 * 64 * 4), ..config(0) };
        let s = engine::spawn(model.clone(), cfg, Box::new(engine::NoMonitor), None).unwrap();
        let n = p.greedy_ids.len();
        let rxs = s.handle.submit_all((0..4).map(|_| request(&p.ids, n, Sampling::GREEDY)).collect()).unwrap();
        for rx in rxs {
            assert_eq!(read(rx), p.greedy_ids, "cache {cache_bytes}: each choice is HF's greedy answer");
        }
        s.handle.kv_pool().peak_blocks()
    };
    let (shared, alone) = (peak(16 << 20), peak(0));
    assert!(alone >= 4 * 31, "without a prompt cache each choice holds its own blocks: {alone}");
    assert!(shared <= 32 + 4 * 6, "{shared} blocks at the peak with sharing (without: {alone})");
}

/// Found by the gauges test over HTTP: four sampled choices of a 2-token prompt, one at a time
/// (`parallel` 1) in a pool that holds exactly one answer. The second choice's lookup split the
/// prompt's node inside its block, and when the choices' decoded blocks joined the tree the
/// split's upper half (interior, never evicted) pinned the prompt's first copy of that block:
/// the second choice ran out of blocks at token 111. Each must answer as `generate()` alone.
#[test]
fn sampled_choices_one_at_a_time_in_a_pool_for_one_answer_as_alone() {
    let sampling: Vec<Sampling> = (0..4).map(|c| Sampling { temperature: 1.0, seed: c, ..Sampling::GREEDY }).collect();
    let cfg = EngineConfig { parallel: 1, kv_bytes: Some(8 * BLOCK_BYTES), ..config(0) };
    choices_answer_as_alone(&[464, 3797], 120, &sampling, cfg);
}
