//! The KV-event sockets against hostile peers: the exact frames that aborted `kvgpt serve` on
//! e3c743f (a ZeroMQ greeting, a READY and one frame header claiming 2^62 or 2^33 bytes, to the
//! replay port and to the events port) drop that peer only; the server keeps serving HTTP, and
//! both sockets keep answering well-behaved peers. (vllm-router speaking to the same sockets is
//! tests/fleet.rs.)

mod common;

use common::server::*;
use kvgpt_serve::zmtp::{properties, Decoder, Inbound};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The greeting libzmq sends: signature, ZMTP 3.0, NULL security.
fn greeting() -> Vec<u8> {
    let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    g.extend(b"NULL");
    g.extend([0u8; 48]);
    g
}

/// READY saying `Socket-Type: t`.
fn ready(t: &str) -> Vec<u8> {
    let mut body = vec![5];
    body.extend(b"READY");
    body.push(11);
    body.extend(b"Socket-Type");
    body.extend((t.len() as u32).to_be_bytes());
    body.extend(t.as_bytes());
    [vec![0x04, body.len() as u8], body].concat()
}

fn endpoints(s: &Server) -> (String, String) {
    let line = s.log_lines(1, |l| l.contains("publishing KV-cache events on")).remove(0);
    let after = |key: &str| line.split(key).nth(1).unwrap().split([' ', ')']).next().unwrap().to_string();
    let strip = |e: String| e.trim_start_matches("tcp://").to_string();
    (strip(after("events on ")), strip(after("replay on ")))
}

fn connect(address: &str) -> TcpStream {
    let s = TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads until `n` items have come (the peer's greeting counts as one).
fn read_items(s: &mut TcpStream, n: usize) -> Vec<Inbound> {
    let (mut d, mut got, mut buf) = (Decoder::default(), vec![], [0u8; 4096]);
    while got.len() < n {
        let k = s.read(&mut buf).unwrap_or_else(|e| panic!("nothing more after {got:?}: {e}"));
        assert!(k > 0, "the server closed the connection after {got:?}");
        got.extend(d.push(&buf[..k]).unwrap());
    }
    got
}

/// The hostile bytes: greeting, READY, then a long frame header claiming `claim` bytes (a
/// command frame with `command`). The server must close the connection.
fn hostile(address: &str, socket_type: &str, claim: u64, command: bool) {
    let mut s = connect(address);
    let mut wire = [greeting(), ready(socket_type)].concat();
    wire.push(if command { 0x06 } else { 0x02 });
    wire.extend(claim.to_be_bytes());
    if socket_type == "DEALER" {
        assert_eq!(wire.len(), 103, "the issue's 103 bytes");
    }
    s.write_all(&wire).unwrap();
    let mut rest = vec![];
    // The server closes the connection (an end of file, or a reset): it does not wait for more.
    if let Err(e) = s.read_to_end(&mut rest) {
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        assert!(!matches!(e.kind(), WouldBlock | TimedOut), "the server kept a peer that claimed {claim} bytes");
    }
    // What it read before the close: the server's greeting and READY, nothing more.
    let items = Decoder::default().push(&rest).unwrap_or_default();
    assert!(items.len() <= 2, "{items:?}");
}

#[test]
fn frames_claiming_exabytes_drop_their_peer_and_the_server_goes_on() {
    let s = Server::start(&["--kv-events", "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0"]);
    let (live, replay) = endpoints(&s);
    for claim in [1u64 << 62, 1 << 33] {
        hostile(&replay, "DEALER", claim, false);
        hostile(&live, "SUB", claim, true);
        hostile(&live, "SUB", claim, false);
    }
    assert_eq!(s.get("/health").0, 200, "the server is alive");

    // The replay socket answers a well-formed request: the first batch (AllBlocksCleared), then
    // the end marker, as ["", topic, seq, batch].
    let mut r = connect(&replay);
    r.write_all(&[greeting(), ready("DEALER"), vec![0x01, 0x00, 0x00, 0x08], 0i64.to_be_bytes().to_vec()].concat())
        .unwrap();
    let items = read_items(&mut r, 4);
    let Inbound::Command { name, data } = &items[1] else { panic!("{items:?}") };
    assert_eq!(name, b"READY");
    assert_eq!(properties(data).unwrap(), vec![(b"Socket-Type".to_vec(), b"ROUTER".to_vec())]);
    let Inbound::Message(first) = &items[2] else { panic!("{items:?}") };
    assert_eq!((first.len(), first[0].as_slice(), first[2].as_slice()), (4, &b""[..], &0i64.to_be_bytes()[..]));
    assert_eq!(items[3], Inbound::Message(vec![vec![], vec![], (-1i64).to_be_bytes().to_vec(), vec![]]));

    // A subscriber (ZMTP 3.0's subscription message: 0x01 and the topic prefix, empty: all) gets
    // the batch a completion stores.
    let mut sub = connect(&live);
    sub.write_all(&[greeting(), ready("SUB"), vec![0x00, 0x01, 0x01]].concat()).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // the subscription reaches the server
    let prompt = "The cat sat on the mat and looked at the dog, who sat on the rug by the door. ".repeat(2);
    let (status, _) = s.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 2})); // 40 tokens: 2 blocks
    assert_eq!(status, 200);
    let Inbound::Message(batch) = read_items(&mut sub, 3).remove(2) else { panic!("not a message") }; // after greeting, READY
    assert_eq!(batch.len(), 3, "[topic, seq, msgpack batch]");
    assert!(i64::from_be_bytes(batch[1].as_slice().try_into().unwrap()) >= 1);
}
