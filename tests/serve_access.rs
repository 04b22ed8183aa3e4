//! `kvgpt serve`'s front door over real HTTP: the API key (from the flag, the environment or a
//! file), and errors answered before a body is read still reaching a client that is uploading.

mod common;

use common::server::*;
use serde_json::json;
use std::io::Read;

#[test]
fn api_key_is_required_when_set() {
    let s = Server::start(&["--api-key", "sesame"]);
    let body = json!({"prompt": "x", "max_tokens": 2}).to_string();
    let (code, v, _) = s.post_raw("/v1/completions", &body, None);
    assert_eq!((code, v["error"]["code"].as_str()), (401, Some("invalid_api_key")));
    assert_eq!(s.post_raw("/v1/completions", &body, Some("wrong")).0, 401);
    assert_eq!(s.post_raw("/v1/completions", &body, Some("sesame")).0, 200);
    assert_eq!(s.get("/health").0, 200, "health needs no key");
    assert_eq!(s.get("/metrics").0, 401);
}

/// The key can stay out of the process's arguments (which every local user can read in /proc):
/// from `KVGPT_API_KEY`, or from the first line of a file.
#[test]
fn the_api_key_comes_from_the_environment_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, "from-a-file\n").unwrap();
    let body = json!({"prompt": "x", "max_tokens": 2}).to_string();
    for (s, key) in [
        (Server::start_with_env(&[], &[("KVGPT_API_KEY", "from-the-env")]), "from-the-env"),
        (Server::start(&["--api-key-file", file.to_str().unwrap()]), "from-a-file"),
    ] {
        assert_eq!(s.post_raw("/v1/completions", &body, None).0, 401);
        assert_eq!(s.post_raw("/v1/completions", &body, Some("from-the-en")).0, 401, "a prefix is not the key");
        assert_eq!(s.post_raw("/v1/completions", &body, Some(key)).0, 200);
    }
}

/// Sends `method path` with a 4 MiB body over a raw connection, writing all of it before reading:
/// the response as text, or a panic if the server reset the connection.
fn upload(base: &str, method: &str, path: &str, key: Option<&str>) -> String {
    use std::io::Write;
    let mut c = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    let body = vec![b'x'; 4 << 20]; // within the drain bound: 8 × the default 1 MiB limit
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n{auth}Connection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    c.write_all(&body).expect("the server takes the whole body");
    let mut resp = String::new();
    c.read_to_string(&mut resp).expect("the response, not a reset");
    resp
}

/// Errors answered without the body (a wrong key, no such endpoint, a wrong method) still read
/// it, bounded as an oversized body is, so a client still uploading sees the status and the
/// error object instead of a reset connection.
#[test]
fn errors_sent_before_the_body_is_read_reach_a_client_still_uploading() {
    let open = Server::start(&[]);
    let locked = Server::start(&["--api-key", "sesame"]);
    for (s, method, path, key, status, code) in [
        (&locked, "POST", "/v1/completions", None, "401", "invalid_api_key"),
        (&locked, "POST", "/v1/completions", Some("wrong"), "401", "invalid_api_key"),
        (&open, "POST", "/v1/nothing", None, "404", "not_found"),
        (&open, "PUT", "/v1/completions", None, "405", "method_not_allowed"),
    ] {
        let resp = upload(&s.base, method, path, key);
        assert!(resp.starts_with(&format!("HTTP/1.1 {status}")), "{method} {path}: {resp}");
        assert!(resp.contains(&format!("\"code\":\"{code}\"")), "{method} {path}: {resp}");
    }
    assert_eq!(open.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2})).0, 200);
}
