//! A real browser for the HTML viewers' tests: Debian's headless Chromium, driven over WebDriver
//! by its chromedriver, and what its screenshots are read with.

use base64::Engine as _;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// chromium and chromedriver from PATH; without them the test `name` says it skipped, unless
/// KVGPT_REQUIRE_BROWSER=1 (as `.ci/run` sets), where a missing browser fails it.
pub fn find(name: &str) -> Option<(PathBuf, PathBuf)> {
    if let (Some(c), Some(d)) = (on_path("chromium"), on_path("chromedriver")) {
        return Some((c, d));
    }
    let required = std::env::var_os("KVGPT_REQUIRE_BROWSER").is_some_and(|v| v == "1");
    let why = "chromium and chromedriver are not on PATH (Debian: apt-get install chromium chromium-driver)";
    assert!(!required, "KVGPT_REQUIRE_BROWSER=1 but {why}");
    eprintln!("SKIPPED {name}: {why}");
    None
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// A chromedriver on a free loopback port, and one headless Chromium session of it.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = ureq::delete(&format!("{}/session/{}", self.base, self.session)).call();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    pub fn start(chromium: &Path, driver: &Path, profile: &Path) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while ureq::get(&format!("{base}/status")).call().is_err() {
            assert!(start.elapsed() < Duration::from_secs(30), "chromedriver did not answer on {base}");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The flags this machine's closed network needs (no background fetches), and a new profile.
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
            "--force-device-scale-factor=1",
        ];
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium.to_string_lossy(), "args": args}}}});
        let r: Value =
            ureq::post(&format!("{base}/session")).send_json(caps).expect("a Chromium session").into_json().unwrap();
        let session = r["value"]["sessionId"].as_str().unwrap().to_string();
        Browser { driver: child, base, session }
    }

    pub fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let r = match method {
            "GET" => ureq::get(&url).call(),
            _ => ureq::post(&url).send_json(body),
        };
        match r {
            Ok(r) => r.into_json::<Value>().unwrap()["value"].take(),
            Err(ureq::Error::Status(_, r)) => panic!("{method} {path}: {}", r.into_string().unwrap()),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    pub fn open(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url }));
        let start = Instant::now();
        while self.js("return document.body && document.body.dataset.ready === '1'", json!([])) != json!(true) {
            assert!(start.elapsed() < Duration::from_secs(20), "the viewer did not get ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn js(&self, script: &str, args: Value) -> Value {
        self.call("POST", "/execute/sync", json!({ "script": script, "args": args }))
    }

    pub fn element(&self, css: &str) -> String {
        let v = self.call("POST", "/element", json!({ "using": "css selector", "value": css }));
        v.as_object().unwrap().values().next().unwrap().as_str().unwrap().to_string()
    }

    pub fn click(&self, css: &str) {
        let id = self.element(css);
        self.call("POST", &format!("/element/{id}/click"), json!({}));
    }

    /// Asserts that the open page fetched nothing and points nowhere (self-contained).
    pub fn assert_self_contained(&self) {
        assert_eq!(self.js("return performance.getEntriesByType('resource').length", json!([])), json!(0));
        let links = "return document.querySelectorAll('[src],[href],link,iframe,img').length";
        assert_eq!(self.js(links, json!([])), json!(0));
    }

    /// Types `text` into the element (WebDriver key codes for arrows: \u{E012} is ←).
    pub fn keys(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.call("POST", &format!("/element/{id}/value"), json!({ "text": text }));
    }

    /// Moves the real pointer onto the element, as a user's mouse would.
    pub fn hover(&self, css: &str) {
        let id = self.element(css);
        let origin = json!({ "element-6066-11e4-a52e-4f735466cecf": id });
        self.call(
            "POST",
            "/actions",
            json!({"actions": [{"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
                "actions": [{"type": "pointerMove", "duration": 0, "origin": origin, "x": 0, "y": 0}]}]}),
        );
    }

    pub fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call("GET", "/screenshot", json!(null));
        base64::engine::general_purpose::STANDARD.decode(b64.as_str().unwrap()).unwrap()
    }
}

pub fn rgb(css: &str) -> [u8; 3] {
    let inner = css.trim_start_matches("rgb(").trim_end_matches(')');
    let v: Vec<u8> = inner.split(',').map(|x| x.trim().parse().unwrap()).collect();
    [v[0], v[1], v[2]]
}

pub fn luma(c: [u8; 3]) -> f64 {
    0.299 * c[0] as f64 + 0.587 * c[1] as f64 + 0.114 * c[2] as f64
}

/// Runs kvgpt with `args` (a view writing its page, with --json) and returns its JSON.
pub fn kvgpt_json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A PNG screenshot's pixels: `px(x, y)` is the RGB at a CSS pixel (device scale 1).
pub struct Shot {
    width: usize,
    channels: usize,
    data: Vec<u8>,
}

impl Shot {
    pub fn decode(png_bytes: &[u8]) -> Shot {
        let mut reader = png::Decoder::new(std::io::Cursor::new(png_bytes)).read_info().unwrap();
        let mut data = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut data).unwrap();
        Shot { width: info.width as usize, channels: info.color_type.samples(), data }
    }

    pub fn px(&self, x: f64, y: f64) -> [u8; 3] {
        let at = (y as usize * self.width + x as usize) * self.channels;
        [self.data[at], self.data[at + 1], self.data[at + 2]]
    }
}
