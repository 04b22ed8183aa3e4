//! The store the engine talks to: write-through of what the prompt cache stores, on a thread of
//! its own (the step loop only hands over references to the blocks, which nobody writes while
//! they are shared), and lookups that continue where the prompt cache stops, tier by tier.

use super::entry::{decode, encode, Entry, Refusal};
use super::{BlockKey, Keying, Tier};
use crate::kv_cache::{Block, BlockShape};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Writes waiting for the writer at most: past that, a write is skipped (and counted) rather
/// than keep blocks out of the pool for longer.
const QUEUE: usize = 64;
/// Tiers a store may have (the disk, Redis).
pub const MAX_TIERS: usize = 2;
const REASONS: [Refusal; 4] = [Refusal::Header, Refusal::Truncated, Refusal::Checksum, Refusal::Mismatch];

/// What a tier did.
#[derive(Debug, Default)]
struct TierStats {
    written: AtomicU64,
    skipped: AtomicU64,
    hits: AtomicU64,
    bytes: AtomicU64,
    refused: [AtomicU64; 4],
}

/// A snapshot of what one tier did and holds, for the gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierCounts {
    pub name: &'static str,
    pub up: bool,
    /// Blocks written, and those not (the writer was behind, or the tier could not take them).
    pub written: u64,
    pub skipped: u64,
    /// Blocks loaded back, and their bytes.
    pub hits: u64,
    pub bytes_read: u64,
    /// Blocks refused when read, by reason: header, truncated, checksum, mismatch.
    pub refused: [u64; 4],
    /// Blocks and bytes held, where the tier keeps count.
    pub held: Option<(usize, u64)>,
}

/// Every tier's counts, in lookup order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounts {
    pub tiers: [Option<TierCounts>; MAX_TIERS],
}

struct Tiers {
    keying: Keying,
    shape: BlockShape,
    tiers: Vec<(Box<dyn Tier>, TierStats)>,
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
    /// A store of blocks of `shape` keyed under `keying`, on `tiers` (looked up in this order;
    /// at most [`MAX_TIERS`]), with its writer thread.
    pub fn new(keying: Keying, shape: BlockShape, tiers: Vec<Box<dyn Tier>>) -> std::io::Result<Store> {
        assert!(tiers.len() <= MAX_TIERS, "at most {MAX_TIERS} tiers");
        let tiers = tiers.into_iter().map(|t| (t, TierStats::default())).collect();
        let tiers = Arc::new(Tiers { keying, shape, tiers });
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

    /// What each tier did so far, and holds now.
    pub fn counts(&self) -> StoreCounts {
        let mut out = StoreCounts::default();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (slot, (tier, s)) in out.tiers.iter_mut().zip(&self.tiers.tiers) {
            *slot = Some(TierCounts {
                name: tier.name(),
                up: tier.up(),
                written: load(&s.written),
                skipped: load(&s.skipped),
                hits: load(&s.hits),
                bytes_read: load(&s.bytes),
                refused: [0, 1, 2, 3].map(|i| load(&s.refused[i])),
                held: tier.held(),
            });
        }
        out
    }

    /// Hands the writer the blocks of `ids` from position `from` on (`blocks`: logical blocks
    /// `from / B ..`), to write those a tier does not hold; skipped, and counted, when it is behind.
    pub fn write_through(&self, ids: &[u32], from: usize, blocks: Vec<Arc<Block>>) {
        let n = blocks.len() as u64;
        let job = Job { ids: ids.to_vec(), first: from / self.tiers.keying.block, blocks };
        if let Some(Err(TrySendError::Full(_))) = self.tx.as_ref().map(|tx| tx.try_send(job)) {
            for (_, s) in &self.tiers.tiers {
                s.skipped.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The stored blocks that continue `ids` from position `start` (a block boundary) up to
    /// position `max`, in order, as `(tier, key, positions stored)`: whole blocks while a tier
    /// holds them, then the longest stored part of the next (token exact: its tokens are the
    /// ids', possibly past `max`, of which only those before `max` are used). Nothing is read.
    pub fn find(&self, ids: &[u32], start: usize, max: usize) -> Vec<(usize, BlockKey, usize)> {
        let k = &self.tiers.keying;
        let b = k.block;
        let keys = k.chain(ids);
        let mut out = vec![];
        let mut j = start / b;
        while j * b < max.min(ids.len()) {
            let parent = if j == 0 { BlockKey::ROOT } else { keys[j - 1] };
            let found = (1..=b.min(ids.len() - j * b)).rev().find_map(|n| {
                let key = if n == b { keys[j] } else { k.key(parent, j * b, &ids[j * b..j * b + n]) };
                self.tiers.tiers.iter().position(|(t, _)| t.has(key)).map(|tier| (tier, key, n))
            });
            let Some((tier, key, n)) = found else { break };
            out.push((tier, key, n));
            if n < b || (j + 1) * b >= max {
                break;
            }
            j += 1;
        }
        out
    }

    /// Reads the blocks [`Store::find`] found, in order, checking each; a block refused (its
    /// header, length, checksum or key) is counted, removed, and ends the run, as does one its
    /// tier no longer gives.
    pub fn load(&self, found: &[(usize, BlockKey, usize)]) -> Vec<(usize, Entry)> {
        let t = &self.tiers;
        let mut out = vec![];
        for &(i, key, _) in found {
            let (tier, stats) = &t.tiers[i];
            let Some(bytes) = tier.get(key) else { break };
            match decode(&bytes, &t.keying, t.shape, key) {
                Ok(entry) => {
                    stats.hits.fetch_add(1, Ordering::Relaxed);
                    stats.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
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
            let mut bytes = None;
            for (tier, stats) in self.tiers.iter().filter(|(t, _)| !t.has(key)) {
                if !tier.up() {
                    stats.skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let bytes = bytes.get_or_insert_with(|| encode(&self.keying, parent, j * b, tokens, block));
                let counter = if tier.put(key, bytes) { &stats.written } else { &stats.skipped };
                counter.fetch_add(1, Ordering::Relaxed);
            }
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
