//! The tiers under the pool (`crate::store`): what the prompt cache stores goes down to them
//! (its blocks handed to the store's writer thread), and before each plan the next waiting
//! prompts' prefixes are looked up there beyond what the prompt cache holds; what is found is
//! loaded into the pool and the tree, so the plan finds it as any cached prefix.

use super::Engine;
use crate::kv_cache::KvCache;
use crate::prefix_cache::Change;

impl Engine {
    /// Hands the store the blocks of every prefix the prompt cache stored (`changes`).
    pub(super) fn write_through(&self, changes: &[Change]) {
        let Some(store) = &self.cfg.store else { return };
        let b = self.pool.shape().positions;
        for c in changes {
            if let Change::Stored { ids, from } = c {
                let blocks = self.cache.blocks_of(ids, ids.len());
                if blocks.len() > from / b {
                    store.write_through(ids, *from, blocks[from / b..].to_vec());
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
            prompts.push(w.req.prompt.clone());
        }
        for ids in prompts {
            self.load_prefix(&ids);
        }
    }

    /// Loads the stored blocks that continue the prompt cache's prefix of `ids` (from its last
    /// whole block; at most all but the last token) into the pool, and gives them to the tree.
    fn load_prefix(&mut self, ids: &[u32]) {
        let store = self.cfg.store.clone().expect("a store");
        let (b, max) = (self.pool.shape().positions, ids.len().saturating_sub(1));
        let ram = self.cache.peek(ids);
        let start = ram / b * b;
        let found = store.find(ids, start, max);
        if (start + found.iter().map(|&(_, _, n)| n).sum::<usize>()).min(max) <= ram {
            return;
        }
        while self.pool.free_blocks() < found.len() && self.cache.evict_for_pool() {}
        let found = &found[..found.len().min(self.pool.free_blocks())];
        let mut kv = KvCache::in_pool(&self.pool, &self.runner.model.config, ids.len());
        if kv.map_prefix(&self.cache.blocks_of(ids, start), start).is_err() {
            return;
        }
        for (_, e) in store.load(found) {
            if kv.append_held(&e.words, e.tokens.len()).is_err() {
                break;
            }
        }
        kv.truncate(max); // a stored block may go past the last prompt token
        if kv.len() > ram {
            self.cache.insert(&ids[..kv.len()], &kv);
        }
    }
}
