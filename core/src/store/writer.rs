//! The store the engine talks to: write-through of what the prompt cache stores, on a thread of
//! its own (the step loop only hands over references to the blocks, which nobody writes while
//! they are shared), and lookups that continue where the prompt cache stops, tier by tier.

use super::entry::{encode, max_len, Entry};
use super::known::Known;
use super::reader::{Fetched, Held, Reader};
use super::tiers::{TierStats, Tiers};
use super::{BlockKey, Keying, Tier};
use crate::error::Result;
use crate::kv_cache::{Block, BlockShape, KvCache};
use crate::model::Model;
use crate::sequence::Sequence;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Writes waiting for the writer at most: past that, a write is skipped (and counted) rather
/// than keep blocks out of the pool for longer.
const QUEUE: usize = 64;
/// Tiers a store may have (the disk, Redis).
pub const MAX_TIERS: usize = 2;

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

/// Every tier's counts, in lookup order, and what recomputing loaded blocks found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounts {
    pub tiers: [Option<TierCounts>; MAX_TIERS],
    /// Loaded blocks proved by recomputing them, and by being bytes this process knows (their
    /// sums: [`super::known`]).
    pub verified: u64,
    pub verified_known: u64,
    pub verify_failures: u64,
}

/// What a loaded block needs before use (`--kv-verify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Nothing: it is not among the share proved.
    Trusted,
    /// Nothing more: its bytes are ones this process computed or proved (by their sum).
    Known,
    /// Recomputing it.
    Prove,
}

/// Blocks of `ids` (a prefix the prompt cache stored), from logical block `first` on, to write.
struct Job {
    ids: Vec<u32>,
    first: usize,
    blocks: Vec<Arc<Block>>,
}

pub struct Store {
    tiers: Arc<Tiers>,
    /// The share of loaded blocks proved by recomputing them (`--kv-verify`), and what that found.
    verify: f64,
    verified: AtomicU64,
    verified_known: AtomicU64,
    refuted: AtomicU64,
    tx: Option<SyncSender<Job>>,
    writer: Option<JoinHandle<()>>,
    reader: Reader,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({:?}, blocks of {})", self.tiers.keying.kv, self.tiers.keying.block)
    }
}

impl Store {
    /// A store of `model`'s K/V (keyed and shaped as it holds them) on `tiers`.
    pub fn for_model(model: &Model, tiers: Vec<Box<dyn Tier>>) -> std::io::Result<Store> {
        Store::new(Keying::of(model), BlockShape::of(&model.config, model.kv()), tiers)
    }

    /// A store of blocks of `shape` keyed under `keying`, on `tiers` (looked up in this order;
    /// at most [`MAX_TIERS`]), with its writer thread.
    pub fn new(keying: Keying, shape: BlockShape, tiers: Vec<Box<dyn Tier>>) -> std::io::Result<Store> {
        assert!(tiers.len() <= MAX_TIERS, "at most {MAX_TIERS} tiers");
        tiers.iter().for_each(|t| t.expect_at_most(max_len(shape, keying.block)));
        let tiers = tiers.into_iter().map(|t| (t, TierStats::default())).collect();
        let (inflight, max_inflight) = (AtomicUsize::new(0), AtomicUsize::new(usize::MAX));
        let tiers = Arc::new(Tiers { keying, shape, tiers, inflight, max_inflight, known: Known::default() });
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let t = tiers.clone();
        let writer = std::thread::Builder::new().name("kvgpt-store".into()).spawn(move || {
            for job in rx {
                t.write(&job);
                t.inflight.fetch_sub(job.blocks.len(), Ordering::Relaxed);
            }
        })?;
        let (verified, verified_known, refuted) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        let reader = Reader::start(tiers.clone())?;
        let writer = Some(writer);
        Ok(Store { tiers, verify: 0.0, verified, verified_known, refuted, tx: Some(tx), writer, reader })
    }

    /// Proves the share `p` (0 to 1) of the blocks loaded back by recomputing them.
    pub fn with_verify(mut self, p: f64) -> Store {
        self.verify = p.clamp(0.0, 1.0);
        self
    }

    /// Whether the block `key` is to be proved before use: the `--kv-verify` share of keys, by
    /// the key's first bytes (every key at 1, none at 0; the same keys on every replica).
    pub fn proves(&self, key: BlockKey) -> bool {
        let x = u64::from_le_bytes(key.0[..8].try_into().expect("8 bytes"));
        self.verify >= 1.0 || (x as f64) < self.verify * u64::MAX as f64
    }

    /// What the loaded block `e` needs before use: nothing when it is not among the share
    /// proved, or when its bytes are ones this process knows; else recomputing.
    pub fn check(&self, e: &Entry) -> Check {
        if !self.proves(e.key) {
            Check::Trusted
        } else if self.tiers.known.holds(e.key, &e.sum()) {
            Check::Known
        } else {
            Check::Prove
        }
    }

    /// Blocks proved: by recomputing them (their recomputed bits were the stored ones; from now
    /// on they are known) or by being known.
    pub fn proved<'a>(&self, how: Check, blocks: impl IntoIterator<Item = &'a Entry>) {
        for e in blocks {
            if how == Check::Prove {
                self.tiers.known.add(e.key, e.sum());
                self.verified.fetch_add(1, Ordering::Relaxed);
            } else {
                self.verified_known.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A block whose recomputed bits were not the stored ones: counted, logged, and removed from
    /// tier `tier`, which will not give it again.
    pub fn refuted(&self, tier: usize, key: BlockKey) {
        self.refuted.fetch_add(1, Ordering::Relaxed);
        let (t, _) = &self.tiers.tiers[tier];
        tracing::warn!("a stored K/V block {key:?} ({}) is not what recomputing it gives: removed", t.name());
        t.remove(key);
    }

    /// The name of tier `i` (in lookup order).
    pub fn tier_name(&self, i: usize) -> &'static str {
        self.tiers.tiers[i].0.name()
    }

    /// Starts `seq`, which has nothing cached yet, from what the tiers hold of its ids (at most
    /// all but the last, for its logits), for a command that decodes alone: the positions
    /// restored. The blocks come from the sequence's own pool.
    pub fn restore(&self, model: &Model, seq: &mut Sequence) -> Result<usize> {
        if !seq.cache().is_empty() {
            return Ok(seq.cache().len());
        }
        let mut kv = KvCache::in_pool(seq.cache().pool(), &model.config, seq.ids().len());
        let n = self.fill(seq.ids(), &mut kv);
        if n > 0 {
            seq.map_prefix(kv.blocks(), n)?;
        }
        Ok(n)
    }

    /// Fills the empty `cache` with what the tiers hold of `ids`, at most all but the last: the
    /// positions filled.
    pub(super) fn fill(&self, ids: &[u32], cache: &mut KvCache) -> usize {
        self.extend(ids, cache);
        cache.len()
    }

    /// Continues `cache`, which holds `ids`' first positions up to a block boundary, with what
    /// the tiers hold of the rest (at most all but the last id): the positions added.
    pub fn extend(&self, ids: &[u32], cache: &mut KvCache) -> usize {
        let (from, max) = (cache.len(), ids.len().saturating_sub(1));
        if !from.is_multiple_of(self.tiers.keying.block) {
            return 0;
        }
        for (_, e) in self.tiers.load(&self.tiers.find(ids, from, max)) {
            if cache.append_held(e.rows(), e.tokens.len()).is_err() {
                break;
            }
        }
        cache.truncate(max.max(from)); // a stored block may go past the last prompt token
        cache.len() - from
    }

    /// Hands the writer what `seq` computed: its ids up to `prompt` first (the prompt's last
    /// block in part, as the server's prompt cache stores it, so that the next run saying the
    /// same finds it token exact), then all of them.
    pub fn save(&self, seq: &Sequence, prompt: usize) {
        self.save_prefix(&seq.ids()[..prompt.min(seq.ids().len())], seq.cache());
        self.save_prefix(seq.ids(), seq.cache());
    }

    /// Hands the writer every block `cache` holds of `ids` (from the first position).
    pub(super) fn save_prefix(&self, ids: &[u32], cache: &KvCache) {
        let n = cache.len().min(ids.len());
        self.write_through(&ids[..n], 0, cache.blocks()[..cache.shape().blocks_for(n)].to_vec());
    }

    /// What each tier did so far, and holds now.
    pub fn counts(&self) -> StoreCounts {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = StoreCounts {
            verified: load(&self.verified),
            verified_known: load(&self.verified_known),
            verify_failures: load(&self.refuted),
            ..Default::default()
        };
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
        let (t, n) = (&self.tiers, blocks.len());
        let room = t.inflight.load(Ordering::Relaxed) + n <= t.max_inflight.load(Ordering::Relaxed);
        let job = Job { ids: ids.to_vec(), first: from / t.keying.block, blocks };
        t.inflight.fetch_add(n, Ordering::Relaxed);
        // Full, or a writer that is gone: not written, and counted.
        if !room || self.tx.as_ref().is_none_or(|tx| tx.try_send(job).is_err()) {
            t.inflight.fetch_sub(n, Ordering::Relaxed);
            for (_, s) in &t.tiers {
                s.skipped.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }

    /// Lets at most `blocks` blocks wait for the writer (a share of the pool they are held in:
    /// a slow tier must not keep the pool's blocks from the running sequences); past that, a
    /// write is skipped and counted.
    pub fn limit_inflight(&self, blocks: usize) {
        self.tiers.max_inflight.store(blocks.max(1), Ordering::Relaxed);
    }

    /// Asks the reading thread for the stored blocks that continue `ids` past the `ram`
    /// positions the prompt cache holds (from its last whole block), up to `max`, for the
    /// waiting sequence `id`: `Tiers::find`, then `Tiers::load` if they go past `ram`. The
    /// answer comes from [`Store::fetched`]. False when no answer will come (the reader is gone).
    pub fn fetch(&self, id: u64, ids: &[u32], ram: usize, max: usize) -> bool {
        self.reader.ask(id, ids, ram, max)
    }

    /// Where each block of `cache` (holding `ids`' first positions) stands in the tiers: its
    /// content address, the first tier holding it, and whether that tier holds exactly these
    /// rows (a block computed here against a stored one: proved or not). Reads, changes nothing.
    pub fn compare(&self, ids: &[u32], cache: &KvCache) -> Vec<Held> {
        self.tiers.compare(ids, cache)
    }

    /// Waits up to `timeout` for an answer to [`Store::fetch`]; whether one came.
    pub fn wait_fetched(&self, timeout: std::time::Duration) -> bool {
        self.reader.wait(timeout)
    }

    /// The answers to [`Store::fetch`] that have come since the last call.
    pub fn fetched(&self) -> Vec<Fetched> {
        self.reader.answers()
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
            for (tier, stats) in self.tiers.iter().filter(|(t, _)| !t.has_to_write(key)) {
                if !tier.up() {
                    stats.skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let bytes = bytes.get_or_insert_with(|| {
                    let bytes = encode(&self.keying, parent, j * b, tokens, block);
                    self.known.add(key, bytes[bytes.len() - 32..].try_into().expect("a sum"));
                    bytes
                });
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
