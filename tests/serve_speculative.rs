//! `kvgpt serve --draft …` over real HTTP: with every kind of draft, requests batched together
//! and again after a prefix-cache hit give Hugging Face's greedy ids (plain and with repetition
//! penalties) and the same text, ids and logprobs, bit for bit, as a server without a draft
//! answering each request alone; 200-token answers too, greedy and sampled. `usage` and
//! `/metrics` count the drafted and accepted tokens, and `speculative: false` turns drafting off.
//! Random weights repeat themselves: how often drafts are accepted here says nothing about real
//! text.

mod common;

use common::server::*;
use common::*;
use serde_json::{json, Value};

/// What must not change: text, ids, logprob bits, top-logprob bits, finish reason.
type Key = (Value, Vec<u32>, Vec<u64>, Vec<Vec<u64>>, Value);

fn key(v: &Value) -> Key {
    let c = &v["choices"][0];
    let (ids, lps, tops) = choice_logprobs(c);
    let bits = |x: &[f64]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    (c["text"].clone(), ids, bits(&lps), tops.iter().map(|t| bits(t)).collect(), c["finish_reason"].clone())
}

/// A request, and Hugging Face's ids for it when the fixture has them.
struct Case {
    name: String,
    body: Value,
    hf: Option<Vec<u32>>,
}

/// Both references' prompts greedy (HF's ids), seeded samples, and a stop sequence that may fall
/// in the middle of accepted drafts.
fn cases() -> Vec<Case> {
    let mut out = vec![];
    let reference = Reference::load();
    for p in reference.prompts() {
        let n = p.greedy_ids.len();
        let body = json!({"prompt": p.text, "max_tokens": n, "temperature": 0, "ignore_eos": true, "logprobs": 3});
        out.push(Case { name: format!("greedy {}", p.key), body, hf: Some(p.greedy_ids) });
    }
    for c in sampling_reference()["cases"].as_array().unwrap() {
        let penalty = c["repetition_penalty"].clone();
        let body = json!({"prompt": c["ids"], "max_tokens": 24, "temperature": 0, "repetition_penalty": penalty,
            "ignore_eos": true, "logprobs": 3});
        out.push(Case {
            name: format!("{} penalty {penalty}", c["prompt"]),
            body,
            hf: Some(ids_of(&c["generated_ids"])),
        });
    }
    for seed in 1..=3 {
        let body = json!({"prompt": "The cat sat on", "max_tokens": 40, "temperature": 0.7, "top_k": 8,
            "seed": seed, "ignore_eos": true, "logprobs": 3});
        out.push(Case { name: format!("sampled seed {seed}"), body, hf: None });
    }
    let p = &reference.prompts()[0];
    let stop = &p.greedy_text[10..13];
    let body = json!({"prompt": p.text, "max_tokens": 30, "temperature": 0, "stop": [stop], "ignore_eos": true,
        "logprobs": 3});
    out.push(Case { name: "stop".into(), body, hf: None });
    out
}

/// Every case at once (batched), in order.
fn all_at_once(s: &Server, cases: &[Case]) -> Vec<Value> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = cases.iter().map(|c| sc.spawn(move || s.complete(&c.body))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn with_every_draft_batched_and_after_a_prefix_hit_answers_are_hf_and_the_plain_servers_bits() {
    let cases = cases();
    let plain = Server::start(&["--cache-mb", "0"]);
    for name in [
        "kvgpt_spec_decode_num_drafts_total",
        "kvgpt_spec_decode_num_draft_tokens_total",
        "kvgpt_spec_decode_num_accepted_tokens_total",
    ] {
        assert!(plain.get("/metrics").1.contains(&format!("{name} 0")), "{name} is there from the start");
    }
    let alone: Vec<Value> = cases.iter().map(|c| plain.complete(&c.body)).collect();
    for (c, a) in cases.iter().zip(&alone) {
        if let Some(hf) = &c.hf {
            assert_eq!(&key(a).1, hf, "{}: HF's ids without a draft", c.name);
        }
        assert_eq!(a["usage"]["completion_tokens_details"]["accepted_prediction_tokens"], 0);
    }
    let other = random_model::small_draft_model();
    let other = other.path().display().to_string();
    for flags in [
        // Drafting does not pay on this tiny model: --draft-min has it draft anyway.
        vec!["--draft", "lookup", "--draft-max", "1", "--draft-min", "1"],
        vec!["--draft", "self:w8a8", "--draft-max", "4", "--draft-min", "4"],
        vec!["--draft", "self:q8", "--draft-max", "8", "--draft-min", "2"],
        vec!["--draft-model", &other, "--draft-max", "8", "--draft-min", "8"],
    ] {
        let what = flags.join(" ");
        let s = Server::start(&[&["--parallel", "8"], &flags[..]].concat());
        let batched = all_at_once(&s, &cases);
        let warm: Vec<Value> = cases.iter().map(|c| s.complete(&c.body)).collect();
        let (mut drafted, mut accepted) = (0, 0);
        for ((c, a), (b, w)) in cases.iter().zip(&alone).zip(batched.iter().zip(&warm)) {
            assert_eq!(key(b), key(a), "{what}, {}: batched = alone without a draft", c.name);
            assert_eq!(key(w), key(a), "{what}, {}: after a prefix-cache hit = alone without a draft", c.name);
            let cached = w["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
            assert!(cached > 0 || w["usage"]["prompt_tokens"] == 1, "{what}, {}: a prefix-cache hit", c.name);
            for v in [b, w] {
                let details = &v["usage"]["completion_tokens_details"];
                let (acc, rej) = (
                    details["accepted_prediction_tokens"].as_u64().unwrap(),
                    details["rejected_prediction_tokens"].as_u64().unwrap(),
                );
                assert_eq!(v["usage"]["timings"]["draft_n"], acc + rej);
                assert_eq!(v["usage"]["timings"]["draft_n_accepted"], acc);
                (drafted, accepted) = (drafted + acc + rej, accepted + acc);
            }
        }
        assert!(accepted > 0 && accepted <= drafted, "{what}: {accepted} of {drafted} drafted tokens accepted");
        assert_eq!(s.metric("kvgpt_spec_decode_num_draft_tokens_total"), drafted as f64, "{what}: /metrics");
        assert_eq!(s.metric("kvgpt_spec_decode_num_accepted_tokens_total"), accepted as f64, "{what}: /metrics");
        // `speculative: false` decodes without the draft, to the same answer.
        let mut body = cases[0].body.clone();
        body["speculative"] = json!(false);
        let off = s.complete(&body);
        assert_eq!(key(&off), key(&alone[0]), "{what}: speculative false");
        assert_eq!(off["usage"]["timings"]["draft_n"], 0, "{what}: speculative false drafts nothing");
        let (code, e) = s.post("/v1/completions", &json!({"prompt": "a", "speculative": "no"}));
        assert_eq!((code, e["error"]["param"].as_str()), (400, Some("speculative")), "{e}");
    }
}

#[test]
fn long_answers_batched_with_drafts_are_the_plain_servers_bits() {
    let dir = tempfile::tempdir().unwrap();
    let shape = random_model::Shape { n_embd: 64, n_layer: 2, n_head: 4, n_positions: 256, seed: 3, endless: true };
    random_model::write(dir.path(), shape);
    let body = |prompt: &str, sampling: Value| {
        let mut b = json!({"prompt": prompt, "max_tokens": 200, "ignore_eos": true, "logprobs": 2});
        b.as_object_mut().unwrap().extend(sampling.as_object().unwrap().clone());
        b
    };
    let cases: Vec<Case> = [
        ("greedy", json!({"temperature": 0})),
        ("sampled", json!({"temperature": 0.7, "top_k": 8, "seed": 11})),
        (
            "penalized",
            json!({"temperature": 0.7, "top_k": 8, "seed": 12, "repetition_penalty": 1.3, "presence_penalty": 0.5}),
        ),
        ("greedy, another prompt", json!({"temperature": 0})),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (name, sampling))| {
        let prompt =
            if i == 3 { "Once upon a time" } else { "The quick brown fox jumps over the lazy dog, and the dog" };
        Case { name: name.into(), body: body(prompt, sampling), hf: None }
    })
    .collect();
    let plain = Server::start_model(dir.path(), &["--cache-mb", "0"]);
    let alone: Vec<Value> = cases.iter().map(|c| plain.complete(&c.body)).collect();
    drop(plain);
    for flags in [["--draft", "self:w8a8", "--draft-min", "3"], ["--draft", "lookup", "--draft-min", "1"]] {
        let s = Server::start_model(dir.path(), &[&["--parallel", "4"], &flags[..]].concat());
        for (c, (a, b)) in cases.iter().zip(alone.iter().zip(all_at_once(&s, &cases))) {
            assert_eq!(key(&b), key(a), "{flags:?}, {}: 200 tokens batched with drafts = alone without", c.name);
            assert_eq!(b["usage"]["completion_tokens"], 200);
        }
        assert!(s.metric("kvgpt_spec_decode_num_accepted_tokens_total") > 0.0, "{flags:?} accepted some drafts");
    }
}
