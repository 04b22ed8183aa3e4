//! The tiers under the pool (`crate::store`): what the prompt cache stores goes down to them
//! (its blocks handed to the store's writer thread), and the next waiting prompts' prefixes are
//! looked up there beyond what the prompt cache holds, by the store's reading thread while the
//! running sequences step; what it found is placed into the pool and the tree before a plan, so
//! the plan finds it as any cached prefix. A prompt is not admitted while its prefix is read.

use super::super::slot::TierLoad;
use super::Engine;
use crate::kv_cache::KvCache;
use crate::prefix_cache::Change;
use crate::store::{Check, Entry, TierReuse};

impl Engine {
    /// Hands the store the blocks of every prefix the prompt cache stored (`changes`).
    pub(super) fn write_through(&self, changes: &[Change]) {
        let Some(store) = &self.cfg.store else { return };
        let b = self.pool.shape().positions;
        for c in changes {
            if let Change::Stored { ids, from } = c {
                // What the tree holds of it now (a later insert or eviction this step may have
                // cut it): each block written under the tokens it holds.
                let (len, blocks) = self.cache.blocks_of(ids, ids.len());
                if len > *from {
                    store.write_through(&ids[..len], *from, blocks[from / b..].to_vec());
                }
            }
        }
    }

    /// Places what the tiers gave since the last step, then asks them, off the step loop, for
    /// the prefixes of the waiting sequences that could take a slot now (once each).
    pub(super) fn load_from_store(&mut self) {
        let Some(store) = self.cfg.store.clone().filter(|_| self.cfg.cache_bytes > 0) else { return };
        for f in store.fetched() {
            let loaded = self.place(f.start, &f.ids, f.found);
            // A sequence cancelled meanwhile leaves its blocks to the prompt cache.
            if let Some(w) = self.waiting.iter_mut().find(|w| w.id == f.id) {
                w.tiers = TierLoad::Loaded(loaded);
            }
        }
        let free = self.cfg.parallel.saturating_sub(self.slots.len());
        if !self.waiting.iter().take(free).any(|w| w.tiers == TierLoad::Unasked) {
            return; // the usual step: nothing new to ask
        }
        // A prompt being read is read once: the same prompt again (the choices of an n > 1
        // request) waits for that answer, then finds it in the prompt cache.
        let mut reading: Vec<Vec<u32>> =
            self.waiting.iter().filter(|w| w.tiers == TierLoad::Loading).map(|w| w.req.prompt.clone()).collect();
        for w in self.waiting.iter_mut().take(free).filter(|w| w.tiers == TierLoad::Unasked) {
            if reading.contains(&w.req.prompt) {
                continue;
            }
            let (ids, max) = (&w.req.prompt, w.req.prompt.len().saturating_sub(1));
            let ram = self.cache.peek(ids);
            let asked = ram < max && store.fetch(w.id, ids, ram, max);
            w.tiers = if asked { TierLoad::Loading } else { TierLoad::Loaded(None) };
            if asked {
                reading.push(w.req.prompt.clone());
            }
        }
    }

    /// Whether the engine can do nothing until the tiers answer: nothing runs, and the oldest
    /// waiting sequence's prefix is still being read.
    pub(super) fn stalled(&self) -> bool {
        self.slots.is_empty()
            && self.preempted.is_empty()
            && self.waiting.front().is_some_and(|w| w.tiers == TierLoad::Loading)
    }

    /// Puts the stored blocks `loaded` (read for `ids` from position `start`, a block boundary)
    /// into the pool after the prompt cache's prefix, proving those `--kv-verify` chooses, and
    /// gives them to the tree: from which position, and how many positions each tier gave. The
    /// tree may have changed since they were asked for: they continue what it holds at `start`
    /// now, or are not used.
    fn place(&mut self, start: usize, ids: &[u32], loaded: Vec<(usize, Entry)>) -> Option<(usize, TierReuse)> {
        let store = self.cfg.store.clone().expect("a store");
        let (ram, max) = (self.cache.peek(ids), ids.len().saturating_sub(1));
        if (start + loaded.iter().map(|(_, e)| e.tokens.len()).sum::<usize>()).min(max) <= ram {
            return None;
        }
        // Room for the loaded blocks (a run proved first is recomputed in blocks given back before
        // its own are appended, so proving takes no more at once).
        while self.pool.free_blocks() < loaded.len() && self.cache.evict_for_pool() {}
        let loaded = &loaded[..loaded.len().min(self.pool.free_blocks())];
        let mut kv = KvCache::in_pool(&self.pool, &self.runner.model.config, ids.len());
        // The eviction may have cut the prompt's path short of `start`: then nothing is loaded.
        let (held, blocks) = self.cache.blocks_of(ids, start);
        if held < start || kv.map_prefix(&blocks, start).is_err() {
            return None;
        }
        let mut gave = TierReuse::default();
        let checks: Vec<Check> = loaded.iter().map(|(_, e)| store.check(e)).collect();
        let mut i = 0;
        'load: while i < loaded.len() {
            // A block not to recompute goes alone; a run of blocks to recompute, in one forward
            // (at --kv-verify 1, all that this process does not know).
            let (check, proving) = (checks[i], checks[i] == Check::Prove);
            let run = if proving { checks[i..].iter().take_while(|&&c| c == check).count() } else { 1 };
            // Unproved for want of blocks to recompute in: not used, and not held against the store.
            let Some(good) = (if proving { self.proved(&kv, ids, &loaded[i..i + run]) } else { Some(1) }) else {
                break;
            };
            for (tier, e) in &loaded[i..i + good] {
                if kv.append_held(e.rows(), e.tokens.len()).is_err() {
                    break 'load; // the pool is full: what is appended so far is used
                }
                gave.add(store.tier_name(*tier), e.tokens.len());
                gave.verified += if check == Check::Trusted { 0 } else { e.tokens.len() };
                if check == Check::Known {
                    store.proved(check, [e]);
                }
            }
            if good < run {
                let (tier, e) = &loaded[i + good];
                store.refuted(*tier, e.key);
                break;
            }
            i += run;
        }
        kv.truncate(max); // a stored block may go past the last prompt token
        if kv.len() <= ram {
            return None;
        }
        self.cache.insert(&ids[..kv.len()], &kv);
        Some((start, gave))
    }

    /// How many of the stored blocks `run` (consecutive, after what `kv` holds) recomputing
    /// their positions in one forward gives exactly (`--kv-verify`): the blocks before the first
    /// that differs. None when they could not be recomputed (no blocks free in the pool to do it
    /// in): they are then not used, and not counted against the store.
    fn proved(&mut self, kv: &KvCache, ids: &[u32], run: &[(usize, Entry)]) -> Option<usize> {
        let (from, b) = (kv.len(), self.pool.shape().positions);
        let n: usize = run.iter().map(|(_, e)| e.tokens.len()).sum();
        let mut check = KvCache::in_pool(&self.pool, &self.runner.model.config, from + n);
        if check.map_prefix(kv.blocks(), from).is_err()
            || self.runner.recompute(&ids[from..from + n], &mut check).is_err()
        {
            return None;
        }
        let good = run.iter().enumerate().take_while(|(k, (_, e))| e.same_rows(&check.blocks()[from / b + k])).count();
        self.cfg.store.as_ref().expect("a store").proved(Check::Prove, run[..good].iter().map(|(_, e)| e));
        Some(good)
    }
}
