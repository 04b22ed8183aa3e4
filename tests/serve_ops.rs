//! `kvgpt serve` as an operator runs it: slow clients time out and a shutdown is bounded, heavy
//! bodies do not stall other requests, every request leaves one log line (text or JSON), the
//! metrics come in one order from the first scrape, and a loopback server answers only loopback
//! names (DNS rebinding).

mod common;

use common::server::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Whether the server closed `c`: false if it was still open when the read timed out.
fn closed_by_server(c: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true, // reset
        }
    }
}

/// Half a request's headers are cut off after --header-timeout; a body that stops coming gets
/// 408 with an error object after --body-timeout; and SIGTERM does not wait past
/// --shutdown-timeout for a connection that never finishes its request.
#[test]
fn slow_clients_time_out_and_the_shutdown_drain_is_bounded() {
    let s = Server::start(&["--header-timeout", "1", "--body-timeout", "1"]);
    let mut half = connect(&s.base);
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: app").unwrap();
    assert!(closed_by_server(&mut half), "a connection that stopped halfway through its headers was kept open");

    let mut stalled = connect(&s.base);
    let head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"prompt\": ";
    stalled.write_all(head.as_bytes()).unwrap();
    let mut resp = String::new();
    let _ = stalled.read_to_string(&mut resp);
    assert!(resp.starts_with("HTTP/1.1 408"), "{resp}");
    assert!(resp.contains("\"code\":\"request_timeout\"") && resp.contains("--body-timeout"), "{resp}");
    assert_eq!(s.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2})).0, 200);

    // A server that would wait a minute for headers still exits within its shutdown bound.
    let s = Server::start(&["--header-timeout", "60", "--shutdown-timeout", "1"]);
    let mut half = connect(&s.base);
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: loc").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let log = s.log.clone();
    let status = s.terminate();
    assert!(status.success(), "{status:?}");
    let log = log.lock().unwrap().join("\n");
    assert!(log.contains("drained, exiting"), "{log}");
}

/// Tokenizing a large body runs off the async threads: while eight 900 KB `/tokenize` bodies
/// are being tokenized, `/health` is answered before any of them.
#[test]
fn large_tokenize_bodies_do_not_hold_up_other_requests() {
    let s = Server::start(&[]);
    // Words that differ (the tokenizer caches words it has seen), about 900 KB.
    let mut text = String::new();
    let mut x: u64 = 7;
    while text.len() < 900_000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let len = 3 + (x >> 60) as usize;
        text.extend((0..len).map(|i| (b'a' + ((x >> ((i * 5) % 60)) % 26) as u8) as char));
        text.push(' ');
    }
    let body = json!({"content": text}).to_string();
    let order = Arc::new(AtomicUsize::new(0));
    let mut conns: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut c = connect(&s.base);
            c.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
            write!(c, "POST /tokenize HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n", body.len()).unwrap();
            c
        })
        .collect();
    let readers: Vec<_> = conns
        .iter_mut()
        .map(|c| {
            c.write_all(body.as_bytes()).unwrap();
            let mut c = c.try_clone().unwrap();
            let order = order.clone();
            std::thread::spawn(move || {
                let mut head = [0u8; 12];
                c.read_exact(&mut head).unwrap();
                assert_eq!(&head[9..12], b"200");
                order.fetch_add(1, Ordering::SeqCst)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.get("/health").0, 200);
    let health_place = order.fetch_add(1, Ordering::SeqCst);
    let places: Vec<usize> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert_eq!(health_place, 0, "/health came after {health_place} of the tokenize answers ({places:?})");
}

/// One line per request, written when its response has gone out, with its method, path,
/// status, tokens and times; as text or as JSON.
#[test]
fn every_request_is_logged_once_with_its_tokens_and_times() {
    let s = Server::start(&["--log-format", "json"]);
    let v = s.complete(&json!({"prompt": [464, 2068, 7586], "max_tokens": 5, "ignore_eos": true}));
    let events = s.stream("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 3, "stream": true}));
    assert!(!events.is_empty());
    assert_eq!(s.post("/v1/nothing", &json!({})).0, 404);
    let lines = s.log_lines(3, |l| l.contains("\"message\":\"request\"") && !l.contains("/health"));
    let lines: Vec<Value> = lines.iter().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let (first, streamed, missing) = (&lines[0], &lines[1], &lines[2]);
    assert_eq!(
        (first["method"].as_str(), first["path"].as_str(), first["status"].as_u64()),
        (Some("POST"), Some("/v1/completions"), Some(200))
    );
    assert_eq!(first["prompt_tokens"], v["usage"]["prompt_tokens"]);
    assert_eq!(first["generated_tokens"], v["usage"]["completion_tokens"]);
    assert_eq!(first["cached_tokens"], v["usage"]["prompt_tokens_details"]["cached_tokens"]);
    assert!(first["queue_ms"].as_f64().unwrap() >= 0.0 && first["total_ms"].as_f64().unwrap() > 0.0);
    assert!(first["timestamp"].is_string() && first["level"] == "INFO");
    assert_eq!((streamed["generated_tokens"].as_u64(), streamed["prompt_tokens"].as_u64()), (Some(3), Some(1)));
    assert_eq!((missing["path"].as_str(), missing["status"].as_u64()), (Some("/v1/nothing"), Some(404)));

    let s = Server::start(&[]);
    s.complete(&json!({"prompt": [464, 2068], "max_tokens": 4}));
    let lines = s.log_lines(1, |l| l.contains("path=/v1/completions"));
    assert_eq!(lines.len(), 1, "{lines:?}");
    for part in ["INFO", "method=POST", "status=200", "prompt_tokens=2", "generated_tokens=4", "queue_ms=", "total_ms="]
    {
        assert!(lines[0].contains(part), "{part} in {}", lines[0]);
    }
}

fn families(text: &str) -> Vec<String> {
    text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap().to_string()).collect()
}

/// The first scrape already has every counter and histogram (at zero), families come sorted by
/// name and label sets in one order, scrape after scrape.
#[test]
fn metrics_are_present_from_the_start_in_one_order() {
    let s = Server::start(&[]);
    let (_, first) = s.get("/metrics");
    for line in [
        "kvgpt_prompt_tokens_total 0",
        "kvgpt_generated_tokens_total 0",
        "kvgpt_prompt_cached_tokens_total 0",
        "kvgpt_prompt_cache_hits_total 0",
        "kvgpt_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 0",
        "kvgpt_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 0",
        "kvgpt_time_to_first_token_seconds_count 0",
        "kvgpt_request_duration_seconds_count 0",
        "kvgpt_requests_waiting 0",
    ] {
        assert!(first.lines().any(|l| l == line), "{line} missing from the first scrape:\n{first}");
    }
    let names = families(&first);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    for i in 0..4 {
        s.complete(&json!({"prompt": [464 + i], "max_tokens": 2}));
        assert_eq!(s.post("/v1/nothing", &json!({})).0, 404);
        let (_, text) = s.get("/metrics");
        assert_eq!(families(&text), names);
        let requests: Vec<&str> = text.lines().filter(|l| l.starts_with("kvgpt_requests_total{")).collect();
        let mut in_order = requests.clone();
        in_order.sort();
        assert_eq!(requests, in_order);
    }
}

/// DNS rebinding: a page on `evil.example` whose name resolves to 127.0.0.1 reaches a loopback
/// server with `Host: evil.example` (and `Origin: http://evil.example`); such requests get 403
/// with an error object, loopback names pass, and --allowed-host lets a name through.
#[test]
fn a_loopback_server_answers_only_loopback_names() {
    let s = Server::start(&[]);
    let port = s.base.rsplit(':').next().unwrap().to_string();
    let models = "GET /v1/models HTTP/1.1\r\n";
    for host in ["localhost", "127.0.0.1", "[::1]"] {
        let (code, _) = raw(&s.base, &format!("{models}Host: {host}:{port}\r\n"), "");
        assert_eq!(code, 200, "{host}");
    }
    let (code, v) = raw(&s.base, &format!("{models}Host: evil.example:{port}\r\n"), "");
    assert_eq!(code, 403);
    assert_eq!(v["error"]["code"], "host_not_allowed");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("evil.example") && msg.contains("--allowed-host"), "{msg}");
    let post = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: http://evil.example\r\n";
    let (code, v) = raw(&s.base, post, "{\"prompt\": \"x\", \"max_tokens\": 2}");
    assert_eq!((code, v["error"]["code"].as_str()), (403, Some("host_not_allowed")));
    let (code, _) = raw(&s.base, &format!("{models}Host: localhost\r\nOrigin: http://localhost:3000\r\n"), "");
    assert_eq!(code, 200);

    let s = Server::start(&["--allowed-host", "evil.example"]);
    let (code, _) = raw(&s.base, "GET /v1/models HTTP/1.1\r\nHost: evil.example\r\n", "");
    assert_eq!(code, 200);
}
