//! A local stand-in for the Hugging Face Hub's file protocol, serving fixture files as one repo,
//! for the tests that download through `HF_ENDPOINT`. It answers as the Hub does (as
//! huggingface_hub and hf-hub read it):
//!
//! - `GET|HEAD /{org}/{name}/resolve/{revision}/{file}` with `X-Repo-Commit` (a 40-hex commit),
//!   `ETag`, `Content-Length`, `Accept-Ranges: bytes`, and `Range: bytes=a-b` / `bytes=a-` as a
//!   206 with `Content-Range: bytes a-b/size` (416 past the end);
//! - an LFS file (`*.safetensors`) as the Hub's 302 to its storage, here `/blobs/{sha256}` on the
//!   same server, with `X-Linked-Etag` (the quoted sha256, which names the blob in the HF cache)
//!   and `X-Linked-Size`; `/blobs/{sha256}` serves the bytes with ranges;
//! - a file the repo lacks as 404 with `X-Error-Code: EntryNotFound`, an unknown repo as the Hub's
//!   401 `RepoNotFound`, an unknown revision as 404 `RevisionNotFound`.
//!
//! A regular file's `ETag` is a stable 40-hex hash of its bytes (the Hub's is git's blob sha1;
//! clients use it only as the blob's name). Every request is recorded, and a [`Fault`] breaks a
//! file's body the way a flaky mirror does.

use super::fixture_dir;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The commit every revision of the served repo resolves to.
pub const COMMIT: &str = "4f6c1b8e2a9d03e7c5b1f8a26d4e9c0b7a3f5e12";

/// How the server breaks the body of a file (a metadata request, `Range: bytes=0-0`, is never
/// broken).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Announce the whole `Content-Length`, send this many bytes of the body, close: every time.
    Drop(usize),
    /// As `Drop`, for the first body only.
    DropOnce(usize),
    /// Send no `Content-Length` (the body ends when the connection closes) and only this many
    /// bytes: a client cannot tell from the response that anything is missing.
    Unframed(usize),
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
    pub status: u16,
}

struct File {
    bytes: Vec<u8>,
    etag: String,
    lfs: bool,
}

struct State {
    repo: String,
    files: HashMap<String, File>,
    faults: Mutex<HashMap<String, Fault>>,
    seen: Mutex<Vec<Seen>>,
}

pub struct HubServer {
    /// The base URL to put in `HF_ENDPOINT`.
    pub endpoint: String,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

impl HubServer {
    /// Serves these files of the fixture as repo `repo` (`org/name`) on an ephemeral port.
    pub fn start(repo: &str, files: &[&str]) -> HubServer {
        let files = files
            .iter()
            .map(|&name| {
                let bytes = std::fs::read(fixture_dir().join(name)).unwrap();
                let lfs = name.ends_with(".safetensors");
                let hash = sha256_hex(&bytes);
                let etag = if lfs { hash } else { hash[..40].to_string() };
                (name.to_string(), File { bytes, etag, lfs })
            })
            .collect();
        let state = Arc::new(State { repo: repo.into(), files, faults: Mutex::default(), seen: Mutex::default() });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop, endpoint) = (state.clone(), stop.clone(), endpoint.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (state, endpoint) = (state.clone(), endpoint.clone());
                    std::thread::spawn(move || serve(&state, &endpoint, conn));
                }
            })
        };
        HubServer { endpoint, state, stop, thread: Some(thread) }
    }

    /// Breaks (or, with `None`, mends) the body of `file`.
    pub fn set_fault(&self, file: &str, fault: Option<Fault>) {
        let mut faults = self.state.faults.lock().unwrap();
        match fault {
            Some(f) => faults.insert(file.into(), f),
            None => faults.remove(file),
        };
    }

    /// The requests served so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The ETag a file is served with: the name of its blob in the HF cache.
    pub fn etag(&self, file: &str) -> String {
        self.state.files[file].etag.clone()
    }

    /// The resolve path of `file` at `main`.
    pub fn resolve_path(&self, file: &str) -> String {
        format!("/{}/resolve/main/{file}", self.state.repo)
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Response {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    /// Send `Content-Length`; false with a fault that leaves the body unframed.
    framed: bool,
    /// Stop after this many body bytes and close.
    cut: Option<usize>,
}

fn reply(status: u16, headers: Vec<(&'static str, String)>) -> Response {
    Response { status, headers, body: Vec::new(), framed: true, cut: None }
}

fn serve(state: &State, endpoint: &str, mut conn: TcpStream) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    let resp = if method == "GET" || method == "HEAD" {
        route(state, endpoint, &path, range.as_deref())
    } else {
        reply(405, vec![])
    };
    state.seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path,
        range,
        authorization: headers.get("authorization").cloned(),
        status: resp.status,
    });
    let reason = match resp.status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Other",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", resp.status);
    for (k, v) in &resp.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if resp.framed {
        head.push_str(&format!("Content-Length: {}\r\n", resp.body.len()));
    }
    head.push_str("Connection: close\r\n\r\n");
    let body =
        if method == "HEAD" { &[][..] } else { &resp.body[..resp.cut.unwrap_or(resp.body.len()).min(resp.body.len())] };
    let _ = conn.write_all(head.as_bytes()).and_then(|()| conn.write_all(body)).and_then(|()| conn.flush());
    let _ = conn.shutdown(Shutdown::Both);
}

fn route(state: &State, endpoint: &str, path: &str, range: Option<&str>) -> Response {
    let error = |status, code: &str, msg: &str| {
        let mut r = reply(status, vec![("X-Error-Code", code.into()), ("X-Error-Message", msg.into())]);
        r.body = msg.as_bytes().to_vec();
        r
    };
    if let Some(sha) = path.strip_prefix("/blobs/") {
        // The storage an LFS file redirects to: bytes, no repo headers.
        return match state.files.iter().find(|(_, f)| f.lfs && f.etag == sha) {
            Some((name, f)) => content(state, name, f, range, vec![("ETag", format!("\"{sha}\""))]),
            None => error(404, "EntryNotFound", "no such blob"),
        };
    }
    let Some((repo, rest)) = path.strip_prefix('/').and_then(|p| p.split_once("/resolve/")) else {
        return error(404, "EntryNotFound", "not a resolve URL");
    };
    if repo != state.repo {
        return error(401, "RepoNotFound", "Repository not found");
    }
    let Some((revision, name)) = rest.split_once('/') else {
        return error(404, "EntryNotFound", "no file named");
    };
    if revision != "main" && revision != COMMIT {
        return error(404, "RevisionNotFound", "Invalid rev id");
    }
    let Some(f) = state.files.get(name) else {
        let mut r = error(404, "EntryNotFound", "Entry not found");
        r.headers.push(("X-Repo-Commit", COMMIT.into()));
        return r;
    };
    let mut headers = vec![("X-Repo-Commit", COMMIT.to_string())];
    if f.lfs {
        headers.push(("Location", format!("{endpoint}/blobs/{}", f.etag)));
        headers.push(("X-Linked-Etag", format!("\"{}\"", f.etag)));
        headers.push(("X-Linked-Size", f.bytes.len().to_string()));
        headers.push(("ETag", format!("\"{}\"", &sha256_hex(f.etag.as_bytes())[..40])));
        return reply(302, headers);
    }
    headers.push(("ETag", format!("\"{}\"", f.etag)));
    content(state, name, f, range, headers)
}

/// A file's bytes, whole or the range asked for, broken as its fault says.
fn content(
    state: &State,
    name: &str,
    f: &File,
    range: Option<&str>,
    mut headers: Vec<(&'static str, String)>,
) -> Response {
    let len = f.bytes.len();
    headers.push(("Accept-Ranges", "bytes".into()));
    let (status, start, end) = match range.and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-')) {
        Some((a, b)) => {
            let start: usize = a.parse().unwrap_or(0);
            let end = b.parse::<usize>().map_or(len.saturating_sub(1), |e| e.min(len - 1));
            if start >= len || start > end {
                headers.push(("Content-Range", format!("bytes */{len}")));
                return reply(416, headers);
            }
            headers.push(("Content-Range", format!("bytes {start}-{end}/{len}")));
            (206, start, end)
        }
        None => (200, 0, len - 1),
    };
    let mut r = reply(status, headers);
    r.body = f.bytes[start..=end].to_vec();
    if r.body.len() > 1 {
        let mut faults = state.faults.lock().unwrap();
        match faults.get(name).copied() {
            Some(Fault::Drop(n)) => r.cut = Some(n),
            Some(Fault::DropOnce(n)) => {
                r.cut = Some(n);
                faults.remove(name);
            }
            Some(Fault::Unframed(n)) => {
                r.framed = false;
                r.cut = Some(n);
            }
            None => {}
        }
    }
    r
}
