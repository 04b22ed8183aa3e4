//! A ZMTP peer over TCP: the handshake (greetings, then READY both ways, the peer's socket type
//! checked) and its messages and commands read through the bounded [`Decoder`].

use super::{our_greeting, properties, ready, Decoder, Inbound, Refused};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// How long a peer may take to greet and say READY.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// What a peer sends after the handshake: its messages and commands, read in bounded pieces.
pub struct Reader {
    half: OwnedReadHalf,
    decoder: Decoder,
    ready: VecDeque<Inbound>,
}

impl Reader {
    /// The next message or command; an error when the peer broke the bounds or the protocol,
    /// or left.
    pub async fn next(&mut self) -> Result<Inbound, Refused> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Ok(item);
            }
            let n = self.half.read(&mut buf).await.map_err(|e| Refused(format!("the connection failed: {e}")))?;
            if n == 0 {
                return Err(Refused("the peer left".into()));
            }
            self.ready.extend(self.decoder.push(&buf[..n])?);
        }
    }
}

/// Greets a peer that connected as `ours` (PUB, ROUTER), and takes its greeting and READY: it
/// must be one of `theirs` (SUB, XSUB; DEALER, REQ, ROUTER). Returns the connection's halves.
pub async fn handshake(stream: TcpStream, ours: &str, theirs: &[&str]) -> Result<(Reader, OwnedWriteHalf), Refused> {
    let _ = stream.set_nodelay(true);
    let (half, mut write) = stream.into_split();
    let mut hello = our_greeting().to_vec();
    hello.extend(ready(ours));
    write.write_all(&hello).await.map_err(|e| Refused(format!("the connection failed: {e}")))?;
    let mut reader = Reader { half, decoder: Decoder::default(), ready: VecDeque::new() };
    let greeted = tokio::time::timeout(HANDSHAKE, async {
        match reader.next().await? {
            Inbound::Greeting { .. } => {}
            _ => return Err(Refused("no greeting".into())),
        }
        match reader.next().await? {
            Inbound::Command { name, data } if name == b"READY" => Ok(data),
            _ => Err(Refused("no READY after the greeting".into())),
        }
    })
    .await
    .map_err(|_| Refused(format!("no greeting and READY within {} s", HANDSHAKE.as_secs())))??;
    let kind = properties(&greeted)?
        .into_iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(b"Socket-Type"))
        .map(|(_, value)| String::from_utf8_lossy(&value).into_owned())
        .unwrap_or_default();
    if !theirs.contains(&kind.as_str()) {
        return Err(Refused(format!("a {kind:?} socket cannot talk to a {ours}")));
    }
    Ok((reader, write))
}
