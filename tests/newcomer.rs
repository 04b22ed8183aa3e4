//! What a newcomer tripped on (issue #37): requests a new user sends to `kvgpt serve` on the
//! bundled 128-position model — advice that says what must shrink and by how much, numbers as the
//! client sent them, a log that says what a stream consumed, a shutdown that does not wait for
//! requests never finished — and the command line's words and sizes, each against an independent
//! party (HF's tokenizer and config.json, a real socket, the --json the views are drawn from).

mod common;

use common::server::{ids_of, Server};
use common::Reference;
use serde_json::{json, Value};

/// The error of a request that must fail with a 400: (param, message).
fn refused(s: &Server, path: &str, body: &Value) -> (String, String) {
    let (status, v, _) = s.post_raw(path, &body.to_string(), None);
    assert_eq!(status, 400, "{body}: {v}");
    let e = &v["error"];
    (e["param"].as_str().unwrap_or("").to_string(), e["message"].as_str().unwrap().to_string())
}

/// Too long for the context: the error names what must shrink and by how much (never "at most 0"),
/// and a chat's field as the chat endpoint calls it.
#[test]
fn context_errors_say_what_must_shrink_and_by_how_much() {
    let s = Server::start(&[]);
    let ids = |n: usize| vec![464u32; n];
    // 201 prompt tokens on 128 positions: only the prompt can shrink, by 74 (to 127, room for one).
    let (param, m) = refused(&s, "/v1/completions", &json!({"prompt": ids(201)}));
    assert_eq!(param, "prompt", "{m}");
    assert!(m.contains("shorten `prompt` by at least 74 tokens, to 127 or fewer"), "{m}");
    assert!(!m.contains("at most 0") && !m.contains("max_tokens"), "{m}");
    // 120 + 50 asked for: 8 completion tokens fit, or 42 fewer prompt tokens.
    let (param, m) = refused(&s, "/v1/completions", &json!({"prompt": ids(120), "max_tokens": 50}));
    assert_eq!(param, "max_tokens", "{m}");
    assert!(m.contains("lower `max_tokens` to at most 8, or shorten `prompt` by 42 tokens"), "{m}");
    // No max_tokens: completions' default of 16 does not fit the 8 left.
    let (param, m) = refused(&s, "/v1/completions", &json!({"prompt": ids(120)}));
    assert_eq!(param, "max_tokens", "{m}");
    assert!(m.contains("fewer than the default 16: give `max_tokens` of at most 8"), "{m}");
    // A chat too long for any answer, without a limit: the messages must shrink; no field is named
    // that the request did not send, and no "0 completion tokens were asked for".
    let long = "word ".repeat(200);
    let chat = json!({"messages": [{"role": "user", "content": long}]});
    let (param, m) = refused(&s, "/v1/chat/completions", &chat);
    assert_eq!(param, "messages", "{m}");
    assert!(m.contains("shorten `messages` by at least") && !m.contains("max_tokens") && !m.contains(" 0 "), "{m}");
    // A chat's limit is `max_completion_tokens`.
    let chat = json!({"messages": [{"role": "user", "content": "word ".repeat(100)}], "max_completion_tokens": 100});
    let (param, m) = refused(&s, "/v1/chat/completions", &chat);
    assert_eq!(param, "max_completion_tokens", "{m}");
    assert!(m.contains("lower `max_completion_tokens` to at most"), "{m}");
}

/// `top_p` 1e-300 is in (0, 1]: accepted (the smallest share an f32 holds, so the top token
/// alone: Hugging Face's greedy answer), not refused as "got 0"; a value the range refuses is
/// quoted as the client sent it.
#[test]
fn a_tiny_top_p_is_accepted_and_a_refused_value_is_quoted_as_sent() {
    let s = Server::start(&[]);
    let p = Reference::load().prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let n = p.greedy_ids.len();
    let body = json!({"prompt": p.ids, "max_tokens": n, "top_p": 1e-300, "ignore_eos": true, "logprobs": 1});
    let v = s.complete(&body);
    assert_eq!(ids_of(&v["choices"][0]["logprobs"]["token_ids"]), p.greedy_ids);
    let (param, m) = refused(&s, "/v1/completions", &json!({"prompt": "x", "top_p": -1e-300}));
    assert_eq!(param, "top_p");
    assert!(m.ends_with("got -1e-300"), "{m}");
}

/// A stream whose client leaves is logged with what it consumed — its prompt, and the tokens made
/// for it — and that the client left, not as a request that cost nothing; `/metrics` counts the
/// same generation (the engine's count, which may include a token made before it heard).
#[test]
fn a_stream_whose_client_left_is_logged_with_what_it_consumed() {
    use std::io::BufRead;
    let s = Server::start(&[]);
    let p = Reference::load().prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let body = json!({"prompt": p.ids, "max_tokens": 39, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut reader = s.open_stream(&body);
    let mut read = 1; // open_stream read the first
    let mut line = String::new();
    while read < 6 {
        line.clear();
        reader.read_line(&mut line).unwrap();
        read += usize::from(line.starts_with("data: "));
    }
    drop(reader); // the client leaves
    let logged = s.log_lines(1, |l| l.contains("the client left"));
    assert_eq!(logged.len(), 1, "{:?}", s.log_lines(0, |_| true));
    let field = |name: &str| -> u64 {
        let at = logged[0].find(&format!("{name}=")).unwrap_or_else(|| panic!("{name} in {}", logged[0]));
        logged[0][at + name.len() + 1..].split(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(field("prompt_tokens"), p.ids.len() as u64, "{}", logged[0]);
    let generated = field("generated_tokens");
    let counted = s.metric_reaching("kvgpt_generated_tokens_total", generated as f64);
    assert!(generated >= read as u64 - 1 && generated as f64 <= counted, "{generated} logged, {counted} counted");
}

/// One unit rule: the server's startup line and `kvgpt bench` write the same weights as the same
/// binary amount, in MiB — the parameters' f32 bytes derived from config.json, give or take the
/// panels' padding — and no "MB" that means MiB.
#[test]
fn the_server_and_bench_write_sizes_by_one_rule() {
    let s = Server::start(&[]);
    let banner = s.log_lines(1, |l| l.contains(" ready on http")).remove(0);
    let out =
        common::views::kvgpt(&["bench", "-m", &common::model(), "-p", "4", "-n", "2", "-r", "1", "--probe-mib", "0"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let header = text.lines().find(|l| l.starts_with("load ")).unwrap().to_string();
    // "weights 12.7 MiB": the amount after the "weights " that a number follows.
    let weights = |line: &str| {
        let at =
            line.match_indices("weights ").map(|(i, w)| i + w.len()).find(|&i| line[i..].starts_with(char::is_numeric));
        line[at.unwrap()..].split(' ').take(2).collect::<Vec<_>>().join(" ")
    };
    assert_eq!(weights(&banner), weights(&header), "{banner}\n{header}");
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(common::fixture_dir().join("config.json")).unwrap()).unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap();
    let (c, l, v, p) = (n("n_embd"), n("n_layer"), n("vocab_size"), n("n_positions"));
    let params =
        v * c + p * c + 2 * c + l * (4 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * 4 * c + 4 * c) + (4 * c * c + c));
    let mib: f64 = weights(&header).strip_suffix(" MiB").unwrap().parse().unwrap();
    let want = (4 * params) as f64 / 1048576.0;
    assert!(mib >= want - 0.05 && mib < want * 1.01, "{mib} MiB vs {want}");
    for line in [&banner, &header] {
        assert!(!line.contains(" MB"), "{line}");
    }
}

/// A prompt of more bytes than the context's tokens can hold is refused before it is tokenized
/// (encoding one long word takes time that grows with its length squared: an 8 MB word held a core
/// for seconds): the error says the fewest tokens it can be, from the longest token's bytes — the
/// longest piece of Hugging Face's own vocabulary, one byte per character of its byte-level alphabet.
#[test]
fn a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized() {
    let hf = tokenizers::Tokenizer::from_file(common::fixture_dir().join("tokenizer.json")).unwrap();
    let longest = hf.get_vocab(true).keys().map(|p| p.chars().count()).max().unwrap();
    let s = Server::start(&["--max-body-bytes", "3000000"]);
    let word = "a".repeat(2_000_000);
    let (param, m) = refused(&s, "/v1/completions", &json!({"prompt": word}));
    assert_eq!(param, "prompt");
    let fewest = 2_000_000usize.div_ceil(longest);
    assert!(m.contains(&format!("at least {fewest} tokens, since no token holds more than {longest} bytes")), "{m}");
    let chat = json!({"messages": [{"role": "user", "content": word}]});
    let (param, m) = refused(&s, "/v1/chat/completions", &chat);
    assert_eq!(param, "messages", "{m}");
    // A prompt within the bound is tokenized and checked as before.
    let (param, m) = refused(&s, "/v1/completions", &json!({"prompt": "a ".repeat(200)}));
    assert!(param == "prompt" && m.contains("the prompt alone is 201 tokens"), "{m}");
}

/// `Expect: 100-continue` without the API key is answered 401 at once, its body never invited; with
/// the key, the body is invited (`100 Continue`) and the request served.
#[test]
fn a_request_without_the_key_is_not_invited_to_send_its_body() {
    use std::io::{BufRead, BufReader, Write};
    let s = Server::start(&["--api-key", "s3cret"]);
    let body = json!({"prompt": "The cat", "max_tokens": 2}).to_string();
    let ask = |key: &str| {
        let mut c = common::server::connect(&s.base);
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{key}\
             Content-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut first = String::new();
        r.read_line(&mut first).unwrap();
        (c, r, first)
    };
    let (_, _, first) = ask("");
    assert!(first.starts_with("HTTP/1.1 401"), "{first}");
    let (mut c, mut r, first) = ask("Authorization: Bearer s3cret\r\n");
    assert!(first.starts_with("HTTP/1.1 100"), "{first}");
    c.write_all(body.as_bytes()).unwrap();
    let mut status = String::new();
    while !status.starts_with("HTTP/1.1 2") {
        status.clear();
        r.read_line(&mut status).unwrap();
        assert!(!status.is_empty(), "no final answer");
    }
}

/// SIGTERM with a request half sent (its head, or its body) does not wait the whole
/// --shutdown-timeout (30 s) for it: no work has started, so the server stops at once — the half
/// body is answered 503 (shutting down), the half head closed.
#[test]
fn a_shutdown_does_not_wait_for_requests_never_finished() {
    use std::io::{Read, Write};
    let s = Server::start(&["--header-timeout", "60", "--body-timeout", "60"]);
    let mut head = common::server::connect(&s.base);
    head.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: loc").unwrap();
    let mut body = common::server::connect(&s.base);
    let req = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"prompt\": ";
    body.write_all(req.as_bytes()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    let reader = std::thread::spawn(move || {
        let mut resp = String::new();
        let _ = body.read_to_string(&mut resp);
        resp
    });
    let status = s.terminate();
    let took = t0.elapsed();
    assert!(status.success() && took < std::time::Duration::from_secs(10), "{status:?} after {took:?}");
    let resp = reader.join().unwrap();
    assert!(resp.starts_with("HTTP/1.1 503") && resp.contains("shutting down"), "{resp}");
}

/// A misspelt field names the closest of the endpoint's own fields, and the list is the
/// endpoint's (not the fields routers add, which are accepted but not a client's to send).
#[test]
fn an_unknown_field_names_the_closest_one() {
    let s = Server::start(&[]);
    let (param, m) = refused(&s, "/v1/completions", &json!({"prompt": "x", "max_token": 5}));
    assert_eq!(param, "max_token");
    assert!(m.contains("did you mean `max_tokens`?") && !m.contains("no_stop_trim"), "{m}");
    let chat = json!({"messages": [{"role": "user", "content": "x"}], "max_completion_token": 5});
    let (_, m) = refused(&s, "/v1/chat/completions", &chat);
    assert!(m.contains("did you mean `max_completion_tokens`?"), "{m}");
    let (_, m) = refused(&s, "/v1/completions", &json!({"prompt": "x", "qqqq": 1}));
    assert!(!m.contains("did you mean") && m.contains("this endpoint takes"), "{m}");
    // A key of 100 000 characters is named by its first 64, and compared with nothing.
    let mut body = serde_json::Map::new();
    body.insert("prompt".into(), json!("x"));
    body.insert("k".repeat(100_000), json!(1));
    let (param, m) = refused(&s, "/v1/completions", &Value::Object(body));
    assert!(param == format!("{}…", "k".repeat(64)) && m.len() < 2000 && !m.contains("did you mean"), "{param}");
    // A router's field is still taken.
    let ok = s.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 1, "no_stop_trim": false}));
    assert_eq!(ok.0, 200);
}

/// A one-token prompt is "1 prompt token" (HF's tokenizer says "Hi" is one), not "1 prompt tokens".
#[test]
fn one_prompt_token_is_said_in_the_singular() {
    let hf = tokenizers::Tokenizer::from_file(common::fixture_dir().join("tokenizer.json")).unwrap();
    assert_eq!(hf.encode("Hi", false).unwrap().get_ids().len(), 1);
    let disk = tempfile::tempdir().unwrap();
    let out = common::views::kvgpt(&[
        "generate",
        "Hi",
        "-n",
        "2",
        "--model",
        &common::model(),
        "--kv-disk",
        disk.path().to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("reused 0 of 1 prompt token\n"), "{err}");
}

/// `explain`'s cache line multiplies out: layers × 2 × heads·positions·head size floats × 4 bytes,
/// each factor from config.json and HF's tokenizer, and the product.
#[test]
fn explain_says_the_bytes_of_a_float() {
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(common::fixture_dir().join("config.json")).unwrap()).unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap();
    let (l, h, hs) = (n("n_layer"), n("n_head"), n("n_embd") / n("n_head"));
    let hf = tokenizers::Tokenizer::from_file(common::fixture_dir().join("tokenizer.json")).unwrap();
    let t = hf.encode("The cat sat", false).unwrap().get_ids().len() as u64;
    let out = common::views::stdout(&["explain", "The cat sat", "--model", &common::model()]);
    let want = format!("{l} layers × 2 × {h}·{t}·{hs} floats × 4 bytes = {} bytes in use", l * 2 * h * t * hs * 4);
    assert!(out.contains(&want), "{want:?} in {out}");
}

/// More heads than a terminal shows (3 × 6 here), no --layer or --head: each head's top key for
/// the last position and its weight (--json's arg-max), how to pick one; --all prints them all.
#[test]
fn many_heads_get_a_summary_and_how_to_pick_one() {
    let dir = tempfile::tempdir().unwrap();
    common::random_model::write(
        dir.path(),
        common::random_model::Shape { n_embd: 96, n_layer: 3, n_head: 6, n_positions: 64, seed: 3, endless: false },
    );
    let m = dir.path().to_string_lossy().into_owned();
    let text =
        common::views::stdout(&["inspect", "attention", "The cat sat on the mat", "--model", &m, "--width", "100"]);
    assert!(text.contains("All 18 heads at a glance") && text.contains("--layer L --head H"), "{text}");
    let j: Value = serde_json::from_str(&common::views::stdout(&[
        "inspect",
        "attention",
        "The cat sat on the mat",
        "--model",
        &m,
        "--json",
    ]))
    .unwrap();
    let s = j["ids"].as_array().unwrap().len();
    for h in 0..6 {
        let row = text.lines().find(|l| l.starts_with(&format!("head {h} "))).unwrap_or_else(|| panic!("{text}"));
        let cells: Vec<&str> = row.split_whitespace().skip(2).collect();
        for l in 0..3 {
            let w = &j["attention"][l][h][s - 1]; // [layer][head][query][key]
            let w: Vec<f64> =
                w.as_array().unwrap_or_else(|| panic!("{j}")).iter().map(|x| x.as_f64().unwrap()).collect();
            let (k, top) = w.iter().enumerate().fold((0, f64::MIN), |b, (k, &x)| if x > b.1 { (k, x) } else { b });
            assert_eq!(
                (cells[2 * l], cells[2 * l + 1]),
                (k.to_string().as_str(), format!("{top:.2}").as_str()),
                "{row}"
            );
        }
    }
    let all = common::views::stdout(&[
        "inspect",
        "attention",
        "The cat sat on the mat",
        "--model",
        &m,
        "--all",
        "--width",
        "100",
    ]);
    assert!(!all.contains("at a glance") && all.lines().count() > 10 * text.lines().count(), "{all}");
}

/// `inspect cache --color` (as `inspect attention` takes it) paints each query weight of the grid
/// on the pictures' scale: a larger weight a darker blue; `--color never` paints nothing.
#[test]
fn inspect_cache_takes_color_as_attention_does() {
    let run = |when: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvgpt"))
            .args(["inspect", "cache", "The cat sat on the mat", "--model", &common::model(), "--color", when])
            .env("COLORTERM", "truecolor")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = run("always");
    let mut cells: Vec<(f64, f64)> = vec![];
    for line in text.lines().filter(|l| l.contains('↻')) {
        for (rgb, t) in common::views::coloured_cells(line) {
            cells.push((t.parse().unwrap(), common::views::luma(rgb)));
        }
    }
    assert!(cells.len() >= 4 * 6, "{text}");
    cells.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(cells.windows(2).all(|w| w[1].1 <= w[0].1 + 1e-9), "darker as the weight grows: {cells:?}");
    assert!(!run("never").contains('\x1b'));
}
