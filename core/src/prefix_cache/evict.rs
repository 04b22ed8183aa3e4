//! Eviction: which blocks only unheld entries hold (what admission may count as free), and the
//! least recently used leaves that go first, to the tree's budget or for the pool.

use super::{Change, PrefixCache};
use crate::kv_cache::Block;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The blocks only unheld entries hold: what evicting every entry nobody holds would give back.
pub struct Evictable(HashSet<*const Block>);

impl Evictable {
    /// None (nobody asks: no one waits to be admitted).
    pub fn none() -> Evictable {
        Evictable(HashSet::new())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl PrefixCache {
    /// Blocks that evicting every entry nobody holds would give back to the pool now: those
    /// whose every holder is an unheld node (a block may be two nodes' when a split falls inside
    /// it; a node under a held one is held too, so unheld nodes can all be evicted, leaves
    /// first). Counted once for a step's admission, asked about per prompt
    /// ([`PrefixCache::peek_in`]).
    pub fn evictable(&self) -> Evictable {
        let only_unheld = self.unheld_holders().into_iter().filter(|(_, (b, n))| Arc::strong_count(b) == *n);
        Evictable(only_unheld.map(|(p, _)| p).collect())
    }

    /// [`PrefixCache::peek`], and how many of the blocks that lookup would map are in
    /// `evictable` (mapped, they could no longer be evicted for room).
    pub fn peek_in(&self, evictable: &Evictable, ids: &[u32]) -> (usize, usize) {
        let path = self.descend(ids, ids.len().saturating_sub(1));
        let len = path.iter().map(|&(_, take)| take).sum();
        let pinned = self.path_block_refs(&path, len).into_iter().filter(|b| evictable.0.contains(&Arc::as_ptr(b)));
        (len, pinned.count())
    }

    /// Each block unheld nodes hold, with how many of them hold it.
    fn unheld_holders(&self) -> HashMap<*const Block, (&Arc<Block>, usize)> {
        let mut out: HashMap<*const Block, (&Arc<Block>, usize)> = HashMap::new();
        for b in self.nodes.iter().skip(1).filter(|n| n.alive && n.refs == 0).flat_map(|n| &n.blocks) {
            out.entry(Arc::as_ptr(b)).or_insert((b, 0)).1 += 1;
        }
        out
    }

    /// Evicts least recently used leaves that no request holds until at most `bytes` are used.
    pub fn evict_to(&mut self, bytes: usize) {
        while self.bytes() > bytes && self.evict_one() {}
    }

    /// Evicts the least recently used leaf that no request holds (its blocks go back to the pool
    /// unless a sequence maps them); false when everything left is held.
    pub fn evict_one(&mut self) -> bool {
        self.evict_lru(false)
    }

    /// Evicts the least recently used leaf that no request holds and that holds a block only
    /// unheld nodes hold (given back now, or once the parent that shares it goes next); false
    /// when there is none. For a pool that needs blocks: a leaf whose blocks sequences still map
    /// would free nothing.
    pub fn evict_for_pool(&mut self) -> bool {
        self.evict_lru(true)
    }

    fn evict_lru(&mut self, freeing: bool) -> bool {
        let holders = if freeing { self.unheld_holders() } else { HashMap::new() };
        let tree_only = |b: &Arc<Block>| holders.get(&Arc::as_ptr(b)).is_some_and(|&(_, n)| Arc::strong_count(b) == n);
        let victim = (1..self.nodes.len())
            .filter(|&i| {
                let n = &self.nodes[i];
                n.alive && n.children.is_empty() && n.refs == 0 && (!freeing || n.blocks.iter().any(tree_only))
            })
            .min_by_key(|&i| self.nodes[i].last_used);
        let Some(v) = victim else { return false };
        self.note(|c| Change::Removed { ids: c.path_ids(v), from: c.nodes[v].depth });
        let parent = self.nodes[v].parent;
        self.nodes[parent].children.retain(|&c| c != v);
        let n = &mut self.nodes[v];
        self.stats.evicted_nodes += 1;
        self.stats.evicted_tokens += n.tokens.len() as u64;
        n.alive = false;
        n.tokens = vec![];
        n.blocks = vec![];
        self.free.push(v);
        true
    }
}
