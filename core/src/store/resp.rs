//! Reading many blocks from Redis at the speed of the socket: `MGET` sent and its reply read
//! straight into one buffer per block. The `redis` crate does everything else (lookups, writes,
//! removal); its reply parser takes ~4× the socket's time on 18 MB of blocks (measured: 15 ms
//! against 4 ms, DESIGN.md), and the step loop waits for a load. Speaks RESP2 over TCP or a Unix
//! socket, and signs in as the URL says (`AUTH`, `SELECT`).

use redis::{ConnectionAddr, ConnectionInfo};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The longest reply line read (a type byte, a count, CRLF; or a short error).
const MAX_LINE: u64 = 4096;

/// A stream to Redis (TCP, or a Unix socket).
trait Stream: Read + Write + Send {}
impl<S: Read + Write + Send> Stream for S {}

/// One connection that only reads blocks, none longer than `max` bytes.
pub(super) struct Bulk {
    stream: BufReader<Box<dyn Stream>>,
    max: usize,
}

/// Why a read failed: the connection (it is dropped), or Redis said no (an error reply).
#[derive(Debug)]
pub(super) enum BulkError {
    Io(io::Error),
    Refused(String),
}

impl From<io::Error> for BulkError {
    fn from(e: io::Error) -> Self {
        BulkError::Io(e)
    }
}

impl std::fmt::Display for BulkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BulkError::Io(e) => write!(f, "{e}"),
            BulkError::Refused(m) => write!(f, "{m}"),
        }
    }
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

impl Bulk {
    /// A connection to the Redis `info` names (each of its addresses tried in turn), signed in
    /// and on its database, whose every read and write waits `timeout` at most, for values of
    /// at most `max` bytes.
    pub(super) fn connect(info: &ConnectionInfo, timeout: Duration, max: usize) -> Result<Bulk, BulkError> {
        let stream: Box<dyn Stream> = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
                let mut tried = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))?
                    .map(|addr| TcpStream::connect_timeout(&addr, timeout).map_err(|e| last = e));
                let s = tried.find_map(Result::ok).ok_or(last)?;
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Box::new(s)
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                let s = std::os::unix::net::UnixStream::connect(path)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Box::new(s)
            }
            other => return Err(BulkError::Refused(format!("{other:?} is not read in bulk"))),
        };
        let mut bulk = Bulk { stream: BufReader::with_capacity(1 << 16, stream), max };
        let r = info.redis_settings();
        match (r.username(), r.password()) {
            (Some(user), Some(pass)) => bulk.ok(&[b"AUTH", user.as_bytes(), pass.as_bytes()])?,
            (None, Some(pass)) => bulk.ok(&[b"AUTH", pass.as_bytes()])?,
            _ => {}
        }
        if r.db() != 0 {
            bulk.ok(&[b"SELECT", r.db().to_string().as_bytes()])?;
        }
        Ok(bulk)
    }

    /// Sends `args` and expects a simple `+…` reply.
    fn ok(&mut self, args: &[&[u8]]) -> Result<(), BulkError> {
        self.stream.get_mut().write_all(&command(args))?;
        let line = self.line()?;
        match line.first() {
            Some(b'+') => Ok(()),
            _ => Err(BulkError::Refused(String::from_utf8_lossy(&line).into_owned())),
        }
    }

    /// One reply line, without its CRLF.
    fn line(&mut self) -> Result<Vec<u8>, BulkError> {
        let mut line = vec![];
        (&mut self.stream).take(MAX_LINE).read_until(b'\n', &mut line)?;
        if !line.ends_with(b"\r\n") {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a reply line was cut").into());
        }
        line.truncate(line.len() - 2);
        if line.first() == Some(&b'-') {
            return Err(BulkError::Refused(String::from_utf8_lossy(&line[1..]).into_owned()));
        }
        Ok(line)
    }

    /// The number after a reply line's type byte (`*`, `$`), which must be `kind`.
    fn count(&mut self, kind: u8) -> Result<i64, BulkError> {
        let line = self.line()?;
        let n = (line.first() == Some(&kind)).then(|| std::str::from_utf8(&line[1..]).ok()?.parse().ok()).flatten();
        n.ok_or_else(|| BulkError::Refused(format!("not a RESP reply: {}", String::from_utf8_lossy(&line))))
    }

    /// The values of `names`, in order (None for a missing one).
    pub(super) fn mget(&mut self, names: &[String]) -> Result<Vec<Option<Vec<u8>>>, BulkError> {
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(names.iter().map(|n| n.as_bytes()));
        self.stream.get_mut().write_all(&command(&args))?;
        if self.count(b'*')? != names.len() as i64 {
            return Err(BulkError::Refused("MGET answered another number of values".into()));
        }
        let mut out = Vec::with_capacity(names.len());
        for _ in names {
            let len = self.count(b'$')?;
            if len < 0 {
                out.push(None);
                continue;
            }
            if len as u64 > self.max as u64 {
                return Err(BulkError::Refused(format!("a value of {len} bytes, longer than any block")));
            }
            let mut value = vec![0u8; len as usize + 2];
            self.stream.read_exact(&mut value)?;
            if !value.ends_with(b"\r\n") {
                return Err(BulkError::Refused("a value not followed by CRLF".into()));
            }
            value.truncate(len as usize);
            out.push(Some(value));
        }
        Ok(out)
    }
}
