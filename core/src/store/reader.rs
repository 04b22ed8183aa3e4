//! The read side of the store: finding what the tiers hold past the prompt cache, reading and
//! checking it, and a thread that does both ahead of admission (`Store::fetch`): the engine's step
//! loop asks, goes on stepping the running sequences, and places what comes back.

use super::entry::{decode, Entry, Refusal};
use super::tiers::{Tiers, REASONS};
use super::BlockKey;
use crate::kv_cache::KvCache;
use rayon::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the tiers gave one waiting sequence (`Store::fetch`): its id and ids, from which position
/// (a block boundary), and the blocks read and checked, in order.
pub struct Fetched {
    pub id: u64,
    pub ids: Vec<u32>,
    pub start: usize,
    pub found: Vec<(usize, Entry)>,
}

/// Where one block of a cache stands in the tiers ([`super::Store::compare`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub key: BlockKey,
    /// The first tier that holds it, if any.
    pub tier: Option<&'static str>,
    /// Whether that tier holds exactly its rows (None: the stored bytes were refused).
    pub same_bits: Option<bool>,
}

/// A request to the reader: the blocks continuing `ids`, of which the prompt cache holds `ram`
/// positions, up to `max`.
struct Ask {
    id: u64,
    ids: Vec<u32>,
    ram: usize,
    max: usize,
}

/// The reading thread and its two channels.
pub(super) struct Reader {
    tx: Option<Sender<Ask>>,
    /// The answers, and one taken by [`Reader::wait`] and not yet handed out.
    rx: Mutex<(Receiver<Fetched>, Vec<Fetched>)>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    pub(super) fn start(tiers: Arc<Tiers>) -> std::io::Result<Reader> {
        let (tx, asks) = mpsc::channel::<Ask>();
        let (answers, rx) = mpsc::channel::<Fetched>();
        let thread = std::thread::Builder::new().name("kvgpt-store-read".into()).spawn(move || {
            for Ask { id, ids, ram, max } in asks {
                // From the prompt cache's last whole block; read only if it goes past the cache.
                let start = ram / tiers.keying.block * tiers.keying.block;
                let read = || {
                    let found = tiers.find(&ids, start, max);
                    let past = (start + found.iter().map(|&(_, _, n)| n).sum::<usize>()).min(max) > ram;
                    if past {
                        tiers.load(&found)
                    } else {
                        vec![]
                    }
                };
                // A tier that panics costs this prompt its blocks, never the answer.
                let found = catch_unwind(AssertUnwindSafe(read));
                if answers.send(Fetched { id, ids, start, found: found.unwrap_or_default() }).is_err() {
                    return;
                }
            }
        })?;
        Ok(Reader { tx: Some(tx), rx: Mutex::new((rx, vec![])), thread: Some(thread) })
    }

    /// Asks for the blocks that continue `ids` past the `ram` positions the prompt cache holds,
    /// up to `max`; false when the reader is gone (nothing will come).
    pub(super) fn ask(&self, id: u64, ids: &[u32], ram: usize, max: usize) -> bool {
        let ask = Ask { id, ids: ids.to_vec(), ram, max };
        self.tx.as_ref().is_some_and(|tx| tx.send(ask).is_ok())
    }

    /// What has come back since the last call.
    pub(super) fn answers(&self) -> Vec<Fetched> {
        let mut rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = std::mem::take(&mut rx.1);
        out.extend(rx.0.try_iter());
        out
    }

    /// Waits up to `timeout` for an answer (kept for [`Reader::answers`]); whether one came.
    pub(super) fn wait(&self, timeout: Duration) -> bool {
        let mut rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        if !rx.1.is_empty() {
            return true;
        }
        match rx.0.recv_timeout(timeout) {
            Ok(f) => {
                rx.1.push(f);
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Tiers {
    /// The stored blocks that continue `ids` from position `start` (a block boundary) up to
    /// position `max`, in order, as `(tier, key, positions stored)`: whole blocks while a tier
    /// holds them, then the longest stored part of the next (token exact: its tokens are the
    /// ids', possibly past `max`, of which only those before `max` are used). Nothing is read;
    /// each tier is asked twice at most (the whole blocks, then the parts of the next).
    pub(super) fn find(&self, ids: &[u32], start: usize, max: usize) -> Vec<(usize, BlockKey, usize)> {
        let k = &self.keying;
        let (b, end) = (k.block, max.min(ids.len()));
        if start >= end {
            return vec![];
        }
        let keys = k.chain(ids);
        // Whole blocks from start/B, as far as the ids have them (the last may pass `max`).
        let whole: Vec<BlockKey> = keys[(start / b).min(keys.len())..keys.len().min(end.div_ceil(b))].to_vec();
        let holders = self.holders(&whole);
        let mut out: Vec<(usize, BlockKey, usize)> = vec![];
        for (key, tier) in whole.iter().zip(holders) {
            match tier {
                Some(t) => out.push((t, *key, b)),
                None => break,
            }
        }
        let j = start / b + out.len();
        if j * b >= end {
            return out;
        }
        // The next block in part: the longest stored prefix of its tokens, from the ids'.
        let parent = if j == 0 { BlockKey::ROOT } else { keys[j - 1] };
        let parts: Vec<(BlockKey, usize)> = (1..b.min(ids.len() - j * b) + 1)
            .rev()
            .filter(|&n| n < b)
            .map(|n| (k.key(parent, j * b, &ids[j * b..j * b + n]), n))
            .collect();
        let holders = self.holders(&parts.iter().map(|&(key, _)| key).collect::<Vec<_>>());
        if let Some(((key, n), t)) = parts.iter().zip(holders).find_map(|(p, t)| t.map(|t| (p, t))) {
            out.push((t, *key, *n));
        }
        out
    }

    /// For each key, the first tier that holds it.
    fn holders(&self, keys: &[BlockKey]) -> Vec<Option<usize>> {
        let mut out = vec![None; keys.len()];
        for (i, (tier, _)) in self.tiers.iter().enumerate() {
            let ask: Vec<BlockKey> = keys.iter().zip(&out).filter(|(_, h)| h.is_none()).map(|(&k, _)| k).collect();
            if ask.is_empty() {
                break;
            }
            let mut has = tier.has_many(&ask).into_iter();
            for h in out.iter_mut().filter(|h| h.is_none()) {
                if has.next().unwrap_or(false) {
                    *h = Some(i);
                }
            }
        }
        out
    }

    /// Reads the blocks [`Tiers::find`] found, in order (each tier's in one request), checking
    /// each; a block refused (its header, length, checksum or key) is counted, removed, and ends
    /// the run, as does one its tier no longer gives.
    pub(super) fn load(&self, found: &[(usize, BlockKey, usize)]) -> Vec<(usize, Entry)> {
        let t = self;
        let mut bytes: Vec<Option<Vec<u8>>> = vec![None; found.len()];
        for (i, (tier, _)) in t.tiers.iter().enumerate() {
            let mine: Vec<usize> = (0..found.len()).filter(|&f| found[f].0 == i).collect();
            let got = tier.get_many(&mine.iter().map(|&f| found[f].1).collect::<Vec<_>>());
            for (f, g) in mine.into_iter().zip(got) {
                bytes[f] = g;
            }
        }
        // Checked on every core (the step loop waits for them; a checksum is most of the cost).
        let checked: Vec<Option<Result<Entry, Refusal>>> = found
            .par_iter()
            .zip(bytes)
            .map(|(&(_, key, _), bytes)| bytes.map(|b| decode(b, &t.keying, t.shape, key)))
            .collect();
        let mut out = vec![];
        for (&(i, key, _), checked) in found.iter().zip(checked) {
            let (tier, stats) = &t.tiers[i];
            let Some(checked) = checked else { break };
            match checked {
                Ok(entry) => {
                    stats.hits.fetch_add(1, Ordering::Relaxed);
                    stats.bytes.fetch_add(entry.len_bytes() as u64, Ordering::Relaxed);
                    out.push((i, entry));
                }
                Err(r) => {
                    tracing::warn!(
                        "a stored K/V block {key:?} ({}) was refused ({}) and removed",
                        tier.name(),
                        r.as_str()
                    );
                    stats.refused[REASONS.iter().position(|&x| x == r).expect("every reason")]
                        .fetch_add(1, Ordering::Relaxed);
                    tier.remove(key);
                    break;
                }
            }
        }
        out
    }

    /// Where each block of `cache` (holding `ids`' first positions) stands in the tiers, by its
    /// content address: the first tier that holds it, and whether it holds exactly these rows
    /// (None when the stored bytes are refused). Nothing is counted or removed: a look, not a load.
    pub(super) fn compare(&self, ids: &[u32], cache: &KvCache) -> Vec<Held> {
        let (b, n) = (self.keying.block, cache.len().min(ids.len()));
        let keys = self.keying.chain(&ids[..n]);
        let mut out = Vec::with_capacity(n.div_ceil(b));
        for (j, block) in cache.blocks().iter().enumerate().take(n.div_ceil(b)) {
            let len = b.min(n - j * b);
            let parent = if j == 0 { BlockKey::ROOT } else { keys[j - 1] };
            let key = if len == b { keys[j] } else { self.keying.key(parent, j * b, &ids[j * b..j * b + len]) };
            let holder = self.tiers.iter().find(|(t, _)| t.has(key)).map(|(t, _)| t.as_ref());
            let same = |t: &dyn super::Tier| {
                let entry = t.get(key).and_then(|bytes| decode(bytes, &self.keying, self.shape, key).ok());
                entry.map(|e| e.same_rows(block))
            };
            out.push(Held { key, tier: holder.map(|t| t.name()), same_bits: holder.and_then(same) });
        }
        out
    }
}
