//! K/V blocks below the pool (issue #35): every block that enters the prompt cache is also
//! written, off the engine's step loop, to the tiers under it (a disk directory, `--kv-disk`),
//! and a prompt the prompt cache does not hold is looked up there too, block by block, token
//! exact. A block is stored under its content address ([`Keying::key`]: its parent's key, its
//! positions' tokens, the model's K/V fingerprint and the block size), so nothing from another
//! model, weight type, `--kv-dtype` or block size can be found; each stored block carries a
//! checksum, and a torn, truncated or flipped one is refused and counted, never used.
//!
//! kvgpt's K/V are the same bits on every machine, thread count and ISA, so a key names exactly
//! one block of bytes: two writers of the same key write the same bytes.

mod audit;
mod disk;
mod entry;
mod known;
mod reader;
mod redis;
mod resp;
mod tiers;
mod writer;

pub use self::redis::RedisTier;
pub use audit::{audit, Audit};
pub use disk::DiskTier;
pub use entry::{Entry, Refusal};
pub use reader::{Fetched, Held};
pub use writer::{Check, Store, StoreCounts, TierCounts};

use crate::model::Fingerprint;

/// One tier under the pool: stored blocks by key (the disk, Redis). Every call answers at once
/// when the tier cannot (a tier that fails costs speed, never an answer).
pub trait Tier: Send + Sync {
    /// Its name in the metrics: "disk", "redis".
    fn name(&self) -> &'static str;
    fn has(&self, key: BlockKey) -> bool;
    /// [`Tier::has`] as the writer asks it, before a write (a networked tier asks on its
    /// writing connection, so the engine's lookups never wait behind the writer).
    fn has_to_write(&self, key: BlockKey) -> bool {
        self.has(key)
    }
    /// [`Tier::has`] of each key (a networked tier asks in one round trip).
    fn has_many(&self, keys: &[BlockKey]) -> Vec<bool> {
        keys.iter().map(|&k| self.has(k)).collect()
    }
    /// The stored bytes of `key` (None if not here, or unreadable now).
    fn get(&self, key: BlockKey) -> Option<Vec<u8>>;
    /// [`Tier::get`] of each key (a networked tier asks in one round trip).
    fn get_many(&self, keys: &[BlockKey]) -> Vec<Option<Vec<u8>>> {
        keys.iter().map(|&k| self.get(k)).collect()
    }
    /// Stores `bytes` under `key` (unless held: a key names one content); false if it could not.
    fn put(&self, key: BlockKey, bytes: &[u8]) -> bool;
    /// Removes a block (refused when read).
    fn remove(&self, key: BlockKey);
    /// Blocks and bytes held, where the tier keeps count.
    fn held(&self) -> Option<(usize, u64)>;
    /// Stored blocks are at most `bytes` long: a tier that reads over a network reads nothing
    /// longer (a value planted there cannot make it take more memory).
    fn expect_at_most(&self, _bytes: usize) {}
    /// Whether it answers now.
    fn up(&self) -> bool {
        true
    }
}

/// Where a prompt's reused positions came from: the prompt cache in RAM, or a tier under it
/// (loaded into the pool for this request), and how many of the loaded ones were proved by
/// recomputation (`--kv-verify`). Positions, not blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierReuse {
    pub ram: usize,
    pub disk: usize,
    pub redis: usize,
    pub verified: usize,
}

impl TierReuse {
    /// Counts `n` positions from the tier named `tier`.
    pub fn add(&mut self, tier: &str, n: usize) {
        match tier {
            "disk" => self.disk += n,
            "redis" => self.redis += n,
            _ => self.ram += n,
        }
    }

    /// Of `reused` positions, those the tiers gave (this loaded, from `start` on) and the rest
    /// from RAM: a lookup may reuse less than was loaded (the tiers' counts cut in order).
    pub fn of(&self, start: usize, reused: usize) -> TierReuse {
        let mut left = reused.saturating_sub(start);
        let mut take = |n: usize| {
            let t = n.min(left);
            left -= t;
            t
        };
        let (disk, redis) = (take(self.disk), take(self.redis));
        let verified = self.verified.min(disk + redis);
        TierReuse { ram: reused - disk - redis, disk, redis, verified }
    }
}

/// A block's content address.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockKey(pub [u8; 32]);

impl std::fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0[..8].iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl BlockKey {
    /// The key before a sequence's first block.
    pub const ROOT: BlockKey = BlockKey([0; 32]);

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What one store's keys are made under: the K/V fingerprint (every weight byte as held, the
/// layout, `--kv-dtype`: `Model::kv_fingerprint`) and the block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keying {
    pub kv: Fingerprint,
    pub block: usize,
}

impl Keying {
    /// The keying of `model`'s K/V as it holds them (its `KvSpec`).
    pub fn of(model: &crate::model::Model) -> Keying {
        Keying { kv: model.kv_fingerprint(), block: model.kv().block() }
    }

    /// The key of the block whose positions start at `first` (a multiple of the block size) and
    /// hold `tokens` (one to a block's worth), after the block keyed `parent`
    /// ([`BlockKey::ROOT`] for the first): a chain, so a key stands for every token before it.
    pub fn key(&self, parent: BlockKey, first: usize, tokens: &[u32]) -> BlockKey {
        let mut h = blake3::Hasher::new();
        h.update(b"kvgpt block");
        h.update(&entry::VERSION.to_le_bytes());
        h.update(&self.kv.0);
        h.update(&(self.block as u64).to_le_bytes());
        h.update(&parent.0);
        h.update(&(first as u64).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        BlockKey(*h.finalize().as_bytes())
    }

    /// The keys of the whole blocks of `ids`, in order (each the next's parent).
    pub fn chain(&self, ids: &[u32]) -> Vec<BlockKey> {
        let mut parent = BlockKey::ROOT;
        ids.chunks_exact(self.block)
            .enumerate()
            .map(|(j, tokens)| {
                parent = self.key(parent, j * self.block, tokens);
                parent
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
