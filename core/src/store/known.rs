//! The blocks this process knows to be right without recomputing them: those it encoded from its
//! own K/V (computed here, or loaded and proved) and those it proved by recomputation, each by
//! its key and the BLAKE3 sum of its stored bytes. A block loaded back whose checked sum is the
//! one known for its key is those very bytes (BLAKE3 is collision resistant), so `--kv-verify`
//! need not recompute it; bytes changed behind the checksum's back have another sum and are
//! recomputed. What is known lives as long as the process (a restarted server, or another
//! replica, proves by recomputing); the oldest are forgotten past [`KNOWN`].

use super::BlockKey;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Blocks remembered at most (about 100 bytes each).
pub(super) const KNOWN: usize = 1 << 16;

#[derive(Default)]
pub(super) struct Known(Mutex<Sums>);

#[derive(Default)]
struct Sums {
    by_key: HashMap<BlockKey, [u8; 32]>,
    /// Keys, the oldest first.
    order: VecDeque<BlockKey>,
}

impl Known {
    /// `key`'s right bytes have the sum `sum`.
    pub(super) fn add(&self, key: BlockKey, sum: [u8; 32]) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if s.by_key.insert(key, sum).is_none() {
            s.order.push_back(key);
        }
        while s.order.len() > KNOWN {
            let old = s.order.pop_front().expect("not empty");
            s.by_key.remove(&old);
        }
    }

    /// Whether `sum` is the sum of `key`'s right bytes.
    pub(super) fn holds(&self, key: BlockKey, sum: &[u8; 32]) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).by_key.get(&key) == Some(sum)
    }
}
