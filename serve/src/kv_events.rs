//! Publishes what the prompt cache stores and evicts as KV-cache events, over ZeroMQ as vLLM
//! does, so that a router (vllm-router's `kv_aware`) knows which prefixes this replica holds.
//!
//! - live: a PUB socket, one message per engine step that changed whole blocks, three frames
//!   `[topic, seq (i64 big-endian, from 0), msgpack batch]` (the batch: `kv_wire`), to every
//!   subscriber whose subscription is a prefix of the topic;
//! - replay: a ROUTER socket; a request whose last frame is `start` (i64 BE) is answered with every
//!   batch kept from `start` on, `["", topic, seq, batch]`, then `["", topic, -1, ""]`
//!   (vllm-router's form: vLLM before 0.26 sent no topic frame).
//!
//! The first batch says `AllBlocksCleared`: a router that saw an earlier run of this replica
//! forgets it (a sequence number that starts again at 0 says the same).
//!
//! Both sockets speak ZMTP through [`crate::zmtp`], which bounds every frame and message a peer
//! sends; a peer that exceeds a bound (or the protocol) is dropped and the rest go on. At most
//! [`MAX_PEERS`] peers a socket; a subscriber holds at most [`MAX_SUBSCRIPTIONS`] subscriptions; one
//! that reads too slowly misses batches rather than holding the others back (as ZeroMQ's
//! high-water mark does), and the replay's reader gets 2 s a message.

use super::kv_wire::encode_batch;
use super::metrics::Metrics;
use super::zmtp::peer::{handshake, Reader};
use super::zmtp::{command_frame, message, Inbound, Refused};
use anyhow::{Context, Result};
use kvgpt_core::engine::BlockEvent;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Where and how the KV-cache events are published.
#[derive(Clone, Debug)]
pub struct KvEventOptions {
    /// The ZeroMQ PUB socket's endpoint (None: no events).
    pub endpoint: Option<String>,
    /// The ROUTER socket that answers replay requests, if any.
    pub replay: Option<String>,
    /// The events' topic (the first frame of every message).
    pub topic: String,
}

/// Peers each socket serves at once; more are turned away.
pub const MAX_PEERS: usize = 64;
/// Subscriptions one subscriber may hold.
pub const MAX_SUBSCRIPTIONS: usize = 64;
/// Batches a subscriber may be behind before it misses some.
const LAG: usize = 1024;

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

/// A published batch: its topic, and the whole message as it goes on the wire.
struct Published {
    topic: Arc<str>,
    wire: Vec<u8>,
}

/// Binds the sockets and starts publishing (and answering replays); None without an endpoint.
/// Binds the sockets of events over blocks of `block_size` tokens (the pool's).
pub async fn bind_sockets(o: &KvEventOptions, block_size: usize, metrics: Metrics) -> Result<Option<Publisher>> {
    let Some(endpoint) = &o.endpoint else { return Ok(None) };
    let (listener, bound) = bind(endpoint, "--kv-events").await?;
    let kept = Kept::default();
    let topic: Arc<str> = o.topic.as_str().into();
    let replay = match &o.replay {
        Some(r) => {
            let (router, at) = bind(r, "--kv-events-replay").await?;
            let (topic, kept) = (topic.clone(), kept.clone());
            tokio::spawn(accept(router, move |s| replayer(s, topic.clone(), kept.clone())));
            Some(at)
        }
        None => None,
    };
    let (live, _) = broadcast::channel(LAG);
    let live_ = live.clone();
    tokio::spawn(accept(listener, move |s| subscriber(s, live_.subscribe())));
    let stream = Stream { topic: topic.clone(), block_size, kept, metrics, live };
    let source = Source { endpoint: bound, replay, topic: o.topic.clone() };
    let (tx, rx) = unbounded_channel();
    tokio::spawn(publish(rx, stream));
    tracing::info!(
        "publishing KV-cache events on {} (topic {:?}, blocks of {} tokens{})",
        source.endpoint,
        source.topic,
        block_size,
        source.replay.as_ref().map_or(String::new(), |r| format!(", replay on {r}"))
    );
    Ok(Some(Publisher { source, tx }))
}

/// Binds `endpoint` (`tcp://HOST:PORT`; `tcp://*:P`, vLLM's form for every interface, binds
/// 0.0.0.0). Returns the listener and the endpoint to advertise: as bound (with the port chosen
/// for port 0), but every interface as `*`, which routers replace with the replica's own host.
async fn bind(endpoint: &str, flag: &str) -> Result<(TcpListener, String)> {
    let hint = || format!("give a ZeroMQ endpoint such as tcp://127.0.0.1:5557 that is free (not {endpoint})");
    let address =
        endpoint.strip_prefix("tcp://").with_context(|| format!("{flag} takes tcp:// endpoints; {}", hint()))?;
    let address = address.strip_prefix("*:").map_or_else(|| address.to_string(), |port| format!("0.0.0.0:{port}"));
    let listener = TcpListener::bind(&address).await.with_context(|| format!("could not bind {flag}; {}", hint()))?;
    let at = listener.local_addr()?;
    let host = if at.ip().is_unspecified() { "*".to_string() } else { at.ip().to_string() };
    let host = if at.is_ipv6() && host != "*" { format!("[{host}]") } else { host };
    Ok((listener, format!("tcp://{host}:{}", at.port())))
}

/// Serves each peer that connects with `serve`, at most [`MAX_PEERS`] at once.
async fn accept<F, Fut>(listener: TcpListener, serve: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let peers = Arc::new(tokio::sync::Semaphore::new(MAX_PEERS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await; // out of descriptors and the like
            continue;
        };
        let Ok(permit) = peers.clone().try_acquire_owned() else {
            tracing::warn!("turned a KV-event peer away: {MAX_PEERS} are connected");
            continue;
        };
        let served = serve(stream);
        tokio::spawn(async move {
            served.await;
            drop(permit);
        });
    }
}

/// What the publishing task keeps: the topic, the block size, the batches for replay, the
/// counters, and the subscribers' channel.
struct Stream {
    topic: Arc<str>,
    block_size: usize,
    kept: Kept,
    metrics: Metrics,
    live: broadcast::Sender<Arc<Published>>,
}

async fn publish(mut rx: UnboundedReceiver<Vec<BlockEvent>>, s: Stream) {
    let mut seq = 0i64;
    let mut pending = vec![BlockEvent::AllCleared];
    loop {
        if !pending.is_empty() {
            let ts =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let batch = encode_batch(ts, &pending, s.block_size);
            s.metrics.kv_events(&pending);
            let wire = message(&[s.topic.as_bytes(), &seq.to_be_bytes(), &batch]);
            s.kept.lock().expect("the replay buffer").push(seq, batch);
            let _ = s.live.send(Arc::new(Published { topic: s.topic.clone(), wire })); // none subscribed: no one to tell
            seq += 1;
        }
        let Some(batch) = rx.recv().await else { return };
        pending = batch;
    }
}

/// Logs why a peer was dropped (a peer leaving is no news).
fn dropped(what: &str, e: &Refused) {
    if e.0 != "the peer left" {
        tracing::warn!("dropped a KV-event {what}: {e}");
    }
}

/// One subscriber: its subscriptions kept, and every batch whose topic one of them prefixes sent.
async fn subscriber(stream: TcpStream, mut live: broadcast::Receiver<Arc<Published>>) {
    let (mut reader, mut write) = match handshake(stream, "PUB", &["SUB", "XSUB"]).await {
        Ok(halves) => halves,
        Err(e) => return dropped("subscriber", &e),
    };
    let mut subscriptions: Vec<Vec<u8>> = vec![];
    loop {
        tokio::select! {
            inbound = reader.next() => {
                let answer = inbound.and_then(|item| subscription(&mut subscriptions, item));
                match answer {
                    Ok(Some(reply)) if write.write_all(&reply).await.is_err() => return,
                    Ok(_) => {}
                    Err(e) => return dropped("subscriber", &e),
                }
            }
            published = live.recv() => match published {
                Ok(p) => {
                    let wanted = subscriptions.iter().any(|s| p.topic.as_bytes().starts_with(s));
                    if wanted && write.write_all(&p.wire).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!("a KV-event subscriber reads too slowly: it missed {n} batches");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

/// Takes a subscriber's message or command: (un)subscribes (ZMTP 3.0's `\x01topic` / `\x00topic`
/// messages, 3.1's SUBSCRIBE and CANCEL), answers PING; what to write back, if anything.
fn subscription(subscriptions: &mut Vec<Vec<u8>>, item: Inbound) -> Result<Option<Vec<u8>>, Refused> {
    let (subscribe, prefix) = match item {
        Inbound::Message(frames) => match frames.as_slice() {
            [one] if one.first() == Some(&1) => (true, one[1..].to_vec()),
            [one] if one.first() == Some(&0) => (false, one[1..].to_vec()),
            _ => return Ok(None), // a subscriber has nothing else to say
        },
        Inbound::Command { name, data } if name == b"SUBSCRIBE" => (true, data),
        Inbound::Command { name, data } if name == b"CANCEL" => (false, data),
        Inbound::Command { name, data } => return Ok(pong(&name, &data)),
        Inbound::Greeting { .. } => return Err(Refused("a second greeting".into())),
    };
    if !subscribe {
        subscriptions.retain(|s| *s != prefix);
    } else if !subscriptions.contains(&prefix) {
        if subscriptions.len() == MAX_SUBSCRIPTIONS {
            return Err(Refused(format!("more than {MAX_SUBSCRIPTIONS} subscriptions")));
        }
        subscriptions.push(prefix);
    }
    Ok(None)
}

/// PONG for a PING (ZMTP 3.1's heartbeat: its data is a TTL and a context to echo).
fn pong(name: &[u8], data: &[u8]) -> Option<Vec<u8>> {
    (name == b"PING").then(|| command_frame(b"PONG", data.get(2..).unwrap_or_default()))
}

/// One replay peer: each request (its last frame the first sequence number wanted, i64 BE) is
/// answered with the batches kept from there, then the end marker.
async fn replayer(stream: TcpStream, topic: Arc<str>, kept: Kept) {
    let (mut reader, mut write) = match handshake(stream, "ROUTER", &["DEALER", "REQ", "ROUTER"]).await {
        Ok(halves) => halves,
        Err(e) => return dropped("replay peer", &e),
    };
    loop {
        let start = match next_request(&mut reader, &mut write).await {
            Ok(Some(start)) => start,
            Ok(None) => continue,
            Err(e) => return dropped("replay peer", &e),
        };
        let batches: Vec<(i64, Vec<u8>)> = kept.lock().expect("the replay buffer").from(start);
        let reply = |seq: i64, payload: &[u8]| message(&[b"", topic.as_bytes(), &seq.to_be_bytes(), payload]);
        // A peer that stops reading is given at most 2 s a message.
        let replies = batches.iter().map(|(seq, payload)| reply(*seq, payload)).chain([reply(-1, b"")]);
        for r in replies {
            if !matches!(tokio::time::timeout(Duration::from_secs(2), write.write_all(&r)).await, Ok(Ok(()))) {
                return;
            }
        }
    }
}

/// The next replay request's first sequence number (None: something else, answered or ignored).
async fn next_request(reader: &mut Reader, write: &mut OwnedWriteHalf) -> Result<Option<i64>, Refused> {
    match reader.next().await? {
        Inbound::Message(frames) => {
            Ok(frames.last().and_then(|f| <[u8; 8]>::try_from(f.as_slice()).ok()).map(i64::from_be_bytes))
        }
        Inbound::Command { name, data } => {
            if let Some(reply) = pong(&name, &data) {
                write.write_all(&reply).await.map_err(|e| Refused(format!("the connection failed: {e}")))?;
            }
            Ok(None)
        }
        Inbound::Greeting { .. } => Err(Refused("a second greeting".into())),
    }
}
