//! Publishes what the prompt cache stores and evicts as KV-cache events, over ZeroMQ as vLLM
//! does, so that a router (vllm-router's `kv_aware`) knows which prefixes this replica holds.
//!
//! - live: a PUB socket, one message per engine step that changed whole blocks, three frames
//!   `[topic, seq (i64 big-endian, from 0), msgpack batch]` (the batch: `kvgpt::kv_events`);
//! - replay: a ROUTER socket; a request `[identity, "", start (i64 BE)]` is answered with every
//!   batch kept from `start` on, `[identity, "", topic, seq, batch]`, then `[identity, "", topic,
//!   -1, ""]` (vllm-router's form: vLLM before 0.26 sent no topic frame).
//!
//! The first batch says `AllBlocksCleared`: a router that saw an earlier run of this replica
//! forgets it (a sequence number that starts again at 0 says the same).

use super::metrics::Metrics;
use anyhow::{Context, Result};
use axum::body::Bytes;
use clap::Args;
use kvgpt::kv_events::{block_event, encode_batch, BlockEvent};
use kvgpt::prefix_cache::Change;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

#[derive(Args, Clone, Debug)]
pub struct KvEventArgs {
    /// Publish the prompt cache's stored and evicted blocks (vLLM's KV-cache events) on a ZeroMQ
    /// PUB socket bound here, e.g. tcp://127.0.0.1:5557 (port 0: any free port, printed).
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
    /// Also answer replay requests (a ZeroMQ ROUTER socket bound here) from the last 10000 batches
    /// (at most 64 MiB of them).
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    pub kv_events_replay: Option<String>,
    /// The events' topic (the first frame of every message; vllm-router's static sources use "").
    #[arg(long, value_name = "TOPIC", default_value = "")]
    pub kv_events_topic: String,
    /// Tokens per block in the events (a router counts whole blocks; vllm-router's default is 16).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub kv_block_size: u32,
}

/// Batches kept for replay (vLLM's `buffer_steps`).
const KEPT: usize = 10_000;
/// And at most this many bytes of them (a batch carries its blocks' token ids).
const KEPT_BYTES: usize = 64 << 20;

/// The last [`KEPT`] batches, `(seq, msgpack)`, shared by the publisher and the replay task.
type Kept = Arc<Mutex<Batches>>;

/// Batches in sequence order, `(seq, msgpack)`, and their bytes.
#[derive(Default)]
struct Batches {
    list: VecDeque<(i64, Vec<u8>)>,
    bytes: usize,
}

impl Batches {
    fn push(&mut self, seq: i64, batch: Vec<u8>) {
        self.bytes += batch.len();
        self.list.push_back((seq, batch));
        while self.list.len() > KEPT || self.bytes > KEPT_BYTES {
            self.bytes -= self.list.pop_front().map_or(0, |(_, b)| b.len());
        }
    }

    fn from(&self, start: i64) -> Vec<(i64, Vec<u8>)> {
        self.list.iter().filter(|(s, _)| *s >= start).cloned().collect()
    }
}

/// Where the events are published, as `/kv_event_sources` and the log tell it.
#[derive(Clone, Debug)]
pub struct Source {
    pub endpoint: String,
    pub replay: Option<String>,
    pub topic: String,
}

/// The engine's side: changes go to the publishing task.
#[derive(Clone)]
pub struct Sink(UnboundedSender<Vec<Change>>);

impl Sink {
    pub fn send(&self, changes: Vec<Change>) {
        let _ = self.0.send(changes);
    }
}

/// Binds the sockets and starts publishing; None without --kv-events.
pub async fn start(a: &KvEventArgs, metrics: Metrics) -> Result<Option<(Source, Sink)>> {
    let Some(endpoint) = &a.kv_events else { return Ok(None) };
    let mut publisher = zeromq::PubSocket::new();
    let bound = bind(&mut publisher, endpoint, "--kv-events").await?;
    let kept = Kept::default();
    let replay = match &a.kv_events_replay {
        Some(r) => {
            let mut router = zeromq::RouterSocket::new();
            let at = bind(&mut router, r, "--kv-events-replay").await?;
            tokio::spawn(answer_replays(router, a.kv_events_topic.clone(), kept.clone()));
            Some(at)
        }
        None => None,
    };
    let (tx, rx) = unbounded_channel();
    let topic = a.kv_events_topic.clone();
    let stream = Stream { topic: topic.clone(), block_size: a.kv_block_size as usize, kept, metrics };
    tokio::spawn(publish(publisher, rx, stream));
    let source = Source { endpoint: bound, replay, topic };
    tracing::info!(
        "publishing KV-cache events on {} (topic {:?}, blocks of {} tokens{})",
        source.endpoint,
        source.topic,
        a.kv_block_size,
        source.replay.as_ref().map_or(String::new(), |r| format!(", replay on {r}"))
    );
    Ok(Some((source, Sink(tx))))
}

/// Binds `endpoint`; `tcp://*:P` (vLLM's form for every interface) binds 0.0.0.0. Returns the
/// endpoint to advertise: as bound (with the port chosen for port 0), but every interface as `*`,
/// which routers replace with the replica's own host.
async fn bind(socket: &mut impl Socket, endpoint: &str, flag: &str) -> Result<String> {
    let wanted = endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1);
    let bound = socket.bind(&wanted).await.with_context(|| {
        format!("could not bind {flag} {endpoint}; give a ZeroMQ endpoint such as tcp://127.0.0.1:5557 that is free")
    })?;
    Ok(bound.to_string().replacen("tcp://0.0.0.0:", "tcp://*:", 1))
}

/// What the publishing task keeps: the topic, the block size, the batches for replay, the counters.
struct Stream {
    topic: String,
    block_size: usize,
    kept: Kept,
    metrics: Metrics,
}

fn message(frames: Vec<Vec<u8>>) -> ZmqMessage {
    ZmqMessage::try_from(frames.into_iter().map(Bytes::from).collect::<Vec<_>>()).expect("a message has frames")
}

async fn publish(mut socket: zeromq::PubSocket, mut rx: UnboundedReceiver<Vec<Change>>, s: Stream) {
    let Stream { topic, block_size, kept, metrics } = s;
    let mut seq = 0i64;
    let mut pending = vec![BlockEvent::AllCleared];
    loop {
        if !pending.is_empty() {
            let ts =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let batch = encode_batch(ts, &pending, block_size);
            metrics.kv_events(&pending);
            let frames = vec![topic.as_bytes().to_vec(), seq.to_be_bytes().to_vec(), batch.clone()];
            kept.lock().expect("the replay buffer").push(seq, batch);
            if let Err(e) = socket.send(message(frames)).await {
                tracing::warn!("could not publish KV-cache event batch {seq}: {e}");
            }
            seq += 1;
        }
        let Some(changes) = rx.recv().await else { return };
        pending = changes.iter().filter_map(|c| block_event(c, block_size)).collect();
    }
}

async fn answer_replays(socket: zeromq::RouterSocket, topic: String, kept: Kept) {
    let (mut tx, mut rx) = socket.split();
    loop {
        let Ok(request) = rx.recv().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await; // a peer that failed
            continue;
        };
        let frames = request.into_vec();
        // [identity, "", start]
        let (Some(id), Some(start)) = (frames.first(), frames.last()) else { continue };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(i64::from_be_bytes) else { continue };
        let batches: Vec<(i64, Vec<u8>)> = kept.lock().expect("the replay buffer").from(start);
        let reply = |seq: i64, payload: Vec<u8>| {
            message(vec![id.to_vec(), vec![], topic.as_bytes().to_vec(), seq.to_be_bytes().to_vec(), payload])
        };
        // A peer that stops reading holds this task (one reply at a time) for at most 2 s a message.
        let messages = batches.into_iter().map(|(seq, payload)| reply(seq, payload)).chain([reply(-1, vec![])]);
        for m in messages {
            if !matches!(tokio::time::timeout(std::time::Duration::from_secs(2), tx.send(m)).await, Ok(Ok(()))) {
                break;
            }
        }
    }
}
