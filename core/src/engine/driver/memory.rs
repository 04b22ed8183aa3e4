//! The engine's K/V memory: what the policy may admit, room for a step's rows (evict the prompt
//! cache's unheld leaves first, then preempt the most recently admitted sequence), and the
//! gauges that report the pool.

use super::Engine;
use crate::engine::config::Gauges;
use crate::engine::policy::{Memory, Phase, Plan};
use crate::engine::slot::Slot;
use crate::prefix_cache::{Evictable, PrefixCache};
use std::collections::HashSet;
use std::sync::Arc;

/// Blocks kept free beyond what admitted prompts need, as a share of the pool (vLLM's 1%), so
/// that running sequences can grow a little before anyone is preempted.
const WATERMARK: f64 = 0.01;

/// Positions a decoding sequence adds before its new whole blocks go to the prompt cache (at
/// least a block): soon enough that sequences saying the same thing share their blocks early,
/// seldom enough that the tree's walk is no per-token cost.
const SHARE_EVERY: usize = 16;

/// Gives the prompt cache `s`'s ids up to `end` and maps the tree's blocks for their whole
/// blocks in place of its own copies: where another sequence (a sibling choice, an earlier
/// request) computed the same tokens, they are one block in memory, not two.
pub(super) fn share(cache: &mut PrefixCache, s: &mut Slot, end: usize) {
    let blocks = cache.insert_shared(s.seq.ids(), s.seq.cache(), end);
    s.seq.share_whole(&blocks);
    s.shared = end;
}

impl Engine {
    /// The blocks the prompt cache alone holds, when someone waits to be admitted (the count
    /// walks the tree).
    pub(super) fn evictable(&self) -> Evictable {
        let waiting = !(self.waiting.is_empty() && self.preempted.is_empty());
        if waiting {
            self.cache.evictable()
        } else {
            Evictable::none()
        }
    }

    /// What the policy may admit against: the free blocks and the `evictable` ones.
    pub(super) fn memory(&self, evictable: &Evictable) -> Memory {
        let total = self.pool.total_blocks();
        Memory {
            free_blocks: self.pool.free_blocks() + evictable.len(),
            block: self.pool.shape().positions,
            watermark: (total as f64 * WATERMARK).ceil() as usize,
        }
    }

    /// Shares the new whole blocks of every started sequence that has made [`SHARE_EVERY`]
    /// positions since it last did ([`share`]), when there is a prompt cache.
    pub(super) fn share_decoded(&mut self) {
        if self.cfg.cache_bytes == 0 {
            return;
        }
        let b = self.pool.shape().positions;
        for s in self.slots.iter_mut().filter(|s| s.first_token.is_some()) {
            let whole = s.seq.cache().len() / b * b;
            if whole >= s.shared + SHARE_EVERY.max(b) {
                share(&mut self.cache, s, whole);
            }
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
            pool_peak: self.pool.peak_blocks(),
            blocks_shared: shared,
            preemptions: self.preemptions,
            stats: self.cache.stats,
            store: self.cfg.store.as_ref().map(|s| s.counts()),
        }
    }
}
