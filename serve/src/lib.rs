//! `kvgpt serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of the engine thread
//! of `kvgpt_core::engine`. The HTTP side parses, tokenizes, checks limits and streams; it never
//! runs model code, and the engine never waits on a socket: they meet at the engine's handle (a
//! request in, a stream of events out).
//!
//! - this file: the options and the server's lifecycle (listen, load, start the engine, drain);
//! - `routes`: the routes and the completion handlers; `facts`: what the server is, said once
//!   (the startup line, `/server_info`, the metrics' limits); `shutdown`: SIGTERM and the drain;
//! - `listen`: connections, the header deadline, the bounded drain; `access`: the host check, the
//!   API key, counting and the log line of every request;
//! - `http`: shared state, body limits, the endpoints that need no engine;
//! - `admission`: read the body, then the core's parse → tokenize → context → submit;
//! - `responses`: the core's answer as one JSON object or as server-sent events;
//! - `api`: the core's OpenAI error object as an HTTP response; `metrics`;
//! - `worker`: what routers read of a replica; `kv_events` (and `kv_wire`, the msgpack form):
//!   the prompt cache's blocks published for them over ZeroMQ.

#![forbid(unsafe_code)]

mod access;
mod admission;
mod api;
mod facts;
mod hosts;
mod http;
mod kv_events;
mod kv_wire;
mod listen;
mod metrics;
mod options;
mod responses;
mod routes;
mod shutdown;
mod worker;
pub mod zmtp;

pub use kv_events::KvEventOptions;
pub use options::{LogFormat, ServeOptions, DEFAULT_PARALLEL};

use anyhow::{Context, Result};
use facts::Facts;
use http::{App, Ready};
use kvgpt_core::engine::{self, EngineConfig};
use kvgpt_core::openai::Served;
use kvgpt_core::speculative::Drafting;
use kvgpt_core::store::{DiskTier, RedisTier, Store, Tier};
use kvgpt_core::Loaded;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, OnceLock};

/// Log lines on stderr: text (ANSI colours only on a terminal) or JSON objects.
fn init_log(format: LogFormat) {
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false);
    let _ = match format {
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => fmt.json().flatten_event(true).try_init(),
    };
}

/// Serves until SIGTERM or Ctrl-C, then drains.
pub fn run(o: &ServeOptions) -> Result<()> {
    o.check()?;
    init_log(o.log_format);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    rt.block_on(serve(o))
}

async fn serve(o: &ServeOptions) -> Result<()> {
    let addr = format!("{}:{}", o.host, o.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("could not listen on {addr}"))?;
    let local = listener.local_addr()?;
    tracing::info!("listening on http://{local} (loading the model; /health answers 503 until it is ready)");
    let metrics = metrics::Metrics::new(http::ROUTES.iter().map(|(path, _)| *path))?;
    let publisher = kv_events::bind_sockets(&o.kv_events, o.load.kv.block(), metrics.clone()).await?;
    let app = Arc::new(App {
        ready: OnceLock::new(),
        api_key: o.api_key.clone(),
        hosts: hosts::Hosts::new(&o.host, &o.allowed_hosts).map_err(anyhow::Error::msg)?,
        max_body: o.max_body_bytes,
        body_timeout: o.body_timeout,
        metrics,
        started: http::now_secs(),
        next_id: AtomicU64::new(1),
        kv_events: publisher.as_ref().map(|p| p.source.clone()),
        draining: AtomicBool::new(false),
        working: AtomicUsize::new(0),
    });
    let stop = shutdown::drain(app.clone(), o.shutdown_timeout);
    let server = tokio::spawn(listen::serve(listener, routes::router(app.clone()), o.header_timeout, stop));

    // Load while the listener already answers /health with 503.
    let (loaded, drafting, pool) = load(o).await?;
    let draft_name = drafting.as_ref().map(|d| d.name.clone());
    let engine_cfg = EngineConfig {
        parallel: o.parallel,
        batch_tokens: o.batch_tokens,
        cache_bytes: o.cache_bytes,
        max_queue: o.max_queue,
        draft: drafting.map(|d| d.config),
        kv_events: publisher.is_some(),
        kv_bytes: o.kv_bytes,
        store: open_store(o, &loaded.model)?,
    };
    let threads = pool.current_num_threads();
    let facts = Facts::new(o, local, &loaded, &engine_cfg, (threads, draft_name.as_deref()));
    app.metrics.limits(&facts.limits());
    let model = Arc::new(loaded.model);
    let monitor = Box::new(app.metrics.monitor());
    let spawned =
        engine::spawn(model.clone(), engine_cfg, monitor, Some(pool)).context("the engine could not start")?;
    if let (Some(p), Some(events)) = (publisher, spawned.kv_events) {
        p.start(events);
    }
    tracing::info!("{}", facts.banner());
    let served = Served {
        tok: Arc::new(loaded.tokenizer),
        name: facts.name.clone(),
        aliases: vec!["kvgpt".into(), o.load.model.clone()],
        engine: spawned.handle.clone(),
    };
    let ready = Ready { served, server_info: facts.server_info() };
    let _ = app.ready.set(ready);

    let open = server.await.context("the server task failed")?;
    if open > 0 {
        tracing::warn!(
            "closed {} still open after --shutdown-timeout {} s, cancelling their sequences",
            kvgpt_core::units::count(open, "connection"),
            o.shutdown_timeout.as_secs()
        );
    }
    // Every connection has finished or been closed; the engine finishes the rest.
    spawned.handle.drain();
    drop(spawned.handle);
    let _ = spawned.thread.join();
    tracing::info!("drained, exiting");
    Ok(())
}

/// Loads the model and the draft on the engine's own threads (and times what drafting costs
/// there): the model, the draft, and the pool.
async fn load(o: &ServeOptions) -> Result<(Loaded, Option<Drafting>, rayon::ThreadPool)> {
    let pool = kvgpt_core::threads::pool(o.threads, "kvgpt-kernel")?;
    let (spec, draft) = (o.load.clone(), o.draft.clone());
    tokio::task::spawn_blocking(move || -> Result<_> {
        let (loaded, drafting) = pool.install(|| -> Result<_> {
            let loaded = spec.load(&mut |note| {
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr(), "{note}");
            })?;
            let drafting = draft.map(|d| d.load(&spec, &loaded)).transpose()?;
            Ok((loaded, drafting))
        })?;
        Ok((loaded, drafting, pool))
    })
    .await?
}

/// The tiers under the pool `o` asks for (`--kv-disk`, then `--kv-redis`), keyed by the loaded
/// model's K/V.
fn open_store(o: &ServeOptions, model: &kvgpt_core::Model) -> Result<Option<Arc<Store>>> {
    let mut tiers: Vec<Box<dyn Tier>> = vec![];
    if let Some((dir, bytes)) = &o.kv_disk {
        let disk =
            DiskTier::open(dir, *bytes).with_context(|| format!("--kv-disk {}: cannot use it", dir.display()))?;
        tiers.push(Box::new(disk));
    }
    if let Some(url) = &o.kv_redis {
        tiers.push(Box::new(RedisTier::open(url).map_err(anyhow::Error::msg)?));
    }
    if tiers.is_empty() {
        return Ok(None);
    }
    let store = Store::for_model(model, tiers).context("the K/V store's writer could not start")?;
    Ok(Some(Arc::new(store.with_verify(o.kv_verify))))
}
