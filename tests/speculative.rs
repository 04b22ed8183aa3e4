//! Exact speculative decoding: with every kind of draft and k from 1 to 8, greedy gives Hugging
//! Face's greedy ids and every token's logits bit for bit as decoding alone does; sampled, the
//! same seed gives the same tokens, and over many seeds the tokens follow the model's own
//! distribution (a chi-square test against probabilities computed here); after a rejection the
//! caches hold exactly the accepted positions; in the engine, batched and from the prompt cache,
//! an answer ends exactly at end-of-text or its length, however many drafts a step accepted; on
//! every instruction set the CPU has, drafted answers are the scalar path's alone. Random
//! weights repeat themselves, so how often a draft is accepted here says nothing about real text.

mod common;

use common::*;
use kvgpt_core::engine::{self, EngineConfig, Event, NoMonitor, Request};
use kvgpt_core::speculative::{Costs, Draft, DraftConfig, DraftSource, DraftStats, ModelDraft, Speculation};
use kvgpt_core::{generate_from, GenerateOptions, KvCache, KvPart, Model, NoTap, Sampling, Scratch, Sequence, Step};
use std::sync::Arc;

/// Drafting that costs nothing (the tests that fix k do not use it).
const FREE: Costs = Costs { row: 0.1, draft: 0.0 };

/// Each token and the logits it was chosen from, and what drafting did.
type Run = (Vec<u32>, Vec<Vec<f32>>, DraftStats);

fn decode(model: &Model, prompt: &[u32], n: usize, sampling: Sampling, draft: Option<Speculation>) -> Run {
    let mut seq = Sequence::new(model, prompt, n, sampling).unwrap();
    if let Some(spec) = draft {
        seq.speculate(spec);
    }
    let opts = GenerateOptions { max_new_tokens: n, sampling, stop_at_eos: false, use_cache: true };
    let mut logits = vec![];
    let g = generate_from(model, &mut seq, &opts, &mut |_, l| {
        logits.push(l.to_vec());
        Ok(Step::Go)
    })
    .unwrap();
    let stats = seq.speculation().map(|s| s.stats).unwrap_or_default();
    (g.generated_ids, logits, stats)
}

fn assert_same(what: &str, alone: &Run, drafted: &Run) {
    assert_eq!(alone.0, drafted.0, "{what}: ids");
    for (i, (a, b)) in alone.1.iter().zip(&drafted.1).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: logits of token {i}");
    }
}

/// A draft that proposes the model's greedy answer, but one past it (a token the model will not
/// say) at every answer position `wrong` picks.
struct Skewed {
    answer: Vec<u32>,
    prompt: usize,
    wrong: fn(usize) -> bool,
}

impl Draft for Skewed {
    fn propose(&mut self, ids: &[u32], k: usize, out: &mut Vec<u32>) -> kvgpt_core::Result<()> {
        out.clear();
        let at = ids.len() - self.prompt;
        let skew = |(i, &t): (usize, &u32)| if (self.wrong)(at + i) { (t + 1) % 50257 } else { t };
        out.extend(self.answer[at..].iter().take(k).enumerate().map(skew));
        Ok(())
    }
}

/// The drafts of every kind for `model` (loaded from `dir`), by name: lookup, the same weights
/// at int8 twice, another (smaller) GPT-2 with the same tokenizer, and the model itself.
fn drafts(dir: &std::path::Path, model: &Arc<Model>, other: &std::path::Path) -> Vec<(&'static str, DraftSource)> {
    let load = |d: &std::path::Path, ty| {
        Arc::new(kvgpt_core::load_as(&kvgpt_core::hub::local_folder(d).unwrap(), ty).unwrap().model)
    };
    vec![
        ("lookup", DraftSource::Lookup { max_ngram: 3 }),
        ("self:w8a8", DraftSource::Model(load(dir, kvgpt_core::WeightType::W8A8))),
        ("self:q8", DraftSource::Model(load(dir, kvgpt_core::WeightType::Q8))),
        ("draft-model", DraftSource::Model(load(other, kvgpt_core::WeightType::F32))),
        ("itself", DraftSource::Model(model.clone())),
    ]
}

#[test]
fn greedy_with_every_draft_and_k_is_hf_and_the_model_alone_bit_for_bit() {
    let model = Arc::new(load_fixture().model);
    let other = random_model::small_draft_model();
    let reference = Reference::load();
    for (name, source) in drafts(&fixture_dir(), &model, other.path()) {
        let mut total = DraftStats::default();
        for p in reference.prompts() {
            let n = p.greedy_ids.len();
            let alone = decode(&model, &p.ids, n, Sampling::GREEDY, None);
            assert_eq!(alone.0, p.greedy_ids, "{}: HF's greedy ids", p.key);
            for k in 1..=8 {
                let spec = Speculation::new(source.make(p.ids.len() + n, None), k, FREE).fixed();
                let run = decode(&model, &p.ids, n, Sampling::GREEDY, Some(spec));
                assert_same(&format!("{name} {} k={k}", p.key), &alone, &run);
                let s = run.2;
                assert!(s.accepted <= s.drafted && s.steps < n, "{name} {s:?}");
                if name == "itself" {
                    assert_eq!(s.accepted, s.drafted, "the model agrees with itself: {s:?}");
                }
                total.add(s);
            }
            // A draft that always disagrees still gives the model's answer, one token a step.
            let wrong = Box::new(Skewed { answer: alone.0.clone(), prompt: p.ids.len(), wrong: |_| true });
            let run = decode(&model, &p.ids, n, Sampling::GREEDY, Some(Speculation::new(wrong, 4, FREE).fixed()));
            assert_same(&format!("always wrong {}", p.key), &alone, &run);
            assert_eq!(run.2.accepted, 0);
        }
        assert!(total.drafted > 0, "{name} drafted nothing");
    }
}

#[test]
fn long_answers_greedy_and_sampled_are_the_model_alone_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let shape = random_model::Shape { n_embd: 64, n_layer: 2, n_head: 4, n_positions: 256, seed: 3, endless: true };
    random_model::write(dir.path(), shape);
    let model = Arc::new(kvgpt_core::load(&kvgpt_core::hub::local_folder(dir.path()).unwrap()).unwrap().model);
    let other = random_model::small_draft_model();
    let tok = load_fixture().tokenizer;
    let prompt = tok.encode("The quick brown fox jumps over the lazy dog, and the dog").unwrap();
    let sampled = Sampling { temperature: 0.7, top_k: Some(8), seed: 11, ..Sampling::GREEDY };
    let penalized = Sampling { repetition_penalty: 1.3, presence_penalty: 0.5, ..sampled };
    for sampling in [Sampling::GREEDY, sampled, penalized] {
        let alone = decode(&model, &prompt, 200, sampling, None);
        for (name, source) in drafts(dir.path(), &model, other.path()) {
            for (k, adaptive) in [(3, false), (8, false), (8, true)] {
                let spec = Speculation::new(source.make(prompt.len() + 200, None), k, Costs { row: 0.1, draft: 0.1 });
                let spec = if adaptive { spec } else { spec.fixed() };
                let run = decode(&model, &prompt, 200, sampling, Some(spec));
                assert_same(&format!("{name} k={k} adaptive={adaptive} {sampling:?}"), &alone, &run);
            }
        }
    }
}

/// Two caches of the same length hold the same K and V, bit for bit.
fn same_kv(a: &KvCache, b: &KvCache) -> bool {
    let bits = |c: &KvCache, l, part| c.gather(l, part).iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    a.len() == b.len()
        && (0..a.n_layer()).all(|l| [KvPart::K, KvPart::V].into_iter().all(|p| bits(a, l, p) == bits(b, l, p)))
}

fn fresh_cache(model: &Model, ids: &[u32]) -> KvCache {
    let mut cache = KvCache::new(&model.config);
    let mut scratch = Scratch::new(&model.config, ids.len());
    model.forward(ids, &mut cache, &mut scratch, &mut NoTap, &mut []).unwrap();
    cache
}

#[test]
fn after_a_rejection_the_caches_hold_exactly_the_accepted_positions() {
    let loaded = load_fixture();
    let model = &loaded.model;
    let prompt = loaded.tokenizer.encode("Hello, my dog is cute and").unwrap();
    let n = 40;
    let answer = decode(model, &prompt, n, Sampling::GREEDY, None).0;
    let mut seq = Sequence::new(model, &prompt, n, Sampling::GREEDY).unwrap();
    let draft = Skewed { answer: answer.clone(), prompt: prompt.len(), wrong: |i| i % 3 == 2 };
    seq.speculate(Speculation::new(Box::new(draft), 4, FREE).fixed());
    let mut scratch = Scratch::new(&model.config, 64);
    let mut rejected = 0;
    while seq.generated().len() < n {
        let d = seq.draft(1).unwrap();
        seq.feed(model, &mut scratch).unwrap();
        assert_eq!(seq.cache().len(), seq.ids().len(), "every drafted token was fed");
        seq.sample();
        let accepted = seq.new_tokens().len() - 1;
        rejected += usize::from(accepted < d);
        // The cache now holds every id but the last, computed as if never drafted.
        let ids = seq.ids();
        assert_eq!(seq.cache().len(), ids.len() - 1);
        assert_eq!(&ids[prompt.len()..], &answer[..ids.len() - prompt.len()]);
        assert!(same_kv(seq.cache(), &fresh_cache(model, &ids[..ids.len() - 1])));
    }
    assert!(rejected > 3, "the draft was rejected {rejected} times");

    // A draft model's own cache: after the target accepts something else, the next proposal
    // keeps only the common prefix and recomputes the rest.
    let draft_model = Arc::new(kvgpt_core::load_as(&loaded.files, kvgpt_core::WeightType::W8A8).unwrap().model);
    let mut draft = ModelDraft::new(draft_model.clone(), 128, None);
    let mut out = vec![];
    draft.propose(&prompt, 5, &mut out).unwrap();
    assert_eq!(draft.cache().len(), prompt.len() + 4, "the last draft is not fed");
    let mut accepted = prompt.clone();
    accepted.extend_from_slice(&out[..2]);
    accepted.push((out[2] + 1) % 50257); // the target's correction
    let mut again = vec![];
    draft.propose(&accepted, 3, &mut again).unwrap();
    let mut seen = accepted.clone();
    seen.extend_from_slice(&again[..2]);
    assert_eq!(draft.cache().len(), seen.len());
    assert!(same_kv(draft.cache(), &fresh_cache(&draft_model, &seen)));
}

/// Softmax of `l / t` over the `k` largest logits (ties to the lower id), in f64: the
/// distribution HF's temperature and top-k warpers sample from.
fn top_k_probs(l: &[f32], t: f64, k: usize) -> Vec<(u32, f64)> {
    let mut idx: Vec<u32> = (0..l.len() as u32).collect();
    idx.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    let max = l[idx[0] as usize] as f64;
    let w: Vec<f64> = idx.iter().map(|&i| ((l[i as usize] as f64 - max) / t).exp()).collect();
    let sum: f64 = w.iter().sum();
    idx.into_iter().zip(w).map(|(i, w)| (i, w / sum)).collect()
}

/// The chi-square critical value for `df` degrees of freedom at significance 0.001
/// (Wilson–Hilferty, z = 3.090).
fn chi2_critical(df: usize) -> f64 {
    let d = df as f64;
    let h = 2.0 / (9.0 * d);
    d * (1.0 - h + 3.090 * h.sqrt()).powi(3)
}

#[test]
fn sampled_with_drafts_the_first_tokens_follow_the_models_distribution() {
    let loaded = load_fixture();
    let model = Arc::new(loaded.model);
    let prompt = loaded.tokenizer.encode("The capital of France is").unwrap();
    let (t, k) = (0.7, 8);
    // The joint distribution of the first two tokens, from the model's logits and the warpers
    // written out above.
    let first = decode(&model, &prompt, 1, Sampling::GREEDY, None).1.remove(0);
    let mut expected = vec![];
    for (t1, p1) in top_k_probs(&first, t, k) {
        let mut ids = prompt.clone();
        ids.push(t1);
        let l2 = decode(&model, &ids, 1, Sampling::GREEDY, None).1.remove(0);
        expected.extend(top_k_probs(&l2, t, k).into_iter().map(|(t2, p2)| ((t1, t2), p1 * p2)));
    }
    // The model itself as the draft proposes its greedy tokens: accepted when the draw agrees,
    // rejected otherwise, both often.
    let runs = 4000;
    let mut counts = std::collections::HashMap::new();
    let mut stats = DraftStats::default();
    for seed in 0..runs {
        let sampling = Sampling { temperature: t as f32, top_k: Some(k), seed, ..Sampling::GREEDY };
        let spec = Speculation::new(DraftSource::Model(model.clone()).make(prompt.len() + 3, None), 2, FREE).fixed();
        let run = decode(&model, &prompt, 3, sampling, Some(spec));
        if seed < 50 {
            assert_eq!(run.0, decode(&model, &prompt, 3, sampling, None).0, "seed {seed}: the same tokens");
        }
        stats.add(run.2);
        *counts.entry((run.0[0], run.0[1])).or_insert(0usize) += 1;
    }
    assert!(stats.accepted > runs as usize / 10, "acceptances happen: {stats:?}");
    assert!(stats.drafted > stats.accepted + runs as usize / 10, "rejections happen: {stats:?}");
    let possible: std::collections::HashSet<_> = expected.iter().map(|(pair, _)| *pair).collect();
    assert!(counts.keys().all(|pair| possible.contains(pair)), "only top-k tokens are drawn");
    // Pearson's chi-square over the pairs expected at least 5 times, the rest pooled.
    let n = runs as f64;
    let (mut chi2, mut bins, mut rest_e, mut rest_o) = (0.0, 0, 0.0, 0usize);
    for (pair, p) in &expected {
        let o = counts.get(pair).copied().unwrap_or(0);
        if p * n >= 5.0 {
            chi2 += (o as f64 - p * n).powi(2) / (p * n);
            bins += 1;
        } else {
            rest_e += p * n;
            rest_o += o;
        }
    }
    let seen: usize = counts.values().sum();
    assert_eq!(seen, runs as usize);
    if rest_e > 0.0 {
        chi2 += (rest_o as f64 - rest_e).powi(2) / rest_e;
        bins += 1;
    }
    let crit = chi2_critical(bins - 1);
    assert!(chi2 < crit, "chi-square {chi2:.1} over {bins} bins ≥ {crit:.1} (p < 0.001)");
}

/// (ids, logprob bits, finish, usage) of one engine sequence.
type EngineRun = (Vec<u32>, Vec<u64>, Option<kvgpt_core::FinishReason>, kvgpt_core::engine::Usage);

fn engine_run(events: kvgpt_core::engine::Events) -> EngineRun {
    let (mut ids, mut lps) = (vec![], vec![]);
    for e in events {
        match e {
            Event::Token { id, logprob } => {
                ids.push(id);
                lps.push(logprob.unwrap().logprob.to_bits());
            }
            Event::Done { finish, usage } => return (ids, lps, Some(finish), usage),
            Event::Started { .. } => {}
            Event::Error(e) => panic!("{e}"),
        }
    }
    (ids, lps, None, Default::default())
}

#[test]
fn in_the_engine_batched_drafts_end_exactly_at_end_of_text_and_at_the_length() {
    let reference = Reference::load();
    // The longest answer after a prompt of more than one token (so the prompt cache has some).
    let p = reference.prompts().into_iter().filter(|p| p.ids.len() > 1).max_by_key(|p| p.greedy_ids.len()).unwrap();
    // End-of-text becomes a token the model says in the middle of its answer (at `j`), so that a
    // step of accepted drafts runs past it.
    let j = (6..p.greedy_ids.len()).find(|&j| !p.greedy_ids[..j].contains(&p.greedy_ids[j])).unwrap();
    let mut model = load_fixture().model;
    model.config.eos_token_id = p.greedy_ids[j];
    let model = Arc::new(model);
    let itself = DraftConfig { source: DraftSource::Model(model.clone()), max_k: 8, min_k: 0, costs: FREE };
    let sampled = Sampling { temperature: 0.7, top_k: Some(8), seed: 5, ..Sampling::GREEDY };
    let run = |draft: Option<DraftConfig>| -> Vec<EngineRun> {
        let cfg = EngineConfig {
            parallel: 4,
            batch_tokens: 16,
            cache_bytes: 1 << 20,
            max_queue: 8,
            draft,
            kv_events: false,
            kv_bytes: None,
            store: None,
        };
        let engine::Spawned { handle: h, thread, .. } =
            engine::spawn(model.clone(), cfg, Box::new(NoMonitor), None).unwrap();
        let req = |stop_at_eos, sampling| Request {
            prompt: p.ids.clone(),
            max_new_tokens: p.greedy_ids.len(),
            sampling,
            stop_at_eos,
            logprobs: Some(2),
            speculative: true,
        };
        let reqs =
            vec![req(true, Sampling::GREEDY), req(false, Sampling::GREEDY), req(true, sampled), req(false, sampled)];
        // Twice: the second time from the prompt cache.
        let mut out: Vec<EngineRun> = h.submit_all(reqs.clone()).unwrap().into_iter().map(engine_run).collect();
        out.extend(h.submit_all(reqs).unwrap().into_iter().map(engine_run));
        drop(h);
        thread.join().unwrap();
        out
    };
    let (plain, drafted) = (run(None), run(Some(itself)));
    use kvgpt_core::FinishReason::{Eos, Length};
    for (i, (a, d)) in plain.iter().zip(&drafted).enumerate() {
        assert_eq!((&a.0, &a.1, a.2), (&d.0, &d.1, d.2), "sequence {i}: ids, logprobs and finish as without drafts");
        assert_eq!(a.3.completion_tokens, d.3.completion_tokens, "sequence {i}");
        assert_eq!(d.3.completion_tokens, d.0.len(), "sequence {i}: usage counts the tokens sent");
        assert!(i < 4 || d.3.cached_tokens > 0, "sequence {i} came from the prompt cache: {:?}", d.3);
        assert_eq!(a.3.drafted_tokens, 0);
    }
    assert_eq!(drafted[0].0, p.greedy_ids[..=j], "greedy ends at end-of-text, HF's ids up to it");
    assert_eq!(drafted[0].2, Some(Eos));
    assert_eq!(drafted[1].0, p.greedy_ids, "greedy to the length: HF's ids");
    assert_eq!(drafted[1].2, Some(Length));
    let greedy = &drafted[1].3;
    assert!(greedy.drafted_tokens > 0 && greedy.accepted_tokens == greedy.drafted_tokens, "itself agrees: {greedy:?}");
}

/// On every instruction set this CPU has (the draft on the same one), greedy and sampled
/// answers with drafts are the scalar path's answers decoding alone, bit for bit.
#[test]
fn on_every_isa_drafted_answers_are_the_scalar_models_alone() {
    let files = kvgpt_core::hub::local_folder(&fixture_dir()).unwrap();
    let load = |ty, isa| Arc::new(kvgpt_core::load_as(&files, ty).unwrap().model.with_isa(isa));
    let scalar = load(kvgpt_core::WeightType::F32, kvgpt_kernels::Isa::scalar());
    let reference = Reference::load();
    let sampled = Sampling { temperature: 0.7, top_k: Some(8), seed: 3, ..Sampling::GREEDY };
    for isa in kvgpt_kernels::Isa::available() {
        let model = load(kvgpt_core::WeightType::F32, isa);
        let drafts = [
            ("lookup", DraftSource::Lookup { max_ngram: 3 }),
            ("self:w8a8", DraftSource::Model(load(kvgpt_core::WeightType::W8A8, isa))),
        ];
        for p in reference.prompts() {
            let n = p.greedy_ids.len();
            for sampling in [Sampling::GREEDY, sampled] {
                let alone = decode(&scalar, &p.ids, n, sampling, None);
                if sampling.is_greedy() {
                    assert_eq!(alone.0, p.greedy_ids, "{}: HF's greedy ids", p.key);
                }
                // Every k the verify step can take greedily up to --draft-max's default (rows 2
                // to 17: the few-rows tiles of each ISA, AVX-512's eights and AVX2's pairs by
                // chunks); sampled, k = 4.
                let ks = if sampling.is_greedy() { 1..=16 } else { 4..=4 };
                for (name, source) in &drafts {
                    for k in ks.clone() {
                        let spec = Speculation::new(source.make(p.ids.len() + n, None), k, FREE).fixed();
                        let run = decode(&model, &p.ids, n, sampling, Some(spec));
                        assert_same(&format!("{} {name} k={k} {} {sampling:?}", isa.name(), p.key), &alone, &run);
                    }
                }
            }
        }
    }
}
