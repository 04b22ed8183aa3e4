//! The blocks this process knows to be right without recomputing them: those it encoded from its
//! own K/V (computed here, or loaded and proved) and those it proved by recomputation, each by
//! its key and the BLAKE3 sum of its stored bytes. A block loaded back whose checked sum is the
//! one known for its key is those very bytes (BLAKE3 is collision resistant), so `--kv-verify`
//! need not recompute it; bytes changed behind the checksum's back have another sum and are
//! recomputed. What is known lives as long as the process (a restarted server, or another
//! replica, proves by recomputing); past [`KNOWN`] the least recently used is forgotten.

use super::BlockKey;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Blocks remembered at most (about 100 bytes each).
pub(super) const KNOWN: usize = 1 << 16;

#[derive(Default)]
pub(super) struct Known(Mutex<Sums>);

#[derive(Default)]
struct Sums {
    /// Each key's sum and when it was last added or matched.
    by_key: HashMap<BlockKey, ([u8; 32], u64)>,
    /// Keys in the order they were used, each with the time of that use: an entry whose time is
    /// no longer its key's is stale and skipped (a key used again is pushed again).
    order: VecDeque<(BlockKey, u64)>,
    clock: u64,
}

impl Sums {
    fn used(&mut self, key: BlockKey) {
        self.clock += 1;
        if let Some(e) = self.by_key.get_mut(&key) {
            e.1 = self.clock;
        }
        self.order.push_back((key, self.clock));
        while self.by_key.len() > KNOWN {
            let (old, at) = self.order.pop_front().expect("every known key is in the order");
            if self.by_key.get(&old).is_some_and(|e| e.1 == at) {
                self.by_key.remove(&old);
            }
        }
        if self.order.len() > 2 * KNOWN {
            let by_key = &self.by_key;
            self.order.retain(|(k, at)| by_key.get(k).is_some_and(|e| e.1 == *at));
        }
    }
}

impl Known {
    /// `key`'s right bytes have the sum `sum`.
    pub(super) fn add(&self, key: BlockKey, sum: [u8; 32]) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.by_key.insert(key, (sum, 0));
        s.used(key);
    }

    /// Whether `sum` is the sum of `key`'s right bytes (a match counts as a use).
    pub(super) fn holds(&self, key: BlockKey, sum: &[u8; 32]) -> bool {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let held = s.by_key.get(&key).is_some_and(|e| &e.0 == sum);
        if held {
            s.used(key);
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> BlockKey {
        let mut k = [0u8; 32];
        k[..8].copy_from_slice(&(i as u64).to_le_bytes());
        BlockKey(k)
    }

    #[test]
    fn the_least_recently_used_is_forgotten_first() {
        let known = Known::default();
        for i in 0..KNOWN {
            known.add(key(i), [i as u8; 32]);
        }
        assert!(known.holds(key(0), &[0; 32]), "used again: now the most recent");
        assert!(!known.holds(key(1), &[9; 32]), "another sum is not known");
        known.add(key(KNOWN), [1; 32]);
        assert!(known.holds(key(0), &[0; 32]) && !known.holds(key(1), &[1; 32]), "key 1 went, key 0 stayed");
        assert!(known.holds(key(KNOWN), &[1; 32]));
    }
}
