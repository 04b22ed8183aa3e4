//! Publishes what the prompt cache stores and evicts as KV-cache events, over ZeroMQ as vLLM
//! does, so that a router (vllm-router's `kv_aware`) knows which prefixes this replica holds.
//!
//! - live: a PUB socket, one message per engine step that changed whole blocks, three frames
//!   `[topic, seq (i64 big-endian, from 0), msgpack batch]` (the batch: `kv_wire`);
//! - replay: a ROUTER socket; a request `[identity, "", start (i64 BE)]` is answered with every
//!   batch kept from `start` on, `[identity, "", topic, seq, batch]`, then `[identity, "", topic,
//!   -1, ""]` (vllm-router's form: vLLM before 0.26 sent no topic frame).
//!
//! The first batch says `AllBlocksCleared`: a router that saw an earlier run of this replica
//! forgets it (a sequence number that starts again at 0 says the same).

use super::kv_wire::encode_batch;
use super::metrics::Metrics;
use anyhow::{Context, Result};
use axum::body::Bytes;
use kvgpt_core::engine::BlockEvent;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// Where and how the KV-cache events are published.
#[derive(Clone, Debug)]
pub struct KvEventOptions {
    /// The ZeroMQ PUB socket's endpoint (None: no events).
    pub endpoint: Option<String>,
    /// The ROUTER socket that answers replay requests, if any.
    pub replay: Option<String>,
    /// The events' topic (the first frame of every message).
    pub topic: String,
    /// Tokens per block in the events.
    pub block_size: usize,
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

/// The publishing task, started when the sockets are bound (its first batch, `AllBlocksCleared`,
/// goes out then); the engine's events reach it once the model is loaded.
pub struct Publisher {
    pub source: Source,
    tx: UnboundedSender<Vec<BlockEvent>>,
}

impl Publisher {
    /// Publishes every batch the engine sends.
    pub fn start(self, mut events: UnboundedReceiver<Vec<BlockEvent>>) {
        tokio::spawn(async move {
            while let Some(batch) = events.recv().await {
                if self.tx.send(batch).is_err() {
                    return;
                }
            }
        });
    }
}

/// Binds the sockets and starts publishing (and answering replays); None without an endpoint.
pub async fn bind_sockets(o: &KvEventOptions, metrics: Metrics) -> Result<Option<Publisher>> {
    let Some(endpoint) = &o.endpoint else { return Ok(None) };
    let mut socket = zeromq::PubSocket::new();
    let bound = bind(&mut socket, endpoint, "--kv-events").await?;
    let kept = Kept::default();
    let replay = match &o.replay {
        Some(r) => {
            let mut router = zeromq::RouterSocket::new();
            let at = bind(&mut router, r, "--kv-events-replay").await?;
            tokio::spawn(answer_replays(router, o.topic.clone(), kept.clone()));
            Some(at)
        }
        None => None,
    };
    let stream = Stream { topic: o.topic.clone(), block_size: o.block_size, kept, metrics };
    let source = Source { endpoint: bound, replay, topic: o.topic.clone() };
    let (tx, rx) = unbounded_channel();
    tokio::spawn(publish(socket, rx, stream));
    tracing::info!(
        "publishing KV-cache events on {} (topic {:?}, blocks of {} tokens{})",
        source.endpoint,
        source.topic,
        o.block_size,
        source.replay.as_ref().map_or(String::new(), |r| format!(", replay on {r}"))
    );
    Ok(Some(Publisher { source, tx }))
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

async fn publish(mut socket: zeromq::PubSocket, mut rx: UnboundedReceiver<Vec<BlockEvent>>, s: Stream) {
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
        let Some(batch) = rx.recv().await else { return };
        pending = batch;
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
