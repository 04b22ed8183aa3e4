//! `kvgpt serve` on an ephemeral loopback port, for the tests that talk to it over HTTP.

use super::fixture_dir;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub base: String,
    /// Every line the server wrote to stderr so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with_env(extra, &[])
    }

    /// As [`Server::start`], with these environment variables set.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        Server::launch(&fixture_dir(), extra, env)
    }

    /// A server for the model in `dir` (not the fixture).
    pub fn start_model(dir: &std::path::Path, extra: &[&str]) -> Server {
        Server::launch(dir, extra, &[])
    }

    fn launch(dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let model = dir.display().to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
            .args(["serve", "--model", &model, "--port", "0", "-t", "2"])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let base = loop {
            let line = lines.next().expect("the server printed its address").unwrap();
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on it, and keep the lines.
        let log = Arc::new(Mutex::new(vec![]));
        let kept = log.clone();
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| kept.lock().unwrap().push(l)));
        let s = Server { child, base, log };
        let t0 = Instant::now();
        while s.get("/health").0 != 200 {
            assert!(t0.elapsed() < Duration::from_secs(60), "the server did not become ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        match ureq::get(&format!("{}{path}", self.base)).call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    pub fn post_raw(&self, path: &str, body: &str, key: Option<&str>) -> (u16, Value, Option<String>) {
        let mut req = ureq::post(&format!("{}{path}", self.base)).set("content-type", "application/json");
        if let Some(k) = key {
            req = req.set("authorization", &format!("Bearer {k}"));
        }
        let (code, r) = match req.send_string(body) {
            Ok(r) => (r.status(), r),
            Err(ureq::Error::Status(code, r)) => (code, r),
            Err(e) => panic!("POST {path}: {e}"),
        };
        let retry = r.header("retry-after").map(str::to_string);
        let text = r.into_string().unwrap();
        (code, serde_json::from_str(&text).unwrap_or(Value::String(text)), retry)
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (c, v, _) = self.post_raw(path, &body.to_string(), None);
        (c, v)
    }

    /// A completion that must succeed.
    pub fn complete(&self, body: &Value) -> Value {
        let (code, v) = self.post("/v1/completions", body);
        assert_eq!(code, 200, "{v}");
        v
    }

    /// A streamed completion: the parsed `data:` events, up to `[DONE]` (which must come).
    pub fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let r = ureq::post(&format!("{}{path}", self.base)).send_string(&body.to_string()).unwrap();
        assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
        let mut events = vec![];
        for line in BufReader::new(r.into_reader()).lines() {
            let line = line.unwrap();
            if let Some(data) = line.strip_prefix("data: ") {
                if data == "[DONE]" {
                    return events;
                }
                events.push(serde_json::from_str(data).unwrap());
            }
        }
        panic!("the stream ended without [DONE]");
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    }

    /// Waits (up to 10 s) until the metric `name` reaches `at_least` (the engine counts a request
    /// when it next steps, which may be after the response's end was logged), and returns it.
    pub fn metric_reaching(&self, name: &str, at_least: f64) -> f64 {
        let t0 = Instant::now();
        loop {
            let v = self.metric(name);
            if v >= at_least || t0.elapsed() > Duration::from_secs(10) {
                return v;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to 10 s) until `n` logged lines satisfy `pred`, and returns them.
    pub fn log_lines(&self, n: usize, pred: impl Fn(&str) -> bool) -> Vec<String> {
        let t0 = Instant::now();
        loop {
            let got: Vec<String> = self.log.lock().unwrap().iter().filter(|l| pred(l)).cloned().collect();
            if got.len() >= n || t0.elapsed() > Duration::from_secs(10) {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a streamed completion and reads its first line; the rest is for [`finish_stream`].
    pub fn open_stream(&self, body: &Value) -> BufReader<Box<dyn std::io::Read + Send + Sync>> {
        let r = ureq::post(&format!("{}/v1/completions", self.base)).send_string(&body.to_string()).unwrap();
        let mut reader = BufReader::new(r.into_reader());
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        assert!(first.starts_with("data: "), "{first}");
        reader
    }

    /// Sends SIGTERM: the server drains, then exits by itself.
    pub fn sigterm(&self) {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
    }

    pub fn terminate(mut self) -> std::process::ExitStatus {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "the server did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a stream that [`Server::open_stream`] opened to its end, which must be `[DONE]` after
/// `choices` choices that finished by length.
pub fn finish_stream(mut reader: impl std::io::Read, choices: usize) {
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(rest.trim_end().ends_with("data: [DONE]"), "the stream in flight finished");
    assert_eq!(rest.matches("\"finish_reason\":\"length\"").count(), choices);
}

pub fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// `kvgpt generate --json` with these flags.
pub fn generate(args: &[&str]) -> Value {
    let model = fixture_dir().display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["generate", "--model", &model, "--json", "-t", "2"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// (ids, logprob, [(top id, top logprob)]) of a completion choice's logprobs.
pub fn choice_logprobs(choice: &Value) -> (Vec<u32>, Vec<f64>, Vec<Vec<f64>>) {
    let lp = &choice["logprobs"];
    let ids = ids_of(&lp["token_ids"]);
    let lps = lp["token_logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let tops = lp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut v: Vec<f64> = m.as_object().unwrap().values().map(|x| x.as_f64().unwrap()).collect();
            v.sort_by(|a, b| b.total_cmp(a));
            v
        })
        .collect();
    (ids, lps, tops)
}

/// A connection to the server at `base`, reads bounded by 20 s.
pub fn connect(base: &str) -> std::net::TcpStream {
    let c = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c
}

/// A raw request: (status, body as JSON).
pub fn raw(base: &str, head: &str, body: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut c = connect(base);
    write!(c, "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    let json = resp.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, json)
}
