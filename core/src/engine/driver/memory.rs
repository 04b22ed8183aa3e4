//! The engine's K/V memory: what the policy may admit, room for a step's rows (evict the prompt
//! cache's unheld leaves first, then preempt the most recently admitted sequence), and the
//! gauges that report the pool.

use super::Engine;
use crate::engine::config::Gauges;
use crate::engine::policy::{Memory, Phase, Plan};
use crate::engine::slot::Slot;
use std::collections::HashSet;
use std::sync::Arc;

/// Blocks kept free beyond what admitted prompts need, as a share of the pool (vLLM's 1%), so
/// that running sequences can grow a little before anyone is preempted.
const WATERMARK: f64 = 0.01;

impl Engine {
    /// What the policy may admit against: the free blocks and those the prompt cache alone holds
    /// (counted only when someone waits: the count walks the tree).
    pub(super) fn memory(&self) -> Memory {
        let total = self.pool.total_blocks();
        let waiting = !(self.waiting.is_empty() && self.preempted.is_empty());
        Memory {
            free_blocks: self.pool.free_blocks() + if waiting { self.cache.evictable_blocks() } else { 0 },
            block: self.pool.shape().positions,
            watermark: (total as f64 * WATERMARK).ceil() as usize,
        }
    }

    /// Makes room in the pool for the blocks `plan`'s rows will take: evicts the prompt cache's
    /// least recently used unheld leaves, then preempts the most recently admitted sequence
    /// (its rows leave the plan) until they fit. The oldest sequence is never preempted: if it
    /// alone cannot fit, its step fails with the pool's error.
    pub(super) fn make_room(&mut self, plan: &mut Plan) {
        loop {
            let need: usize = plan
                .rows
                .iter()
                .filter_map(|&(id, n)| self.slots.iter().find(|s| s.id == id).map(|s| s.seq.cache().blocks_needed(n)))
                .sum();
            if need <= self.pool.free_blocks() {
                return;
            }
            if self.cache.evict_for_pool() {
                continue;
            }
            if self.slots.len() <= 1 {
                return;
            }
            let s = self.slots.pop().expect("more than one slot");
            plan.rows.retain(|&(id, _)| id != s.id);
            self.preempt(s);
        }
    }

    /// Takes a sequence out of the running batch for memory: its blocks (and hold) go, its ids
    /// and sampler stay; it goes first in line and is recomputed from the prompt cache when it
    /// is admitted again, to the same bits.
    fn preempt(&mut self, mut s: Slot) {
        if let Some(h) = s.hold.take() {
            self.cache.release(h);
        }
        s.seq.preempt();
        s.phase = Phase::Admitted;
        self.preemptions += 1;
        self.preempted.push_front(s);
    }

    pub(super) fn gauges(&self) -> Gauges {
        // The distinct blocks the running sequences map, and those of them someone else holds too.
        let (mut mapped, mut shared) = (HashSet::new(), 0);
        for b in self.slots.iter().flat_map(|s| s.seq.cache().blocks()) {
            if mapped.insert(Arc::as_ptr(b)) && Arc::strong_count(b) > 1 {
                shared += 1;
            }
        }
        let block = self.pool.shape().bytes();
        Gauges {
            running: self.slots.len(),
            waiting: self.waiting.len() + self.preempted.len(),
            kv_bytes: mapped.len() * block,
            kv_tokens: self.slots.iter().map(|s| s.seq.cache().len()).sum(),
            cache_bytes: self.cache.bytes(),
            cache_tokens: self.cache.tokens(),
            pool_blocks: self.pool.total_blocks(),
            pool_used: self.pool.used_blocks(),
            blocks_shared: shared,
            preemptions: self.preemptions,
            stats: self.cache.stats,
        }
    }
}
