//! `kvgpt serve` over real HTTP on an ephemeral loopback port, against the fixture: answers equal
//! Hugging Face's greedy continuations and `kvgpt generate` bit for bit (ids, text, logprobs),
//! cold, warm, batched and after eviction; every bad request gets its status and error JSON while
//! the server keeps serving; a client that disconnects frees its slot; SIGTERM drains.

mod common;

use common::server::*;
use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

#[test]
fn completions_equal_hf_and_generate_bit_for_bit() {
    let s = Server::start(&[]);
    let reference = Reference::load();
    let (_, models) = s.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    let name = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(models["data"][0]["max_model_len"], 128);
    // Greedy: Hugging Face's continuation of every reference prompt, as text and as token ids.
    for p in reference.prompts() {
        let n = p.greedy_ids.len();
        let v = s.complete(&json!({"model": name, "prompt": p.text, "max_tokens": n, "temperature": 0,
            "ignore_eos": true, "logprobs": 0}));
        let c = &v["choices"][0];
        assert_eq!(c["text"], p.greedy_text, "{}", p.key);
        assert_eq!(ids_of(&c["logprobs"]["token_ids"]), p.greedy_ids, "{}", p.key);
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(v["usage"]["prompt_tokens"], p.ids.len());
        assert_eq!(v["usage"]["completion_tokens"], n);
    }
    // Token-id prompts give the same as their text.
    let p = &reference.prompts()[1];
    let by_ids = s.complete(&json!({"prompt": p.ids, "max_tokens": 8, "temperature": 0, "ignore_eos": true}));
    assert_eq!(
        by_ids["choices"][0]["text"].as_str().unwrap(),
        &p.greedy_text[..by_ids["choices"][0]["text"].as_str().unwrap().len()]
    );
    // Seeded sampling and logprobs: the same bits as `kvgpt generate`.
    for (prompt, flags) in [
        ("The cat sat on", json!({"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 7})),
        ("Hello, world!", json!({"temperature": 1.3, "seed": 123})),
        ("a", json!({"temperature": 0})),
    ] {
        let mut args = vec!["-n".to_string(), "24".into(), "--ignore-eos".into(), "--logprobs".into(), "3".into()];
        let temp = flags["temperature"].as_f64().unwrap();
        if temp > 0.0 {
            args.extend(["--temperature".into(), temp.to_string(), "--seed".into(), flags["seed"].to_string()]);
        }
        if let Some(k) = flags.get("top_k") {
            args.extend(["--top-k".into(), k.to_string()]);
        }
        if let Some(pp) = flags.get("top_p") {
            args.extend(["--top-p".into(), pp.to_string()]);
        }
        args.push(prompt.to_string());
        let cli = generate(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let mut body = json!({"prompt": prompt, "max_tokens": 24, "ignore_eos": true, "logprobs": 3});
        for (k, v) in flags.as_object().unwrap() {
            body[k] = v.clone();
        }
        let v = s.complete(&body);
        let c = &v["choices"][0];
        assert_eq!(c["text"], cli["text"], "{prompt}: text");
        let (ids, lps, tops) = choice_logprobs(c);
        assert_eq!(ids, ids_of(&cli["generated_ids"]), "{prompt}: ids");
        let cli_lps: Vec<f64> =
            cli["logprobs"].as_array().unwrap().iter().map(|e| e["logprob"].as_f64().unwrap()).collect();
        assert_eq!(lps, cli_lps, "{prompt}: logprobs, bit for bit");
        for (t, e) in tops.iter().zip(cli["logprobs"].as_array().unwrap()) {
            let want: Vec<f64> = e["top"].as_array().unwrap().iter().map(|x| x["logprob"].as_f64().unwrap()).collect();
            assert_eq!(t, &want, "{prompt}: top logprobs");
        }
        // Streamed: the chunks concatenate to the same text, with the same logprobs.
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let events = s.stream("/v1/completions", &body);
        let text: String = events.iter().filter_map(|e| e["choices"][0]["text"].as_str()).collect();
        assert_eq!(text, c["text"].as_str().unwrap(), "{prompt}: streamed text");
        let streamed_lps: Vec<f64> = events
            .iter()
            .filter_map(|e| e["choices"][0]["logprobs"]["token_logprobs"].as_array())
            .flatten()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(streamed_lps, lps, "{prompt}: streamed logprobs");
        let last = events.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["completion_tokens"], 24);
        assert_eq!(events[events.len() - 2]["choices"][0]["finish_reason"], "length");
    }
    // n choices use seeds seed, seed+1, …; echo puts the prompt first; stop cuts before the stop.
    let v = s.complete(&json!({"prompt": "The cat sat on", "max_tokens": 10, "n": 2, "seed": 5, "temperature": 1.0, "ignore_eos": true}));
    let second = generate(&["-n", "10", "--ignore-eos", "--temperature", "1", "--seed", "6", "The cat sat on"]);
    assert_eq!(v["choices"][1]["text"], second["text"]);
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    let greedy = &reference.prompts()[0];
    let v = s.complete(
        &json!({"prompt": greedy.text, "max_tokens": 10, "temperature": 0, "echo": true, "ignore_eos": true}),
    );
    assert!(v["choices"][0]["text"].as_str().unwrap().starts_with(&format!(
        "{}{}",
        greedy.text,
        &greedy.greedy_text[..4]
    )));
    let stop = &greedy.greedy_text[6..9];
    let v = s.complete(
        &json!({"prompt": greedy.text, "max_tokens": 20, "temperature": 0, "stop": [stop], "ignore_eos": true}),
    );
    let cut = &greedy.greedy_text[..greedy.greedy_text.find(stop).unwrap()];
    assert_eq!(v["choices"][0]["text"], cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Chat: the documented template, streamed and not.
    let msgs = json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]);
    let v = s.post("/v1/chat/completions", &json!({"messages": msgs, "max_tokens": 12, "temperature": 0})).1;
    let prompt = "You are terse.\n\nUser: Hi\nAssistant:";
    let plain = s.complete(&json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stop": ["\nUser:"]}));
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        plain["choices"][0]["text"].as_str().unwrap().trim_start()
    );
    assert_eq!(v["object"], "chat.completion");
    let events = s
        .stream("/v1/chat/completions", &json!({"messages": msgs, "max_tokens": 12, "temperature": 0, "stream": true}));
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, v["choices"][0]["message"]["content"].as_str().unwrap());
    // Tokenize against HF's ids; detokenize back.
    let (_, t) = s.post("/tokenize", &json!({"content": greedy.text}));
    assert_eq!(ids_of(&t["tokens"]), greedy.ids);
    let (_, d) = s.post("/detokenize", &json!({"tokens": greedy.ids}));
    assert_eq!(d["content"], greedy.text);
    assert!(s.terminate().success());
}

#[test]
fn prompt_cache_is_bit_identical_cold_warm_batched_and_evicted() {
    // 1 MB of prompt cache: at 1 KB of K/V per position (2 layers × K,V × 64 × f32) ~1000 positions.
    let s = Server::start(&["--cache-mb", "1", "--parallel", "8"]);
    let reference = Reference::load();
    let p2 = reference.prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let system: Vec<u32> = p2.ids[..70].to_vec();
    let request = |q: &[u32], seed: u64| {
        let mut prompt = system.clone();
        prompt.extend_from_slice(q);
        json!({"prompt": prompt, "max_tokens": 16, "temperature": 0.9, "seed": seed, "ignore_eos": true, "logprobs": 2})
    };
    let key = |v: &Value| (v["choices"][0]["text"].clone(), choice_logprobs(&v["choices"][0]));
    let question = &p2.ids[70..76];
    let cold = s.complete(&request(question, 3));
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let warm = s.complete(&request(question, 3));
    assert_eq!(warm["usage"]["prompt_tokens_details"]["cached_tokens"], 75, "all but the last prompt token");
    assert_eq!(warm["usage"]["timings"]["cache_n"], 75);
    assert_eq!(warm["usage"]["timings"]["prompt_n"], 1);
    assert_eq!(key(&warm), key(&cold), "warm = cold");
    // Batched with 7 others of different lengths, all in flight at once.
    let others: Vec<Vec<u32>> = (0..7).map(|i| p2.ids[60 + i..70 + 2 * i].to_vec()).collect();
    let (srv, req) = (&s, &request);
    let answers: Vec<Value> = std::thread::scope(|sc| {
        let mut hs = vec![sc.spawn(move || srv.complete(&req(question, 3)))];
        for o in &others {
            hs.push(sc.spawn(move || srv.complete(&req(o, 11))));
        }
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(key(&answers[0]), key(&cold), "batched = cold");
    for a in &answers[1..] {
        let c = a["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(c >= 70, "another question after the shared system prompt reuses it ({c} cached)");
    }
    // Each of the others alone (the first of them is evicted by now or soon) equals its batched answer.
    // Then prompts unrelated to the system prompt push it out of the 1 MB cache.
    for k in 0..12u32 {
        let unrelated: Vec<u32> = (0..110).map(|i| 1000 + k * 200 + i).collect();
        s.complete(&json!({"prompt": unrelated, "max_tokens": 4, "temperature": 0}));
    }
    assert!(s.metric("kvgpt_prompt_cache_evictions_total") > 0.0, "the metrics show evictions");
    assert!(s.metric("kvgpt_prompt_cache_bytes") <= (1 << 20) as f64);
    let evicted = s.complete(&request(question, 3));
    assert!(evicted["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() < 70, "the entry was evicted");
    assert_eq!(key(&evicted), key(&cold), "after eviction = cold");
    for (o, batched) in others.iter().zip(&answers[1..]) {
        assert_eq!(key(&s.complete(&request(o, 11))), key(batched), "alone = batched");
    }
    // A server with no prompt cache at all gives the same again.
    drop(s);
    let s = Server::start(&["--cache-mb", "0"]);
    let none = s.complete(&request(question, 3));
    assert_eq!(none["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(key(&none), key(&cold), "no cache = cold");
}

/// (path, body, status, error.param, error.code)
type BadCase = (&'static str, String, u16, Option<&'static str>, Option<&'static str>);

#[test]
fn bad_requests_get_error_json_and_the_server_keeps_serving() {
    let s = Server::start(&["--parallel", "4", "--max-queue", "2", "--max-body-bytes", "100000"]);
    let good = json!({"prompt": "The cat", "max_tokens": 3, "temperature": 0});
    let long: Vec<u32> = vec![464; 120];
    let cases: Vec<BadCase> = vec![
        ("/v1/completions", "{not json".into(), 400, None, None),
        ("/v1/completions", "[1, 2]".into(), 400, None, None),
        ("/v1/completions", json!({"max_tokens": 3}).to_string(), 400, Some("prompt"), None),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": "three"}).to_string(), 400, Some("max_tokens"), None),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": -1}).to_string(), 400, Some("max_tokens"), None),
        ("/v1/completions", json!({"prompt": "x", "temperature": 5}).to_string(), 400, Some("temperature"), None),
        ("/v1/completions", json!({"prompt": "x", "top_p": 0}).to_string(), 400, Some("top_p"), None),
        ("/v1/completions", json!({"prompt": "x", "n": 100}).to_string(), 400, Some("n"), None),
        ("/v1/completions", json!({"prompt": "x", "logprobs": 99}).to_string(), 400, Some("logprobs"), None),
        ("/v1/completions", json!({"prompt": "x", "stop": [1]}).to_string(), 400, Some("stop"), None),
        ("/v1/completions", json!({"prompt": [1, 99999999]}).to_string(), 400, Some("prompt"), None),
        ("/v1/completions", json!({"prompt": [50257]}).to_string(), 400, Some("prompt"), None),
        ("/v1/completions", json!({"prompt": "x", "stream": "yes"}).to_string(), 400, Some("stream"), None),
        // A misspelt field is refused, not ignored with the default left in place.
        ("/v1/completions", json!({"prompt": "x", "max_token": 5}).to_string(), 400, Some("max_token"), None),
        ("/v1/chat/completions", json!({"messages": [], "prompt": "x"}).to_string(), 400, Some("prompt"), None),
        (
            "/v1/completions",
            json!({"prompt": long, "max_tokens": 50}).to_string(),
            400,
            Some("max_tokens"),
            Some("context_length_exceeded"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "model": "gpt-4"}).to_string(),
            404,
            Some("model"),
            Some("model_not_found"),
        ),
        ("/v1/completions", json!({"prompt": "x".repeat(200_000)}).to_string(), 413, None, Some("request_too_large")),
        // More sequences than --parallel (4) + --max-queue (2) can ever hold: a 400, not a retry.
        ("/v1/completions", json!({"prompt": "x", "n": 7}).to_string(), 400, Some("n"), None),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 1000}).to_string(),
            400,
            Some("max_completion_tokens"),
            None,
        ),
        ("/v1/chat/completions", json!({"messages": []}).to_string(), 400, Some("messages"), None),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "robot", "content": "x"}]}).to_string(),
            400,
            Some("messages[0].role"),
            None,
        ),
        ("/v1/nothing", "{}".into(), 404, None, Some("not_found")),
    ];
    for (path, body, status, param, code) in cases {
        let (got, v, retry) = s.post_raw(path, &body, None);
        assert_eq!(got, status, "{path} {}: {v}", &body[..body.len().min(80)]);
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{v}");
        }
        if let Some(c) = code {
            assert_eq!(e["code"], c, "{v}");
        }
        if status == 503 {
            assert_eq!(retry.as_deref(), Some("1"), "503 says when to retry");
        }
        if code == Some("context_length_exceeded") {
            let m = e["message"].as_str().unwrap();
            assert!(m.contains("128") && m.contains("120") && m.contains("50"), "the numbers: {m}");
        }
        // And the server still answers a good request.
        assert_eq!(s.post("/v1/completions", &good).0, 200);
    }
    // Fewer sequences than the slots and the queue hold, on an idle server: served, not a 503.
    let (code, v) = s.post("/v1/completions", &json!({"prompt": "x", "n": 3, "max_tokens": 2}));
    assert_eq!((code, v["choices"].as_array().map(Vec::len)), (200, Some(3)), "{v}");
    // Messages name the request's own fields, in plain words.
    let (_, v, _) =
        s.post_raw("/v1/chat/completions", &json!({"messages": [{"role": "tool", "content": "x"}]}).to_string(), None);
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("got \"tool\"") && !m.contains("Some("), "{m}");
    let (_, v, _) = s.post_raw(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1000}).to_string(),
        None,
    );
    let m = v["error"]["message"].as_str().unwrap();
    assert_eq!(v["error"]["param"], "max_tokens");
    // Only the limit can shrink enough here (1000 > the context): the advice names it, in the
    // chat's words (tests/newcomer.rs has a chat whose messages must shrink).
    assert!(m.contains("lower `max_tokens` to at most") && !m.contains("`prompt`"), "{m}");
    // A wrong method gets an error object too, saying which method the endpoint takes.
    let (code, text) = s.get("/v1/completions");
    let v: Value = serde_json::from_str(&text).expect("a 405 with a JSON body");
    assert_eq!((code, v["error"]["code"].as_str()), (405, Some("method_not_allowed")));
    assert!(v["error"]["message"].as_str().unwrap().contains("POST"), "{v}");
    assert!(s.metric("kvgpt_requests_total") >= 40.0);
}

#[test]
fn a_client_that_disconnects_frees_its_slot_and_sigterm_drains() {
    let s = Server::start(&["--parallel", "1"]);
    // Eight choices of 100 tokens in one slot: they run one after another. Read one event, hang up.
    let body = json!({"prompt": "The cat", "max_tokens": 100, "n": 8, "ignore_eos": true, "stream": true});
    let r = ureq::post(&format!("{}/v1/completions", s.base)).send_string(&body.to_string()).unwrap();
    let mut reader = BufReader::new(r.into_reader());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(first.starts_with("data: "));
    drop(reader);
    let t0 = Instant::now();
    while s.metric("kvgpt_sequences_cancelled_total") < 1.0 || s.metric("kvgpt_requests_running") > 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the cancelled sequences were not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let generated = s.metric("kvgpt_generated_tokens_total");
    assert!(generated < 800.0, "the cancelled choices did not all run ({generated} tokens)");
    // The choices still waiting when the client left never start (on main before issue #17 every
    // one was admitted, prefilled and sampled once).
    let started = s.metric("kvgpt_time_to_first_token_seconds_count");
    assert!(started <= 2.0, "{started} of 8 choices started although the client had left");
    // The slot is free: the next request is served.
    assert_eq!(s.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2})).0, 200);
    // SIGTERM while a stream is in flight: the stream still ends with [DONE], then the process exits 0.
    let stream = s.open_stream(&json!({"prompt": "The cat", "max_tokens": 100, "n": 3, "ignore_eos": true,
        "stream": true}));
    s.sigterm();
    finish_stream(stream, 3);
    assert!(s.terminate().success());
}

/// A stop sequence finishes its sequence as a stop, and a length as a length: neither counts as a
/// cancellation, which only a client that leaves causes (on main before the engine seam, a stop
/// sequence was a dropped receiver and counted as cancelled).
#[test]
fn every_sequence_ends_with_its_reason_and_only_a_client_that_leaves_is_cancelled() {
    let s = Server::start(&[]);
    let reference = Reference::load();
    let greedy = &reference.prompts()[0];
    let finished = |reason: &str| format!("kvgpt_sequences_finished_total{{reason=\"{reason}\"}}");
    let (_, text) = s.get("/metrics");
    for reason in ["eos", "length", "stop", "cancelled", "error"] {
        assert!(text.contains(&format!("{} 0", finished(reason))), "{reason} is counted from the start:\n{text}");
    }
    let stop = &greedy.greedy_text[6..9];
    let v = s.complete(
        &json!({"prompt": greedy.text, "max_tokens": 20, "temperature": 0, "stop": [stop], "ignore_eos": true}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let v = s.complete(&json!({"prompt": greedy.text, "max_tokens": 3, "temperature": 0, "ignore_eos": true}));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let t0 = Instant::now();
    while s.metric(&finished("stop")) < 1.0 || s.metric(&finished("length")) < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the engine did not count the stop and the length");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!((s.metric(&finished("stop")), s.metric(&finished("length"))), (1.0, 1.0));
    assert_eq!(s.metric("kvgpt_sequences_cancelled_total"), 0.0, "a stop is not a cancellation");
    assert_eq!(s.metric(&finished("cancelled")), 0.0);
}

/// No silent defaults: without a seed each sampled request draws its own, and says which, so the
/// answer can be asked for again; `/v1/models` shows the model's name, not the server's path,
/// which requests may still give.
#[test]
fn an_unseeded_request_draws_its_seed_and_reports_it_and_the_model_has_a_name() {
    let s = Server::start(&[]);
    let (_, models) = s.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-gpt2");
    let ask = |extra: Value| {
        let mut body = json!({"prompt": "The cat sat on", "max_tokens": 8, "temperature": 1, "ignore_eos": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        s.complete(&body)
    };
    let (a, b) = (ask(json!({})), ask(json!({"model": fixture_dir().display().to_string()})));
    assert_ne!(a["seed"], b["seed"], "each unseeded request draws its own seed");
    for _ in 0..16 {
        // A double holds it exactly: JavaScript's JSON.parse (and Python's float) give it back.
        let seed = ask(json!({"max_tokens": 1}))["seed"].as_u64().unwrap();
        assert!(seed < 1 << 53 && seed as f64 as u64 == seed, "{seed} is past 2^53: a double-based reader rounds it");
    }
    assert_ne!(a["choices"][0]["text"], b["choices"][0]["text"], "so temperature 1 does not repeat itself");
    assert_eq!(a["model"], "tiny-gpt2");
    let again = ask(json!({"seed": a["seed"]}));
    assert_eq!(again["choices"][0]["text"], a["choices"][0]["text"], "the reported seed gives the answer again");
    let cli = generate(&[
        "-n",
        "8",
        "--ignore-eos",
        "--temperature",
        "1",
        "--seed",
        &a["seed"].to_string(),
        "The cat sat on",
    ]);
    assert_eq!(cli["text"], a["choices"][0]["text"], "and so does `kvgpt generate --seed`");
}
