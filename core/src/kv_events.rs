//! The prompt cache's changes as KV-cache events, in the form vLLM publishes them and routers
//! read them (vllm-router's `kv_aware` policy): the cache in blocks of `block_size` tokens,
//! each block named by a hash chained from the blocks before it.
//!
//! kvgpt's prompt cache is a radix tree over single tokens, not blocks; a router counts whole
//! blocks. The blocks of a prefix are held exactly when the tree holds that prefix to the block's
//! end, so a [`Change`] (a prefix held, or no longer held, past a position) maps to the blocks
//! that *end* within the changed positions: no other block's state changed. A block that ends
//! past the held prefix is not reported until the tree holds it whole.
//!
//! Block hash: the first eight bytes (big-endian) of SHA-256 over the parent block's hash (eight
//! bytes big-endian; nothing for the first block) followed by the block's token ids (u32
//! little-endian each). A router uses the hashes only to link a block to its parent and to remove
//! it; it matches requests on the token ids the events carry.
//!
//! The engine sends them ([`crate::engine::Spawned::kv_events`]); the server publishes them in
//! vLLM's msgpack wire form.

use crate::prefix_cache::Change;
use sha2::{Digest, Sha256};

/// Blocks added to or removed from what the cache holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockEvent {
    /// Blocks now held, in order; the first one's parent is `parent` (None: it starts the prefix).
    Stored { hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32> },
    /// Blocks no longer held.
    Removed { hashes: Vec<u64> },
    /// Nothing is held any more (a server that starts says so first).
    AllCleared,
}

/// The hash of a block of `tokens` after the block hashed `parent`.
pub fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = Sha256::new();
    if let Some(p) = parent {
        h.update(p.to_be_bytes());
    }
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("a SHA-256 digest has 32 bytes"))
}

/// The hashes of the first `n` whole blocks of `ids`.
pub fn block_hashes(ids: &[u32], size: usize, n: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(n);
    for block in ids.chunks_exact(size).take(n) {
        out.push(block_hash(out.last().copied(), block));
    }
    out
}

/// The blocks of `size` tokens that `change` adds or removes: those ending within
/// `(from, ids.len()]`. None when no whole block ends there.
pub fn block_event(change: &Change, size: usize) -> Option<BlockEvent> {
    let (ids, from) = match change {
        Change::Stored { ids, from } | Change::Removed { ids, from } => (ids, *from),
    };
    let (first, end) = (from / size, ids.len() / size); // blocks first..end end in (from, len]
    if first >= end {
        return None;
    }
    let hashes = block_hashes(ids, size, end);
    Some(match change {
        Change::Stored { .. } => BlockEvent::Stored {
            parent: first.checked_sub(1).map(|p| hashes[p]),
            tokens: ids[first * size..end * size].to_vec(),
            hashes: hashes[first..].to_vec(),
        },
        Change::Removed { .. } => BlockEvent::Removed { hashes: hashes[first..].to_vec() },
    })
}

#[cfg(test)]
mod tests;
