//! The shared tier (`--kv-redis URL`): blocks in a Redis server every replica reaches, under
//! `kvgpt:kv:<key>`, written with `SET … NX` (a key names one content, so whoever writes first
//! wrote what everyone would). Redis itself decides what it keeps (its `maxmemory` and policy).
//!
//! A Redis that is down, slow or full costs speed, never an answer: each read and write on a
//! connection waits 200 ms at most; a failed connection marks the tier down (a warning, the `up` gauge at 0), and calls
//! answer "not here" at once until a reconnect, tried at most once a second, succeeds. A write
//! Redis refuses (full) is counted as skipped. Reads and writes have connections of their own, so
//! the engine's lookups never wait behind the writer's uploads; a load reads its blocks over two
//! more at once, straight into buffers (`store/resp.rs`), falling back to the client's `MGET`.

use super::resp::Bulk;
use super::{BlockKey, Tier};
use redis::{Client, Commands, Connection};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(200);
const RETRY: Duration = Duration::from_secs(1);

pub struct RedisTier {
    client: Client,
    shown: String,
    read: Mutex<Link<Connection>>,
    /// Two connections that read blocks: a load's blocks are read half over each, at once.
    bulk: [Mutex<Link<Bulk>>; 2],
    /// The longest a stored block can be (a longer value is not read: [`Tier::expect_at_most`]).
    max_value: AtomicUsize,
    write: Mutex<Link<Connection>>,
    up: AtomicBool,
    /// Redis refuses commands (full): said once until one is taken again.
    refusing: AtomicBool,
}

/// One connection, or when the next attempt to make one may be.
struct Link<C> {
    conn: Option<C>,
    retry_at: Instant,
}

impl RedisTier {
    /// The tier at `url` (`redis://host:port/db`); errors on a URL Redis cannot take. The server
    /// need not be up yet.
    pub fn open(url: &str) -> Result<RedisTier, String> {
        let client = Client::open(url).map_err(|e| format!("--kv-redis {url}: {e}"))?;
        fn link<C>() -> Mutex<Link<C>> {
            Mutex::new(Link { conn: None, retry_at: Instant::now() })
        }
        // Host, port and database, for the logs: no scheme (said there), no password.
        let shown = url.split('@').next_back().unwrap_or(url).trim_start_matches("redis://").to_string();
        let (up, refusing) = (AtomicBool::new(true), AtomicBool::new(false));
        let tier = RedisTier {
            client,
            shown,
            read: link(),
            bulk: [link(), link()],
            max_value: AtomicUsize::new(usize::MAX),
            write: link(),
            up,
            refusing,
        };
        if !tier.ping() {
            tracing::warn!("the K/V tier redis://{} does not answer yet: serving without it until it does", tier.shown);
        }
        Ok(tier)
    }

    fn ping(&self) -> bool {
        self.call(&self.read, |c| redis::cmd("PING").query::<String>(c)).is_some()
    }

    /// Runs `f` on `link`'s connection (made first if there is none and a retry is due): None when
    /// Redis is down (or refused the command). A connection that breaks is made again at once,
    /// once (a restarted Redis drops every connection it had).
    fn call<T>(
        &self,
        link: &Mutex<Link<Connection>>,
        mut f: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Option<T> {
        let mut l = link.lock().unwrap_or_else(|p| p.into_inner());
        for fresh_try in [false, true] {
            let fresh = l.conn.is_none();
            if fresh && !fresh_try && Instant::now() < l.retry_at {
                return None;
            }
            if fresh {
                match self.connect() {
                    Ok(c) => l.conn = Some(c),
                    Err(e) => {
                        l.retry_at = Instant::now() + RETRY;
                        self.down(&e);
                        return None;
                    }
                }
            }
            match f(l.conn.as_mut().expect("connected")) {
                Ok(v) => {
                    if !self.up.swap(true, Ordering::Relaxed) {
                        tracing::info!("the K/V tier redis://{} answers again", self.shown);
                    }
                    return Some(v);
                }
                Err(e)
                    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() =>
                {
                    l.conn = None;
                    if fresh {
                        l.retry_at = Instant::now() + RETRY;
                        self.down(&e);
                        return None;
                    }
                }
                Err(e) => {
                    if !self.refusing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "the K/V tier redis://{} refused a command ({e}): writes are skipped",
                            self.shown
                        );
                    }
                    return None;
                }
            }
        }
        None
    }

    fn connect(&self) -> redis::RedisResult<Connection> {
        let c = self.client.get_connection_with_timeout(TIMEOUT)?;
        c.set_read_timeout(Some(TIMEOUT))?;
        c.set_write_timeout(Some(TIMEOUT))?;
        Ok(c)
    }

    /// `MGET` of `names` over the bulk connection `link` (made first if there is none and a
    /// retry is due): None when it cannot be had or fails, the caller then asking through the
    /// `redis` crate (which says whether Redis is down). A failure drops the connection (a
    /// reply may be half read) and waits a second before the next attempt.
    fn bulk_mget(&self, link: &Mutex<Link<Bulk>>, names: &[String]) -> Option<Vec<Option<Vec<u8>>>> {
        let mut l = link.lock().unwrap_or_else(|p| p.into_inner());
        if l.conn.is_none() {
            if Instant::now() < l.retry_at {
                return None;
            }
            let max = self.max_value.load(Ordering::Relaxed);
            l.conn = Bulk::connect(self.client.get_connection_info(), TIMEOUT, max)
                .map_err(|e| tracing::debug!("bulk reads from redis://{}: {e}", self.shown))
                .ok();
        }
        let got = l.conn.as_mut()?.mget(names);
        got.map_err(|e| {
            tracing::debug!("a bulk read from redis://{} failed ({e}): read through the client", self.shown);
            l.conn = None;
            l.retry_at = Instant::now() + RETRY;
        })
        .ok()
    }

    /// `MGET` of `names`: over a bulk connection, else through the `redis` crate; None for every
    /// name when Redis cannot answer.
    fn mget(&self, bulk: &Mutex<Link<Bulk>>, names: &[String]) -> Vec<Option<Vec<u8>>> {
        self.bulk_mget(bulk, names)
            .or_else(|| self.call(&self.read, |c| redis::cmd("MGET").arg(names).query::<Vec<Option<Vec<u8>>>>(c)))
            .unwrap_or_else(|| vec![None; names.len()])
    }

    fn down(&self, e: &dyn std::fmt::Display) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!("the K/V tier redis://{} is down ({e}): serving from RAM and disk, retrying", self.shown);
        }
    }
}

fn name(key: BlockKey) -> String {
    format!("kvgpt:kv:{}", key.hex())
}

impl Tier for RedisTier {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn has(&self, key: BlockKey) -> bool {
        self.call(&self.read, |c| c.exists::<_, bool>(name(key))).unwrap_or(false)
    }

    fn has_to_write(&self, key: BlockKey) -> bool {
        self.call(&self.write, |c| c.exists::<_, bool>(name(key))).unwrap_or(false)
    }

    fn has_many(&self, keys: &[BlockKey]) -> Vec<bool> {
        let mut pipe = redis::pipe();
        keys.iter().for_each(|&k| {
            pipe.exists(name(k));
        });
        self.call(&self.read, |c| pipe.query::<Vec<bool>>(c)).unwrap_or_else(|| vec![false; keys.len()])
    }

    fn get_many(&self, keys: &[BlockKey]) -> Vec<Option<Vec<u8>>> {
        if keys.is_empty() {
            return vec![];
        }
        let names: Vec<String> = keys.iter().map(|&k| name(k)).collect();
        if names.len() == 1 {
            return self.mget(&self.bulk[0], &names);
        }
        let (first, second) = names.split_at(names.len() / 2);
        std::thread::scope(|s| {
            let other = std::thread::Builder::new().spawn_scoped(s, || self.mget(&self.bulk[1], second));
            let mut got = self.mget(&self.bulk[0], first);
            // No second thread (or it failed): the second half on this one.
            let rest = other.ok().and_then(|t| t.join().ok()).unwrap_or_else(|| self.mget(&self.bulk[0], second));
            got.extend(rest);
            got
        })
    }

    fn get(&self, key: BlockKey) -> Option<Vec<u8>> {
        self.call(&self.read, |c| c.get::<_, Option<Vec<u8>>>(name(key))).flatten()
    }

    fn put(&self, key: BlockKey, bytes: &[u8]) -> bool {
        let set = |c: &mut Connection| redis::cmd("SET").arg(name(key)).arg(bytes).arg("NX").query::<Option<String>>(c);
        let stored = self.call(&self.write, set).is_some();
        if stored {
            self.refusing.store(false, Ordering::Relaxed); // taking writes again: a refusal is said anew
        }
        stored
    }

    fn remove(&self, key: BlockKey) {
        let _ = self.call(&self.read, |c| c.del::<_, i64>(name(key)));
    }

    fn held(&self) -> Option<(usize, u64)> {
        None
    }

    fn expect_at_most(&self, bytes: usize) {
        self.max_value.store(bytes, Ordering::Relaxed);
    }

    fn up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }
}
