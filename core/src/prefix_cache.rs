//! The prompt cache: K/V of token prefixes that earlier requests computed, shared across
//! requests, in a radix tree over token ids.
//!
//! Why a radix tree: reuse must stop exactly at the first token that differs (hashed blocks
//! would stop at the last whole block before it), and prompts that share a system prompt but
//! differ after it share one node for the common part. Each node holds, by reference count, the
//! K/V blocks its edge's positions lie in (the first and last possibly shared with its parent
//! and children, or partly filled); a node's positions are fixed by its depth, since GPT-2's
//! learned positions are baked into every layer's K/V: only exact prefixes at the same positions
//! are reused, never shifted.
//!
//! Sequences give the tree their decoded tokens too, as their blocks fill
//! ([`PrefixCache::insert_shared`]), and map the tree's blocks in place of their own where it has
//! them: sequences that compute the same tokens (greedy choices, identical requests) hold them
//! once. A node whose last block is partly filled takes a new child's fuller copy of that block,
//! so an interior node (never evicted) pins no copy of its own.
//!
//! Memory: nothing is copied. A hit maps the matched blocks into the sequence's block table
//! (`KvCache::map_prefix`); the sequence copies only a partly matched last block, when it first
//! writes into it (copy on write). For each logical block the deepest node of the matched path
//! that holds one gives it: whoever computed that block computed the same tokens at the same
//! positions before it, so its bits are the ones a forward pass would write (kvgpt's exactness
//! is what makes a block from another request as good as one's own). The tree's bytes stay within
//! a budget; past it (or when the pool needs blocks), the least recently used leaves that no
//! running request holds are evicted, and a block goes back to the pool when no sequence maps it
//! either.
//!
//! A full hit still needs the next-token logits: [`PrefixCache::lookup`] matches at most
//! `len - 1` tokens, so the last prompt position is always computed (one decode-sized step)
//! instead of keeping 200 KB of logits per entry.
//!
//! The cache knows no model and no sequence: a lookup is one descent that returns the matched
//! length, the K/V spans to copy (the caller restores them) and a [`Hold`]. Holds are reference
//! counts on the nodes of the matched path (a lookup that ends inside an edge splits it there,
//! so a hold always covers whole nodes, and a later split gives both halves the count); only
//! leaves nobody holds are evicted.
//!
//! Whoever mirrors the cache elsewhere (the engine, for the KV events that tell a router what
//! this server holds) can ask for a journal of [`Change`]s: a prefix became held, or stopped being
//! held, past a position. Splits change nothing a lookup can find, so they are not changes.

use crate::kv_cache::{Block, BlockShape, KvCache};
use std::sync::Arc;

mod evict;
mod reuse;
pub use evict::Evictable;
pub use reuse::{ReuseStop, StopReason};

const ROOT: usize = 0;

struct Node {
    /// The edge's tokens, at positions `depth..depth + tokens.len()`.
    tokens: Vec<u32>,
    /// The blocks those positions lie in: logical blocks `depth / B ..= (end − 1) / B`.
    blocks: Vec<Arc<Block>>,
    depth: usize,
    parent: usize,
    children: Vec<usize>,
    last_used: u64,
    /// Holds whose matched path covers this node.
    refs: u32,
    alive: bool,
}

/// A matched prefix that may not be evicted until [`PrefixCache::release`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a hold keeps its prefix in the cache until it is released"]
pub struct Hold {
    ids: Vec<u32>,
}

/// What a lookup found: `len` tokens, whose K/V are in `blocks` (logical blocks
/// `0..ceil(len / B)`, to map into a sequence's table), the hold that keeps them, and where and
/// why reuse stopped.
pub struct Lookup {
    pub len: usize,
    pub blocks: Vec<Arc<Block>>,
    pub hold: Hold,
    pub stop: ReuseStop,
}

/// Counters for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub lookups: u64,
    pub hits: u64,
    pub evicted_nodes: u64,
    pub evicted_tokens: u64,
    pub inserted_tokens: u64,
}

/// A change to which prefixes a lookup can find.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `ids` (a whole prefix, from position 0) is held now; before, only `ids[..from]` was.
    Stored { ids: Vec<u32>, from: usize },
    /// `ids` is no longer held past `ids[..from]`.
    Removed { ids: Vec<u32>, from: usize },
}

pub struct PrefixCache {
    nodes: Vec<Node>,
    free: Vec<usize>,
    budget: usize,
    /// The blocks' shape, from the first cache inserted (every later one must match).
    shape: Option<BlockShape>,
    clock: u64,
    pub stats: CacheStats,
    /// The changes since the last [`PrefixCache::take_changes`], when someone asked for them.
    journal: Option<Vec<Change>>,
}

impl PrefixCache {
    /// An empty cache that holds at most `budget` bytes of K/V.
    pub fn new(budget: usize) -> PrefixCache {
        let root = Node {
            tokens: vec![],
            blocks: vec![],
            depth: 0,
            parent: ROOT,
            children: vec![],
            last_used: 0,
            refs: 0,
            alive: true,
        };
        PrefixCache {
            nodes: vec![root],
            free: vec![],
            budget,
            shape: None,
            clock: 0,
            stats: CacheStats::default(),
            journal: None,
        }
    }

    /// Keeps a journal of [`Change`]s from now on, for [`PrefixCache::take_changes`].
    pub fn keep_journal(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
    }

    /// The changes since the last call, in the order they happened (none without a journal).
    pub fn take_changes(&mut self) -> Vec<Change> {
        self.journal.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn note(&mut self, change: impl FnOnce(&Self) -> Change) {
        if let Some(mut journal) = self.journal.take() {
            journal.push(change(self));
            self.journal = Some(journal);
        }
    }

    /// The tokens from the root to the end of node `n`.
    fn path_ids(&self, mut n: usize) -> Vec<u32> {
        let mut edges = vec![];
        while n != ROOT {
            edges.push(&self.nodes[n].tokens);
            n = self.nodes[n].parent;
        }
        edges.into_iter().rev().flatten().copied().collect()
    }

    /// Bytes held: the blocks (one shared with the parent counted there) and the token ids.
    pub fn bytes(&self) -> usize {
        let block = self.shape.map_or(0, |s| s.bytes());
        self.nodes.iter().skip(1).filter(|n| n.alive).map(|n| self.own_blocks(n) * block + 4 * n.tokens.len()).sum()
    }

    /// Blocks node `n` holds that its parent does not (its first may be the parent's last).
    fn own_blocks(&self, n: &Node) -> usize {
        let parent_last = self.nodes[n.parent].blocks.last();
        let shared = n.blocks.first().zip(parent_last).is_some_and(|(a, b)| Arc::ptr_eq(a, b));
        n.blocks.len() - usize::from(shared)
    }

    /// The blocks of the path `path` (nodes from the root, whole), one per logical block of its
    /// `len` positions: each from the deepest node that holds it.
    fn path_blocks(&self, path: &[(usize, usize)], len: usize) -> Vec<Arc<Block>> {
        self.path_block_refs(path, len).into_iter().cloned().collect()
    }

    fn path_block_refs(&self, path: &[(usize, usize)], len: usize) -> Vec<&Arc<Block>> {
        let Some(b) = self.shape.map(|s| s.positions) else { return vec![] };
        let mut out: Vec<Option<&Arc<Block>>> = vec![None; len.div_ceil(b)];
        for &(c, _) in path {
            let n = &self.nodes[c];
            for (i, block) in n.blocks.iter().enumerate() {
                if let Some(slot) = out.get_mut(n.depth / b + i) {
                    *slot = Some(block);
                }
            }
        }
        out.into_iter().map(|b| b.expect("a matched path holds every block of its positions")).collect()
    }

    /// Tokens held (the sum of every edge's length).
    pub fn tokens(&self) -> usize {
        self.nodes.iter().filter(|n| n.alive).map(|n| n.tokens.len()).sum()
    }

    /// The longest cached prefix of `ids`, at most `len - 1` tokens (the last position is always
    /// computed, for its logits), in one descent: its length, its K/V spans and a hold on them.
    pub fn lookup(&mut self, ids: &[u32]) -> Lookup {
        self.lookup_upto(ids, ids.len().saturating_sub(1))
    }

    /// [`PrefixCache::lookup`] of at most the first `max` tokens: a plan that already knows how
    /// many the cache gives ([`PrefixCache::peek`]) takes exactly those.
    pub fn lookup_upto(&mut self, ids: &[u32], max: usize) -> Lookup {
        self.clock += 1;
        self.stats.lookups += 1;
        let path = self.descend(ids, max.min(ids.len().saturating_sub(1)));
        let len = path.iter().map(|&(_, take)| take).sum();
        let (end, end_take) = path.last().copied().unwrap_or((ROOT, 0));
        let stop = self.stop_at(ids, len, end, end_take);
        if let Some(&(last, take)) = path.last() {
            if take < self.nodes[last].tokens.len() {
                self.split(last, take); // the hold ends at a node's end
            }
        }
        for &(c, _) in &path {
            self.nodes[c].last_used = self.clock;
            self.nodes[c].refs += 1;
        }
        if len > 0 {
            self.stats.hits += 1;
        }
        let blocks = self.path_blocks(&path, len);
        Lookup { len, blocks, hold: Hold { ids: ids[..len].to_vec() }, stop }
    }

    /// How many tokens of `ids` a lookup would take from the cache now (nothing is touched).
    pub fn peek(&self, ids: &[u32]) -> usize {
        self.peek_in(&Evictable::none(), ids).0
    }

    /// How much of `ids[..len]` the tree holds now, and its blocks (logical `0..`, the last
    /// possibly partly filled), from the deepest node that holds each; nothing is held or touched.
    pub fn blocks_of(&self, ids: &[u32], len: usize) -> (usize, Vec<Arc<Block>>) {
        let path = self.descend(ids, len.min(ids.len()));
        let matched = path.iter().map(|&(_, take)| take).sum();
        (matched, self.path_blocks(&path, matched))
    }

    /// Lets a held prefix be evicted again.
    pub fn release(&mut self, hold: Hold) {
        for (c, _) in self.descend(&hold.ids, hold.ids.len()) {
            self.nodes[c].refs -= 1;
        }
    }

    /// The nodes along the longest cached prefix of `ids[..max]`, each with how many of its
    /// tokens match (all but possibly the last's).
    fn descend(&self, ids: &[u32], max: usize) -> Vec<(usize, usize)> {
        let mut path = vec![];
        let (mut node, mut len) = (ROOT, 0);
        while len < max {
            let Some(c) = self.child(node, ids[len]) else { break };
            let common = self.nodes[c].tokens.iter().zip(&ids[len..max]).take_while(|(a, b)| a == b).count();
            path.push((c, common));
            len += common;
            node = c;
            if common < self.nodes[c].tokens.len() {
                break; // ends inside this edge
            }
        }
        path
    }

    fn child(&self, node: usize, first: u32) -> Option<usize> {
        self.nodes[node].children.iter().copied().find(|&c| self.nodes[c].tokens[0] == first)
    }

    /// Stores the K/V of `ids[..cache.len()]` (what the cache holds of that sequence) by taking
    /// a reference to its blocks, sharing the nodes it has in common with earlier entries, then
    /// evicts down to the budget. A cache in blocks of another shape than the tree's is not
    /// stored.
    pub fn insert(&mut self, ids: &[u32], cache: &KvCache) {
        self.insert_upto(ids, cache, ids.len());
    }

    /// [`PrefixCache::insert`] of `ids[..end]` (at most what `cache` holds), returning the
    /// tree's blocks for that prefix's whole blocks (logical `0..end / B`, fewer if the budget
    /// evicted part of it; none for a cache of another shape). Where the tree held those tokens
    /// already, its blocks are another sequence's, computed from the same tokens at the same
    /// positions: the same bits, which `cache` can map instead of its own copies
    /// ([`KvCache::share_whole`]).
    pub fn insert_shared(&mut self, ids: &[u32], cache: &KvCache, end: usize) -> Vec<Arc<Block>> {
        if !self.insert_upto(ids, cache, end) {
            return vec![];
        }
        let b = cache.shape().positions;
        let (held, mut blocks) = self.blocks_of(ids, end.min(cache.len()) / b * b);
        blocks.truncate(held / b);
        blocks
    }

    /// The insert; false when `cache`'s blocks are not of the tree's shape.
    fn insert_upto(&mut self, ids: &[u32], cache: &KvCache, end: usize) -> bool {
        if *self.shape.get_or_insert(cache.shape()) != cache.shape() {
            return false;
        }
        let end = cache.len().min(ids.len()).min(end);
        let b = cache.shape().positions;
        self.clock += 1;
        let path = self.descend(ids, end);
        let mut len = 0;
        for &(c, common) in &path {
            if common < self.nodes[c].tokens.len() {
                self.split(c, common);
            }
            self.nodes[c].last_used = self.clock;
            len += common;
        }
        let node = path.last().map_or(ROOT, |&(c, _)| c);
        if len < end {
            let leaf = Node {
                tokens: ids[len..end].to_vec(),
                blocks: cache.blocks()[len / b..end.div_ceil(b)].to_vec(),
                depth: len,
                parent: node,
                children: vec![],
                last_used: self.clock,
                refs: 0,
                alive: true,
            };
            self.stats.inserted_tokens += (end - len) as u64;
            let id = self.alloc(leaf);
            self.nodes[node].children.push(id);
            if !len.is_multiple_of(b) {
                self.take_fuller(node, self.nodes[id].blocks[0].clone());
            }
            self.note(|_| Change::Stored { ids: ids[..end].to_vec(), from: len });
        }
        self.evict_to(self.budget);
        true
    }

    /// Node `n`'s last block is partly filled, and `block` (a new child's first) holds its
    /// positions (the same bits: the same tokens before them) and more: `n` takes it, and so does
    /// every ancestor that ends in the same block (a split inside it gave it to both halves), so
    /// their copy goes back to the pool. Interior nodes are never evicted: they would pin a
    /// partial block for as long as they have children.
    fn take_fuller(&mut self, mut n: usize, block: Arc<Block>) {
        let Some(old) = self.nodes[n].blocks.last().cloned() else { return };
        while n != ROOT {
            match self.nodes[n].blocks.last_mut() {
                Some(last) if Arc::ptr_eq(last, &old) => *last = block.clone(),
                _ => return,
            }
            n = self.nodes[n].parent;
        }
    }

    /// Splits node `c` after `m` of its tokens: a new node takes the tail and `c`'s children,
    /// and is held by whoever holds `c`.
    fn split(&mut self, c: usize, m: usize) {
        let b = self.shape.map_or(1, |s| s.positions);
        let (depth, end) = (self.nodes[c].depth, self.nodes[c].depth + m);
        let tail_tokens = self.nodes[c].tokens.split_off(m);
        // The block holding position `end` goes to both halves when `end` is inside it.
        let tail_blocks = self.nodes[c].blocks[end / b - depth / b..].to_vec();
        self.nodes[c].blocks.truncate(end.div_ceil(b) - depth / b);
        let n = &self.nodes[c];
        let tail = Node {
            tokens: tail_tokens,
            blocks: tail_blocks,
            depth: n.depth + m,
            parent: c,
            children: n.children.clone(),
            last_used: n.last_used,
            refs: n.refs,
            alive: true,
        };
        let id = self.alloc(tail);
        for ch in self.nodes[id].children.clone() {
            self.nodes[ch].parent = id;
        }
        self.nodes[c].children = vec![id];
    }

    fn alloc(&mut self, n: Node) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = n;
                i
            }
            None => {
                self.nodes.push(n);
                self.nodes.len() - 1
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
