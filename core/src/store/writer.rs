//! The store the engine talks to: write-through of what the prompt cache stores, on a thread of
//! its own (the step loop only hands over references to the blocks, which nobody writes while
//! they are shared), and lookups that continue where the prompt cache stops.

use super::entry::{decode, encode, Entry, Refusal};
use super::{BlockKey, DiskTier, Keying};
use crate::kv_cache::{Block, BlockShape};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Writes waiting for the writer at most: past that, a write is skipped (and counted) rather
/// than keep blocks out of the pool for longer.
const QUEUE: usize = 64;

/// What the store did, for the metrics.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Blocks written to the disk tier, and those skipped (the queue was full, or the tier stopped).
    pub written: AtomicU64,
    pub skipped: AtomicU64,
    /// Blocks loaded back from the disk tier, and their bytes.
    pub disk_hits: AtomicU64,
    pub disk_bytes: AtomicU64,
    /// Stored blocks refused when read, by reason (header, truncated, checksum, mismatch).
    pub refused: [AtomicU64; 4],
}

impl StoreStats {
    fn refuse(&self, r: Refusal) {
        let i =
            [Refusal::Header, Refusal::Truncated, Refusal::Checksum, Refusal::Mismatch].iter().position(|&x| x == r);
        self.refused[i.expect("every reason is listed")].fetch_add(1, Ordering::Relaxed);
    }
}

/// A snapshot of [`StoreStats`] and of what the disk tier holds, for the gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounts {
    pub written: u64,
    pub skipped: u64,
    pub disk_hits: u64,
    pub disk_bytes_read: u64,
    /// By reason: header, truncated, checksum, mismatch.
    pub refused: [u64; 4],
    pub disk_blocks: usize,
    pub disk_bytes_held: u64,
}

struct Tiers {
    keying: Keying,
    shape: BlockShape,
    disk: DiskTier,
    stats: StoreStats,
}

/// Blocks of `ids` (a prefix the prompt cache stored), from logical block `first` on, to write.
struct Job {
    ids: Vec<u32>,
    first: usize,
    blocks: Vec<Arc<Block>>,
}

pub struct Store {
    tiers: Arc<Tiers>,
    tx: Option<SyncSender<Job>>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({:?}, blocks of {})", self.tiers.keying.kv, self.tiers.keying.block)
    }
}

impl Store {
    /// A store of blocks of `shape` keyed under `keying`, on `disk`, with its writer thread.
    pub fn new(keying: Keying, shape: BlockShape, disk: DiskTier) -> std::io::Result<Store> {
        let tiers = Arc::new(Tiers { keying, shape, disk, stats: StoreStats::default() });
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let t = tiers.clone();
        let writer = std::thread::Builder::new().name("kvgpt-store".into()).spawn(move || {
            for job in rx {
                t.write(&job);
            }
        })?;
        Ok(Store { tiers, tx: Some(tx), writer: Some(writer) })
    }

    pub fn keying(&self) -> Keying {
        self.tiers.keying
    }

    pub fn stats(&self) -> &StoreStats {
        &self.tiers.stats
    }

    /// What the store did so far, and what the disk tier holds now.
    pub fn counts(&self) -> StoreCounts {
        let (s, load) = (&self.tiers.stats, |a: &AtomicU64| a.load(Ordering::Relaxed));
        let (disk_blocks, disk_bytes_held) = self.tiers.disk.held();
        StoreCounts {
            written: load(&s.written),
            skipped: load(&s.skipped),
            disk_hits: load(&s.disk_hits),
            disk_bytes_read: load(&s.disk_bytes),
            refused: [0, 1, 2, 3].map(|i| load(&s.refused[i])),
            disk_blocks,
            disk_bytes_held,
        }
    }

    /// Hands the writer the blocks of `ids` from position `from` on (`blocks`: logical blocks
    /// `from / B ..`), to write those it does not hold; skipped, and counted, when it is behind.
    pub fn write_through(&self, ids: &[u32], from: usize, blocks: Vec<Arc<Block>>) {
        let n = blocks.len() as u64;
        let job = Job { ids: ids.to_vec(), first: from / self.tiers.keying.block, blocks };
        if let Some(Err(TrySendError::Full(_))) = self.tx.as_ref().map(|tx| tx.try_send(job)) {
            self.tiers.stats.skipped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The stored blocks that continue `ids` from position `start` (a block boundary) up to
    /// position `max`, in order, as `(key, positions stored)`: whole blocks while they are
    /// stored, then the longest stored part of the next (token exact: its tokens are the ids',
    /// possibly past `max`, of which only those before `max` are used). Nothing is read.
    pub fn find(&self, ids: &[u32], start: usize, max: usize) -> Vec<(BlockKey, usize)> {
        let k = &self.tiers.keying;
        let b = k.block;
        let keys = k.chain(ids);
        let mut out = vec![];
        let mut j = start / b;
        while j * b < max.min(ids.len()) {
            let parent = if j == 0 { BlockKey::ROOT } else { keys[j - 1] };
            let found = (1..=b.min(ids.len() - j * b)).rev().find_map(|n| {
                let key = if n == b { keys[j] } else { k.key(parent, j * b, &ids[j * b..j * b + n]) };
                self.tiers.disk.has(key).then_some((key, n))
            });
            let Some((key, n)) = found else { break };
            out.push((key, n));
            if n < b || (j + 1) * b >= max {
                break;
            }
            j += 1;
        }
        out
    }

    /// Reads the blocks [`Store::find`] found, in order, checking each; a block refused (its
    /// header, length, checksum or key) is counted, removed, and ends the run.
    pub fn load(&self, found: &[(BlockKey, usize)]) -> Vec<Entry> {
        let t = &self.tiers;
        let mut out = vec![];
        for &(key, _) in found {
            let Some(bytes) = t.disk.get(key) else { break };
            match decode(&bytes, &t.keying, t.shape, key) {
                Ok(entry) => {
                    t.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
                    t.stats.disk_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    out.push(entry);
                }
                Err(r) => {
                    tracing::warn!("a stored K/V block {key:?} was refused ({}) and removed", r.as_str());
                    t.stats.refuse(r);
                    t.disk.remove(key);
                    break;
                }
            }
        }
        out
    }
}

impl Tiers {
    fn write(&self, job: &Job) {
        let b = self.keying.block;
        let keys = self.keying.chain(&job.ids);
        for (i, block) in job.blocks.iter().enumerate() {
            let j = job.first + i;
            let n = b.min(job.ids.len().saturating_sub(j * b));
            if n == 0 {
                break;
            }
            let parent = if j == 0 { BlockKey::ROOT } else { keys[j - 1] };
            let tokens = &job.ids[j * b..j * b + n];
            let key = if n == b { keys[j] } else { self.keying.key(parent, j * b, tokens) };
            if self.disk.has(key) {
                continue;
            }
            let bytes = encode(&self.keying, parent, j * b, tokens, block);
            let counter = if self.disk.put(key, &bytes) { &self.stats.written } else { &self.stats.skipped };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Store {
    /// Finishes the writes handed over (the writer drains its queue), then stops it.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}
