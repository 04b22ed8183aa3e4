//! ZeroMQ's wire protocol, ZMTP 3.0 with NULL security, for the two sockets kvgpt binds (a PUB for
//! the KV-cache events, a ROUTER for their replay), with every read bounded: a peer may send at
//! most [`MAX_FRAME`] bytes a frame and [`MAX_FRAMES`] frames a message, and one that claims more
//! is dropped before a byte is allocated for it. (The `zeromq` crate reserved whatever length a
//! frame header claimed: a 103-byte message claiming 2^62 bytes aborted the server.)
//!
//! This module is the protocol without I/O ([`Decoder`], and the encoders); [`peer`] runs it over
//! a TCP connection.

pub mod peer;

/// The most bytes one frame (or command) a peer sends may hold: subscriptions, replay requests
/// and the handshake's commands are all far smaller.
pub const MAX_FRAME: usize = 4096;
/// The most frames one message a peer sends may hold.
pub const MAX_FRAMES: usize = 8;

const GREETING: usize = 64;
const MORE: u8 = 0b001;
const LONG: u8 = 0b010;
const COMMAND: u8 = 0b100;

/// What a peer sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inbound {
    /// Its greeting (ZMTP 3.x, NULL security), with its minor version.
    Greeting { minor: u8 },
    /// A command: its name and data (READY, SUBSCRIBE, CANCEL, PING, …).
    Command { name: Vec<u8>, data: Vec<u8> },
    /// A whole message, its frames.
    Message(Vec<Vec<u8>>),
}

/// Why a peer is dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn refused<T>(why: impl Into<String>) -> Result<T, Refused> {
    Err(Refused(why.into()))
}

/// Reads what a peer sends, as it arrives: the greeting, then frames. It holds at most one frame
/// ([`MAX_FRAME`]) and one message's frames ([`MAX_FRAMES`]); anything larger is refused.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    greeted: bool,
    /// The frames of the message being read.
    frames: Vec<Vec<u8>>,
}

impl Decoder {
    /// Takes `bytes`; returns everything they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Inbound>, Refused> {
        let mut out = vec![];
        let mut rest = bytes;
        while !rest.is_empty() {
            let want = self.wanted()?.saturating_sub(self.buf.len()).max(1);
            let (now, later) = rest.split_at(want.min(rest.len()));
            self.buf.extend_from_slice(now);
            rest = later;
            while let Some(item) = self.take()? {
                out.extend(item);
            }
        }
        Ok(out)
    }

    /// The bytes the next item needs in all (a frame's header first, then its body).
    fn wanted(&self) -> Result<usize, Refused> {
        if !self.greeted {
            return Ok(GREETING);
        }
        Ok(match header(&self.buf)? {
            Some((head, len)) => head + len,
            None => 9, // at most a long header
        })
    }

    /// The next whole item in the buffer, if there is one (Some(None): a frame of a message that
    /// goes on).
    fn take(&mut self) -> Result<Option<Option<Inbound>>, Refused> {
        if !self.greeted {
            if self.buf.len() < GREETING {
                return Ok(None);
            }
            let minor = greeting(&self.buf[..GREETING])?;
            self.buf.drain(..GREETING);
            self.greeted = true;
            return Ok(Some(Some(Inbound::Greeting { minor })));
        }
        let Some((head, len)) = header(&self.buf)? else { return Ok(None) };
        if self.buf.len() < head + len {
            return Ok(None);
        }
        let flags = self.buf[0];
        let body = self.buf[head..head + len].to_vec();
        self.buf.drain(..head + len);
        if flags & COMMAND != 0 {
            return command(&body).map(|(name, data)| Some(Some(Inbound::Command { name, data })));
        }
        if self.frames.len() == MAX_FRAMES {
            return refused(format!("a message of more than {MAX_FRAMES} frames"));
        }
        self.frames.push(body);
        if flags & MORE != 0 {
            return Ok(Some(None));
        }
        Ok(Some(Some(Inbound::Message(std::mem::take(&mut self.frames)))))
    }
}

/// A frame's header length and body length, once the header is whole; a body over
/// [`MAX_FRAME`] is refused from its header alone.
fn header(buf: &[u8]) -> Result<Option<(usize, usize)>, Refused> {
    let Some(&flags) = buf.first() else { return Ok(None) };
    if flags & !(MORE | LONG | COMMAND) != 0 {
        return refused(format!("a frame with unknown flags {flags:#04x}"));
    }
    let len = if flags & LONG != 0 {
        let Some(b) = buf.get(1..9) else { return Ok(None) };
        u64::from_be_bytes(b.try_into().expect("8 bytes"))
    } else {
        let Some(&b) = buf.get(1) else { return Ok(None) };
        u64::from(b)
    };
    if len > MAX_FRAME as u64 {
        return refused(format!("a frame of {len} bytes (at most {MAX_FRAME} are taken)"));
    }
    Ok(Some((if flags & LONG != 0 { 9 } else { 2 }, len as usize)))
}

/// Checks a peer's greeting: ZMTP 3.x, NULL security; returns its minor version.
fn greeting(g: &[u8]) -> Result<u8, Refused> {
    if g[0] != 0xff || g[9] & 1 != 1 {
        return refused("not a ZeroMQ peer (its greeting's signature is wrong)");
    }
    if g[10] < 3 {
        return refused(format!("ZMTP {}.{}; kvgpt speaks 3.0 and later", g[10], g[11]));
    }
    let mechanism = &g[12..32];
    if mechanism.iter().take_while(|&&b| b != 0).copied().collect::<Vec<u8>>() != b"NULL" {
        return refused("a security mechanism other than NULL");
    }
    Ok(g[11])
}

/// A command's name and data.
fn command(body: &[u8]) -> Result<(Vec<u8>, Vec<u8>), Refused> {
    let Some((&n, rest)) = body.split_first() else { return refused("an empty command") };
    if rest.len() < n as usize {
        return refused("a command whose name runs past its frame");
    }
    let (name, data) = rest.split_at(n as usize);
    Ok((name.to_vec(), data.to_vec()))
}

/// A READY property: its name and value.
pub type Property = (Vec<u8>, Vec<u8>);

/// The properties of a READY command's data.
pub fn properties(mut data: &[u8]) -> Result<Vec<Property>, Refused> {
    let mut out = vec![];
    while let Some((&n, rest)) = data.split_first() {
        let (name, rest) =
            rest.split_at_checked(n as usize).ok_or(Refused("a property's name runs past READY".into()))?;
        let (len, rest) = rest.split_at_checked(4).ok_or(Refused("a property's length runs past READY".into()))?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let (value, rest) = rest.split_at_checked(len).ok_or(Refused("a property's value runs past READY".into()))?;
        out.push((name.to_vec(), value.to_vec()));
        data = rest;
    }
    Ok(out)
}

/// kvgpt's greeting: ZMTP 3.0, NULL security, not a server of a mechanism.
pub fn our_greeting() -> [u8; GREETING] {
    let mut g = [0u8; GREETING];
    g[0] = 0xff;
    g[9] = 0x7f;
    (g[10], g[11]) = (3, 0);
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// One frame: its header and body.
pub fn frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.extend_from_slice(&[flags, body.len() as u8]);
    }
    out.extend_from_slice(body);
}

/// A message of `frames`.
pub fn message(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(frames.iter().map(|f| f.len() + 9).sum());
    for (i, f) in frames.iter().enumerate() {
        frame(&mut out, if i + 1 < frames.len() { MORE } else { 0 }, f);
    }
    out
}

/// A command frame.
pub fn command_frame(name: &[u8], data: &[u8]) -> Vec<u8> {
    let mut body = vec![name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(data);
    let mut out = vec![];
    frame(&mut out, COMMAND, &body);
    out
}

/// READY, saying this end's socket type.
pub fn ready(socket_type: &str) -> Vec<u8> {
    let mut data = vec![11u8];
    data.extend_from_slice(b"Socket-Type");
    data.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    data.extend_from_slice(socket_type.as_bytes());
    command_frame(b"READY", &data)
}

#[cfg(test)]
mod tests;
