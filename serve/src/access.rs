//! Every request passes here first: the `Host`/`Origin` check (`hosts`), the API key, then the handler;
//! on the way out the request is counted, and one log line is written when its response has
//! been sent (a stream's when it ends), with what the handler tallied.

use super::api::ApiError;
use super::http::{drain, Shared};
use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request as HttpRequest, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use kvgpt_core::engine::Usage;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// What a request cost, filled in by the handler that served it and read by its log line, which
/// is written when the last holder lets go: the response sent (a stream's when it ends), and the
/// handler's work on it done (a stream whose client left counts what was consumed until then).
#[derive(Default)]
pub struct Tally {
    /// The request's line, once its response has begun.
    line: std::sync::Mutex<Option<LineHead>>,
    prompt: AtomicU64,
    cached: AtomicU64,
    generated: AtomicU64,
    queue_us: AtomicU64,
    /// The client went away before the response ended.
    left: std::sync::atomic::AtomicBool,
}

impl Tally {
    /// The client went away before the end: the log line says so.
    pub fn client_left(&self) {
        self.left.store(true, Ordering::Relaxed);
    }

    /// Adds finished sequences: `(prompt tokens counted, usage)` as the response's usage counts them.
    pub fn add(&self, usages: &[(usize, Usage)]) {
        for (prompt, u) in usages {
            self.prompt.fetch_add(*prompt as u64, Ordering::Relaxed);
            self.cached.fetch_add(u.cached_tokens as u64, Ordering::Relaxed);
            self.generated.fetch_add(u.completion_tokens as u64, Ordering::Relaxed);
            self.queue_us.fetch_max(u.queue.as_micros() as u64, Ordering::Relaxed);
        }
    }
}

/// The middleware: check, serve, count, and log once the response is sent.
pub async fn front(State(app): State<Shared>, mut req: HttpRequest, next: Next) -> Response {
    let started = Instant::now();
    let endpoint = req.extensions().get::<MatchedPath>().map_or("unmatched", |m| m.as_str()).to_string();
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let tally = Arc::new(Tally::default());
    req.extensions_mut().insert(tally.clone());
    // Until a response is made, the line says the client closed the request (nginx's 499): what
    // it says if the client goes away before one (the handler dropped with this future).
    *tally.line.lock().unwrap_or_else(|p| p.into_inner()) = Some(LineHead { method, path, status: CLOSED, started });
    let work = Work::of(&app, &endpoint);
    let resp = match refusal(&app, &req) {
        Some(e) => {
            // A client that waits to be invited (`Expect: 100-continue`) is answered at once: reading
            // its body would invite it (the `100 Continue` goes out when the body is first read).
            let waits = req.headers().get("expect").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
            if !waits {
                drain(&app, req.into_body()).await;
            }
            e.into_response()
        }
        None => next.run(req).await,
    };
    let status = resp.status().as_u16();
    app.metrics.request(&endpoint, status);
    if let Some(head) = tally.line.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        head.status = status;
    }
    let line = LogLine { _tally: tally, _work: work };
    resp.map(|body| Body::new(Logged { body, line: Some(line) }))
}

/// Why a request is refused before its handler runs: a host this server does not answer, or a
/// missing or wrong API key (`/health` needs no key).
fn refusal(app: &Shared, req: &HttpRequest) -> Option<ApiError> {
    if let Some((header, value)) = app.hosts.refused(req) {
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "host_not_allowed",
            format!(
                "this server does not answer to the {header} `{value}`: on loopback it answers only localhost, \
                 127.0.0.1 and [::1] (a guard against DNS rebinding); to allow that name, start it with \
                 --allowed-host NAME"
            ),
        ));
    }
    let key = app.api_key.as_ref()?;
    let ok = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|k| same_key(k.as_bytes(), key.as_bytes()));
    (!ok && req.uri().path() != "/health").then(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "missing or wrong API key: send `Authorization: Bearer <key>` with the key the server was started with",
        )
    })
}

/// The one rule for an API key, from --api-key, `KVGPT_API_KEY` or --api-key-file alike: clients
/// send it in an HTTP header after `Bearer `, so a key that is empty, holds a space or a
/// character outside printable ASCII could never match, and is refused before the server starts.
pub fn check_api_key(key: &str) -> Result<(), String> {
    let from = "the API key (--api-key, KVGPT_API_KEY or the first line of --api-key-file)";
    let why = match key.chars().find(|c| !c.is_ascii_graphic()) {
        _ if key.is_empty() => "is empty".to_string(),
        Some(c) if c.is_whitespace() => "holds white space".to_string(),
        Some(c) => format!("holds {c:?}, which is not printable ASCII"),
        None => return Ok(()),
    };
    Err(format!(
        "{from} {why}: a client sends the key in an HTTP header, where such a key can never match; \
         use printable ASCII without spaces, or give no key to serve without one"
    ))
}

/// Compares keys in time that depends only on their lengths, not on where they first differ.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The status a log line gives a request whose client went away before its response (nginx's).
const CLOSED: u16 = 499;

/// What the log line says of the request itself.
struct LineHead {
    method: String,
    path: String,
    status: u16,
    started: Instant,
}

/// Held by the response body until it has gone out (or the client left).
struct LogLine {
    _tally: Arc<Tally>,
    _work: Option<Work>,
}

/// A completion request counted in `App::working` until its response has gone out (a drain
/// waits for none to be left).
struct Work(Shared);

impl Work {
    fn of(app: &Shared, endpoint: &str) -> Option<Work> {
        ["/v1/completions", "/v1/chat/completions"].contains(&endpoint).then(|| {
            app.working.fetch_add(1, Ordering::Relaxed);
            Work(app.clone())
        })
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.0.working.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let Some(head) = self.line.get_mut().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
        let t = &*self;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        tracing::info!(
            method = %head.method,
            path = %head.path,
            status = head.status,
            prompt_tokens = get(&t.prompt),
            cached_tokens = get(&t.cached),
            generated_tokens = get(&t.generated),
            queue_ms = ms(Duration::from_micros(get(&t.queue_us))),
            total_ms = ms(head.started.elapsed()),
            "{}",
            if t.left.load(Ordering::Relaxed) || head.status == CLOSED {
                "request (the client left before the end)"
            } else {
                "request"
            }
        );
    }
}

/// A response body that writes its request's log line when it is dropped: after its last
/// byte, or when the client went away.
struct Logged {
    body: Body,
    line: Option<LogLine>,
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.line.take(); // the whole body went out
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
