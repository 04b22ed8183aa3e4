//! The decoder against frames spelt out from the ZMTP 3.0 specification (ZeroMQ RFC 23), and
//! against the hostile frames that aborted the server through the `zeromq` crate.

use super::*;

/// A peer's greeting as libzmq sends it: signature, version 3.0, NULL, not a server.
fn their_greeting() -> Vec<u8> {
    let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    g.extend(b"NULL");
    g.extend([0u8; 16]);
    g.push(0);
    g.extend([0u8; 31]);
    assert_eq!(g.len(), 64);
    g
}

/// READY with `Socket-Type: t`, spelt out: flags 0x04, size, name, property.
fn their_ready(t: &str) -> Vec<u8> {
    let mut body = vec![5];
    body.extend(b"READY");
    body.push(11);
    body.extend(b"Socket-Type");
    body.extend((t.len() as u32).to_be_bytes());
    body.extend(t.as_bytes());
    let mut f = vec![0x04, body.len() as u8];
    f.extend(body);
    f
}

#[test]
fn a_greeting_ready_and_message_are_read_whole_or_byte_by_byte() {
    let mut wire = their_greeting();
    wire.extend(their_ready("DEALER"));
    wire.extend([0x01, 0x00]); // an empty frame, more to come
    wire.extend([0x00, 0x08]);
    wire.extend(7i64.to_be_bytes());
    let want = vec![
        Inbound::Greeting { minor: 0 },
        Inbound::Command { name: b"READY".to_vec(), data: their_ready("DEALER")[2 + 6..].to_vec() },
        Inbound::Message(vec![vec![], 7i64.to_be_bytes().to_vec()]),
    ];
    assert_eq!(Decoder::default().push(&wire).unwrap(), want);
    let mut d = Decoder::default();
    let got: Vec<Inbound> = wire.iter().flat_map(|b| d.push(&[*b]).unwrap()).collect();
    assert_eq!(got, want);
    let Inbound::Command { data, .. } = &want[1] else { unreachable!() };
    assert_eq!(properties(data).unwrap(), vec![(b"Socket-Type".to_vec(), b"DEALER".to_vec())]);
}

#[test]
fn a_frame_claiming_more_than_the_bound_is_refused_from_its_header() {
    for claim in [1u64 << 62, 1 << 33, MAX_FRAME as u64 + 1, u64::MAX] {
        for flags in [0x02u8, 0x06] {
            // a long message frame, a long command frame
            let mut wire = their_greeting();
            wire.extend(their_ready("SUB"));
            wire.push(flags);
            wire.extend(claim.to_be_bytes());
            let e = Decoder::default().push(&wire).unwrap_err();
            assert!(e.0.contains("at most 4096"), "{e}");
        }
    }
    // At the bound, it is read.
    let mut wire = their_greeting();
    wire.push(0x02);
    wire.extend((MAX_FRAME as u64).to_be_bytes());
    wire.extend(vec![9u8; MAX_FRAME]);
    assert_eq!(Decoder::default().push(&wire).unwrap()[1], Inbound::Message(vec![vec![9u8; MAX_FRAME]]));
}

#[test]
fn a_message_of_too_many_frames_a_bad_greeting_or_unknown_flags_is_refused() {
    let mut wire = their_greeting();
    for _ in 0..=MAX_FRAMES {
        wire.extend([0x01, 0x00]);
    }
    assert!(Decoder::default().push(&wire).unwrap_err().0.contains("more than 8 frames"));
    let mut curve = their_greeting();
    curve[12..17].copy_from_slice(b"CURVE");
    assert!(Decoder::default().push(&curve).is_err());
    let mut old = their_greeting();
    old[10] = 2;
    assert!(Decoder::default().push(&old).is_err());
    assert!(Decoder::default().push(&[0u8; 64]).is_err(), "no signature");
    let mut flags = their_greeting();
    flags.extend([0x40, 0x00]);
    assert!(Decoder::default().push(&flags).is_err());
    assert!(properties(&[11, b'S']).is_err(), "a property's name past the data");
}

#[test]
fn what_kvgpt_writes_is_what_it_reads() {
    let big = vec![5u8; 300]; // a long frame
    let mut wire = our_greeting().to_vec();
    wire.extend(ready("PUB"));
    wire.extend(message(&[b"topic", &3i64.to_be_bytes(), &big]));
    wire.extend(command_frame(b"PONG", b"ctx"));
    let got = Decoder::default().push(&wire).unwrap();
    assert_eq!(got[0], Inbound::Greeting { minor: 0 });
    let Inbound::Command { name, data } = &got[1] else { panic!("{got:?}") };
    assert_eq!(
        (name.as_slice(), properties(data).unwrap()),
        (&b"READY"[..], vec![(b"Socket-Type".to_vec(), b"PUB".to_vec())])
    );
    assert_eq!(got[2], Inbound::Message(vec![b"topic".to_vec(), 3i64.to_be_bytes().to_vec(), big]));
    assert_eq!(got[3], Inbound::Command { name: b"PONG".to_vec(), data: b"ctx".to_vec() });
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, failure_persistence: None, ..Default::default() })]

    /// The fuzz target's property (fuzz/fuzz_targets/zmtp.rs), on a real peer's bytes mutated:
    /// items within the bounds, or a refusal; never a panic.
    #[test]
    fn any_bytes_in_any_pieces_give_bounded_items_or_a_refusal(
        edits in proptest::collection::vec((0usize..200, proptest::prelude::any::<u8>()), 0..6),
        cut in 1usize..40,
    ) {
        let mut wire = their_greeting();
        wire.extend(their_ready("DEALER"));
        wire.extend([0x01, 0x00, 0x00, 0x08]);
        wire.extend(0i64.to_be_bytes());
        for (at, b) in edits {
            let i = at % wire.len();
            wire[i] = b;
        }
        let mut d = Decoder::default();
        for piece in wire.chunks(cut) {
            match d.push(piece) {
                Ok(items) => {
                    for item in items {
                        if let Inbound::Message(frames) = item {
                            proptest::prop_assert!(frames.len() <= MAX_FRAMES && frames.iter().all(|f| f.len() <= MAX_FRAME));
                        }
                    }
                }
                Err(e) => {
                    proptest::prop_assert!(!e.0.is_empty());
                    break;
                }
            }
        }
    }
}
