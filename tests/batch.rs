//! Many sequences at once: a sequence's logits are the same bits whether it runs alone, batched
//! with 1…15 others of any lengths (joining and leaving at different steps), or prefilled in any
//! chunking; and the engine's answers are the same bits cold, from the prompt cache, batched and
//! after eviction. Alone runs are anchored to Hugging Face's greedy ids and logits.

mod common;

use common::*;
use kvgpt_core::engine::{self, EngineConfig, EngineHandle, Event, Events, NoMonitor, Request, SubmitError};
use kvgpt_core::logprobs::TokenLogprob;
use kvgpt_core::prefix_cache::PrefixCache;
use kvgpt_core::{generate, GenerateOptions, Model, Sampling, Scratch, Sequence};
use std::sync::Arc;

const TOL: f32 = 1e-4;

/// A prompt with what HF says of it: its greedy ids, and the logits of its last position.
struct Case {
    ids: Vec<u32>,
    greedy: Option<Vec<u32>>,
    last_logits: Vec<f32>,
    steps: usize,
}

/// The reference prompts, and prefixes of two whose every position HF logged.
fn cases(reference: &Reference, v: usize) -> Vec<Case> {
    let mut out = vec![];
    for p in reference.prompts() {
        let t = p.ids.len();
        let last = match reference.tensor(&format!("{}.logits", p.key)) {
            Some((_, w)) => w[(t - 1) * v..].to_vec(),
            None => reference.tensor(&format!("{}.last_logits", p.key)).unwrap().1,
        };
        out.push(Case {
            ids: p.ids.clone(),
            steps: p.greedy_ids.len(),
            greedy: Some(p.greedy_ids.clone()),
            last_logits: last,
        });
    }
    for (key, lens) in [("p1", [2, 5, 9, 13, 6]), ("p3", [3, 7, 11, 14, 1])] {
        let p = reference.prompts().into_iter().find(|p| p.key == key).unwrap();
        let (_, all) = reference.tensor(&format!("{key}.logits")).unwrap();
        for k in lens {
            out.push(Case {
                ids: p.ids[..k].to_vec(),
                greedy: None,
                last_logits: all[(k - 1) * v..k * v].to_vec(),
                steps: 12,
            });
        }
    }
    out
}

/// Greedy steps of one sequence alone: the logits bits of every step.
fn alone(model: &Model, c: &Case) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut seq = Sequence::new(model, &c.ids, c.steps, Sampling::GREEDY).unwrap();
    let mut scratch = Scratch::new(&model.config, c.ids.len());
    let mut steps = vec![];
    for _ in 0..c.steps {
        seq.feed(model, &mut scratch).unwrap();
        steps.push(bits(seq.logits()));
        seq.sample();
    }
    (seq.generated().to_vec(), steps)
}

#[test]
fn batched_sequences_get_the_bits_they_get_alone() {
    let loaded = load_fixture();
    let reference = Reference::load();
    let v = loaded.model.config.vocab_size;
    let cases = cases(&reference, v);
    // f32, anchored to HF; and W8A8, whose activations are quantized per row, so its rows are
    // just as independent of their batch.
    let types = [kvgpt_core::WeightType::F32, kvgpt_core::WeightType::W8A8];
    for (ty, isa) in types.into_iter().flat_map(|ty| kvgpt_kernels::Isa::available().into_iter().map(move |i| (ty, i)))
    {
        let model = Model::load_as(&loaded.files.config, &loaded.files.weights, ty).unwrap().with_isa(isa);
        let solo: Vec<_> = cases.iter().map(|c| alone(&model, c)).collect();
        for (c, (ids, steps)) in cases.iter().zip(&solo) {
            if ty != kvgpt_core::WeightType::F32 {
                continue;
            }
            if let Some(g) = &c.greedy {
                assert_eq!(ids, g, "alone ({}): HF's greedy ids", isa.name());
            }
            let first: Vec<f32> = steps[0].iter().map(|&b| f32::from_bits(b)).collect();
            assert_close("alone: HF's last-position logits", &first, &c.last_logits, TOL);
        }
        // Batches of 2, 4, 8 and 16, members joining one step apart, prefilling in chunks of
        // different sizes under a token budget, and leaving when done.
        for (size, budget) in [(2, 5), (4, 64), (8, 17), (16, 256), (16, 3)] {
            let members: Vec<usize> = (0..size).map(|i| (i * 7 + size) % cases.len()).collect();
            let mut seqs: Vec<Sequence> = members
                .iter()
                .map(|&m| Sequence::new(&model, &cases[m].ids, cases[m].steps, Sampling::GREEDY).unwrap())
                .collect();
            let mut got: Vec<Vec<Vec<u32>>> = vec![vec![]; size];
            let mut scratch = Scratch::new(&model.config, budget);
            let mut step = 0;
            while got.iter().zip(&members).any(|(g, &m)| g.len() < cases[m].steps) {
                let mut left = budget;
                let mut chunks = vec![];
                for (i, s) in seqs.iter().enumerate() {
                    let done = got[i].len() >= cases[members[i]].steps;
                    let chunk = if done || i > step { 0 } else { [1, 3, 7, 16, 200][i % 5].min(left) };
                    chunks.push(chunk);
                    left -= chunk.min(s.pending());
                }
                if seqs
                    .iter()
                    .zip(0..)
                    .any(|(s, i)| i <= step && s.pending() > 0 && got[i].len() < cases[members[i]].steps)
                {
                    let mut rows: Vec<_> = seqs.iter_mut().zip(&chunks).map(|(s, &n)| s.rows(n)).collect();
                    model.forward_batch(&mut rows, &mut scratch).unwrap();
                }
                for (i, s) in seqs.iter_mut().enumerate() {
                    if s.pending() == 0 && got[i].len() < cases[members[i]].steps {
                        got[i].push(bits(s.logits()));
                        s.sample();
                    }
                }
                step += 1;
            }
            for (i, &m) in members.iter().enumerate() {
                assert!(
                    got[i] == solo[m].1,
                    "{} {}: batch of {size} (budget {budget}), member {i} (prompt of {} tokens): logits differ from alone",
                    ty.name(),
                    isa.name(),
                    cases[m].ids.len()
                );
                assert_eq!(seqs[i].generated(), &solo[m].0[..]);
            }
        }
        println!("{} {}: batches of 2..16 equal their members alone, bit for bit", ty.name(), isa.name());
    }
}

/// A prefix restored from the prompt cache gives the K/V bits and logits of a cold prefill.
#[test]
fn prompt_cache_prefixes_equal_cold_prefill() {
    let loaded = load_fixture();
    let model = &loaded.model;
    let reference = Reference::load();
    let p2 = reference.prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let (_, hf_last) = reference.tensor("p2.last_logits").unwrap();
    let mut cache = PrefixCache::new(64 << 20);
    let mut scratch = Scratch::new(&model.config, 128);
    // Store the first 60 tokens, then ask for prefixes that end before, at and after them, and
    // one that diverges at token 30.
    let mut first = Sequence::new(model, &p2.ids[..60], 1, Sampling::GREEDY).unwrap();
    first.feed(model, &mut scratch).unwrap();
    cache.insert(first.ids(), first.cache());
    let mut diverged = p2.ids[..50].to_vec();
    diverged[30] = 11;
    for (ids, want_hit) in
        [(p2.ids[..20].to_vec(), 19), (p2.ids[..60].to_vec(), 59), (p2.ids[..88].to_vec(), 60), (diverged, 30)]
    {
        let mut warm = Sequence::new(model, &ids, 1, Sampling::GREEDY).unwrap();
        let kvgpt_core::prefix_cache::Lookup { len, blocks, hold, .. } = cache.lookup(warm.ids());
        assert_eq!(len, want_hit, "reuse stops at the first differing token, and before the last");
        warm.map_prefix(&blocks, len).unwrap();
        cache.release(hold);
        warm.feed(model, &mut scratch).unwrap();
        let mut cold = Sequence::new(model, &ids, 1, Sampling::GREEDY).unwrap();
        cold.feed(model, &mut scratch).unwrap();
        assert_eq!(bits(warm.logits()), bits(cold.logits()), "{} tokens, {want_hit} cached", ids.len());
        if ids == p2.ids {
            assert_close("warm logits vs HF", warm.logits(), &hf_last, TOL);
        }
        for l in 0..model.config.n_layer {
            for part in [kvgpt_core::KvPart::K, kvgpt_core::KvPart::V] {
                assert_eq!(bits(&warm.cache().gather(l, part)), bits(&cold.cache().gather(l, part)));
            }
        }
        cache.insert(warm.ids(), warm.cache());
    }
    // A budget of one entry evicts the least recently used, never a held one.
    let mut small = PrefixCache::new(first.cache().bytes() / 2);
    small.insert(first.ids(), first.cache());
    assert_eq!(small.bytes(), 0, "an entry over the budget is not kept");
    assert!(small.stats.evicted_nodes == 1);
}

/// An engine thread over `model`: its handle and its thread.
fn engine(model: &Arc<Model>, cfg: EngineConfig) -> (EngineHandle, std::thread::JoinHandle<()>) {
    let s = engine::spawn(model.clone(), EngineConfig { max_queue: 64, ..cfg }, Box::new(NoMonitor), None).unwrap();
    (s.handle, s.thread)
}

/// (ids, logprob bits, cached tokens) of one request's answer.
type Answer = (Vec<u32>, Vec<(u64, Vec<(u32, u64)>)>, usize);

fn submit(engine: &EngineHandle, prompt: &[u32], max_new: usize, sampling: Sampling) -> Events {
    let req = Request {
        prompt: prompt.to_vec(),
        max_new_tokens: max_new,
        sampling,
        stop_at_eos: false,
        logprobs: Some(3),
        speculative: false,
    };
    engine.submit(req).unwrap()
}

fn answer(rx: Events) -> Answer {
    let (mut ids, mut lps, mut cached) = (vec![], vec![], 0);
    for e in rx {
        match e {
            Event::Started { cached_tokens, .. } => cached = cached_tokens,
            Event::Token { id, logprob } => {
                let TokenLogprob { logprob, top } = logprob.unwrap();
                ids.push(id);
                lps.push((logprob.to_bits(), top.iter().map(|(i, l)| (*i, l.to_bits())).collect()));
            }
            Event::Done { .. } => break,
            Event::Error(e) => panic!("engine error: {e}"),
        }
    }
    (ids, lps, cached)
}

#[test]
fn engine_answers_are_the_same_bits_cold_warm_batched_and_evicted() {
    let loaded = load_fixture();
    let reference = Reference::load();
    let model = Arc::new(Model::load(&loaded.files.config, &loaded.files.weights).unwrap());
    let p2 = reference.prompts().into_iter().find(|p| p.key == "p2").unwrap();
    // A shared 60-token "system prompt" and questions after it.
    let shared = &p2.ids[..60];
    let question = |i: usize| -> Vec<u32> {
        let mut q = shared.to_vec();
        q.extend_from_slice(&p2.ids[60 + i..64 + 2 * i]);
        q
    };
    let sampled = Sampling {
        temperature: 0.8,
        top_k: Some(40),
        top_p: Some(0.95),
        seed: 42,
        repetition_penalty: 1.2,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
    };
    for sampling in [Sampling::GREEDY, sampled] {
        // The single-sequence path: `generate`, for ids and the logprobs' source.
        let opts = GenerateOptions { max_new_tokens: 12, sampling, stop_at_eos: false, use_cache: true };
        let want = generate(&model, &question(0), &opts, &mut |_, _| Ok(kvgpt_core::Step::Go)).unwrap().generated_ids;
        let start = |cache_bytes| {
            engine(
                &model,
                EngineConfig {
                    parallel: 8,
                    batch_tokens: 32,
                    cache_bytes,
                    max_queue: 0,
                    draft: None,
                    kv_events: false,
                    kv_bytes: None,
                    store: None,
                },
            )
        };
        let (engine, thread) = start(16 << 20);
        let cold = answer(submit(&engine, &question(0), 12, sampling));
        assert_eq!(cold.0, want, "served alone = generate()");
        assert_eq!(cold.2, 0);
        let warm = answer(submit(&engine, &question(0), 12, sampling));
        assert_eq!(warm.2, 63, "all of the prompt but its last token came from the cache");
        // Batched with 7 others of different lengths, all at once.
        let rxs: Vec<_> = (0..8).map(|i| submit(&engine, &question(i), 12 + i, sampling)).collect();
        let batched: Vec<Answer> = rxs.into_iter().map(answer).collect();
        assert!(batched.iter().skip(1).all(|a| a.2 >= 60), "the others reuse the shared prefix");
        for a in [&warm, &batched[0]] {
            assert_eq!((&a.0, &a.1), (&cold.0, &cold.1), "warm / batched = cold, ids and logprob bits");
        }
        drop(engine);
        thread.join().unwrap();
        // A budget too small for anything: every answer computed, still the same bits.
        let (engine, thread) = start(1);
        let evicted = answer(submit(&engine, &question(0), 12, sampling));
        assert_eq!((&evicted.0, &evicted.1, evicted.2), (&cold.0, &cold.1, 0));
        drop(engine);
        thread.join().unwrap();
    }
    // And the engine against HF: every reference prompt's greedy ids, cold and then warm, all at once.
    let (tx, thread) = engine(
        &model,
        EngineConfig {
            parallel: 16,
            batch_tokens: 64,
            cache_bytes: 16 << 20,
            max_queue: 0,
            draft: None,
            kv_events: false,
            kv_bytes: None,
            store: None,
        },
    );
    let prompts = reference.prompts();
    let rxs: Vec<_> =
        prompts.iter().chain(&prompts).map(|p| submit(&tx, &p.ids, p.greedy_ids.len(), Sampling::GREEDY)).collect();
    for (a, p) in rxs.into_iter().map(answer).zip(prompts.iter().chain(&prompts)) {
        assert_eq!(a.0, p.greedy_ids, "{}: served greedy ids = HF's", p.key);
    }
    drop(tx);
    thread.join().unwrap();
}

/// Requests that arrive together and share a prefix: the first computes it, the others wait for
/// it to enter the prompt cache and reuse it (instead of computing it again side by side), with
/// the bits each gets alone.
#[test]
fn requests_arriving_together_share_the_prefix_the_first_one_computes() {
    let loaded = load_fixture();
    let reference = Reference::load();
    let model = Arc::new(Model::load(&loaded.files.config, &loaded.files.weights).unwrap());
    let p2 = reference.prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let prompt = |i: usize| -> Vec<u32> {
        let mut q = p2.ids[..60].to_vec();
        q.extend_from_slice(&p2.ids[60 + 3 * i..63 + 3 * i]);
        q
    };
    let sampling = Sampling { temperature: 0.7, seed: 9, ..Sampling::GREEDY };
    let spawn = |cache_bytes| {
        engine(
            &model,
            EngineConfig {
                parallel: 8,
                batch_tokens: 16,
                cache_bytes,
                max_queue: 0,
                draft: None,
                kv_events: false,
                kv_bytes: None,
                store: None,
            },
        )
    };
    let (engine, thread) = spawn(16 << 20);
    let rxs: Vec<_> = (0..6).map(|i| submit(&engine, &prompt(i), 10, sampling)).collect();
    let together: Vec<Answer> = rxs.into_iter().map(answer).collect();
    drop(engine);
    thread.join().unwrap();
    assert_eq!(together[0].2, 0, "the first computes the prefix");
    for a in &together[1..] {
        assert_eq!(a.2, 60, "the others take the shared 60 tokens from the cache");
    }
    let (engine, thread) = spawn(0);
    for (i, a) in together.iter().enumerate() {
        let alone = answer(submit(&engine, &prompt(i), 10, sampling));
        assert_eq!((&alone.0, &alone.1), (&a.0, &a.1), "request {i}: together = alone without any cache");
    }
    drop(engine);
    thread.join().unwrap();
}

/// The queue limit counts what the engine holds, running and waiting: a request of more sequences
/// than both can ever hold is refused for good, one that does not fit now is busy until some
/// finish, and one that fits is queued.
#[test]
fn the_queue_limit_counts_running_and_waiting_and_refuses_what_can_never_fit() {
    let loaded = load_fixture();
    let model = Arc::new(Model::load(&loaded.files.config, &loaded.files.weights).unwrap());
    let cfg = EngineConfig {
        parallel: 1,
        batch_tokens: 16,
        cache_bytes: 0,
        max_queue: 1,
        draft: None,
        kv_events: false,
        kv_bytes: None,
        store: None,
    };
    let engine::Spawned { handle: h, thread, .. } = engine::spawn(model, cfg, Box::new(NoMonitor), None).unwrap();
    let req = Request {
        prompt: vec![464, 3797],
        max_new_tokens: 4,
        sampling: Sampling::GREEDY,
        stop_at_eos: false,
        logprobs: Some(3),
        speculative: false,
    };
    let long = submit(&h, &[464], 120, Sampling::GREEDY); // holds the one slot for 120 steps
    assert!(matches!(h.submit_all(vec![req.clone(); 2]), Err(SubmitError::Busy { waiting: 0, limit: 1 })));
    let queued = h.submit(req.clone()).expect("one more fits the queue");
    match h.submit_all(vec![req.clone(); 3]) {
        Err(e @ SubmitError::TooMany { n: 3, parallel: 1, max_queue: 1 }) => {
            assert!(e.to_string().contains("smaller n"), "{e}")
        }
        other => panic!("three sequences can never fit one slot and one place in the queue: {:?}", other.err()),
    }
    assert_eq!(answer(long).0.len(), 120);
    assert_eq!(answer(queued).0.len(), 4);
    // Both have finished: two fit again (one runs, one waits).
    let both = h.submit_all(vec![req; 2]).expect("room again once the others finished");
    for a in both.into_iter().map(answer) {
        assert_eq!(a.0.len(), 4);
    }
    drop(h);
    thread.join().unwrap();
}
