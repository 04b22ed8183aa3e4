//! The tiers under the pool (`crate::store`): what the prompt cache stores goes down to them
//! (its blocks handed to the store's writer thread), and before each plan the next waiting
//! prompts' prefixes are looked up there beyond what the prompt cache holds; what is found is
//! loaded into the pool and the tree, so the plan finds it as any cached prefix.

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

    /// Looks the prompts of the waiting sequences that could take a slot now up in the store,
    /// once each, and loads what it holds beyond the prompt cache.
    pub(super) fn load_from_store(&mut self) {
        if self.cfg.store.is_none() || self.cfg.cache_bytes == 0 {
            return;
        }
        let free = self.cfg.parallel.saturating_sub(self.slots.len());
        let mut prompts = vec![];
        for w in self.waiting.iter_mut().take(free).filter(|w| !w.looked_down) {
            w.looked_down = true;
            prompts.push((w.id, w.req.prompt.clone()));
        }
        for (id, ids) in prompts {
            let loaded = self.load_prefix(&ids);
            if let Some(w) = self.waiting.iter_mut().find(|w| w.id == id) {
                w.loaded = loaded;
            }
        }
    }

    /// Loads the stored blocks that continue the prompt cache's prefix of `ids` (from its last
    /// whole block; at most all but the last token) into the pool, and gives them to the tree:
    /// from which position, and how many positions each tier gave.
    fn load_prefix(&mut self, ids: &[u32]) -> Option<(usize, TierReuse)> {
        let store = self.cfg.store.clone().expect("a store");
        let (b, max) = (self.pool.shape().positions, ids.len().saturating_sub(1));
        let ram = self.cache.peek(ids);
        let start = ram / b * b;
        let found = store.find(ids, start, max);
        if (start + found.iter().map(|&(_, _, n)| n).sum::<usize>()).min(max) <= ram {
            return None;
        }
        // Room for the loaded blocks (a run proved first is recomputed in blocks given back before
        // its own are appended, so proving takes no more at once).
        while self.pool.free_blocks() < found.len() && self.cache.evict_for_pool() {}
        let found = &found[..found.len().min(self.pool.free_blocks())];
        let mut kv = KvCache::in_pool(&self.pool, &self.runner.model.config, ids.len());
        // The eviction may have cut the prompt's path short of `start`: then nothing is loaded.
        let (held, blocks) = self.cache.blocks_of(ids, start);
        if held < start || kv.map_prefix(&blocks, start).is_err() {
            return None;
        }
        let loaded = store.load(found);
        let mut gave = TierReuse::default();
        let mut i = 0;
        'load: while i < loaded.len() {
            // A block not to recompute goes alone; a run of blocks to recompute, in one forward
            // (at --kv-verify 1, all that this process does not know).
            let check = store.check(&loaded[i].1);
            let proving = check == Check::Prove;
            let run = if proving { loaded[i..].iter().take_while(|(_, e)| store.check(e) == check).count() } else { 1 };
            // Unproved for want of blocks to recompute in: not used, and not held against the store.
            let Some(good) = (if proving { self.proved(&kv, ids, &loaded[i..i + run]) } else { Some(1) }) else {
                break;
            };
            if check == Check::Known {
                store.proved(check, [&loaded[i].1]);
            }
            for (tier, e) in &loaded[i..i + good] {
                if kv.append_held(e.rows(), e.tokens.len()).is_err() {
                    break 'load; // the pool is full: what is appended so far is used
                }
                gave.add(store.tier_name(*tier), e.tokens.len());
                gave.verified += if check == Check::Trusted { 0 } else { e.tokens.len() };
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
