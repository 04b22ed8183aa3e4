//! The prompt cache: K/V of token prefixes that earlier requests computed, shared across
//! requests, in a radix tree over token ids.
//!
//! Why a radix tree: reuse must stop exactly at the first token that differs (hashed blocks
//! would stop at the last whole block before it), and prompts that share a system prompt but
//! differ after it share one node for the common part. Each node holds the K/V of its edge's
//! positions (`KvSpan`); a node's positions are fixed by its depth, since GPT-2's learned
//! positions are baked into every layer's K/V: only exact prefixes at the same positions are
//! reused, never shifted.
//!
//! Memory: entries are copies. A request that hits copies the matched K/V into its own cache
//! (a memcpy of ~36 KB per token at DistilGPT-2's size, against a forward pass per token), so the
//! attention kernel and its fixed order stay as they are. The tree's bytes stay within a budget;
//! past it, the least recently used leaves that no running request holds are evicted.
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

use crate::kv_cache::{KvCache, KvSpan};

mod reuse;
pub use reuse::{ReuseStop, StopReason};

const ROOT: usize = 0;

struct Node {
    /// The edge's tokens, at positions `depth..depth + tokens.len()`.
    tokens: Vec<u32>,
    kv: KvSpan,
    depth: usize,
    parent: usize,
    children: Vec<usize>,
    last_used: u64,
    /// Holds whose matched path covers this node.
    refs: u32,
    alive: bool,
}

impl Node {
    fn bytes(&self) -> usize {
        self.kv.bytes() + 4 * self.tokens.len()
    }
}

/// A matched prefix that may not be evicted until [`PrefixCache::release`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a hold keeps its prefix in the cache until it is released"]
pub struct Hold {
    ids: Vec<u32>,
}

/// What a lookup found: `len` tokens, whose K/V are the `spans` in order (each whole), the
/// hold that keeps them, and where and why reuse stopped.
pub struct Lookup<'a> {
    pub len: usize,
    pub spans: Vec<&'a KvSpan>,
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
    used: usize,
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
            kv: KvSpan { len: 0, n_layer: 0, n_head: 0, head_dim: 0, data: vec![] },
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
            used: 0,
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

    pub fn bytes(&self) -> usize {
        self.used
    }

    /// Tokens held (the sum of every edge's length).
    pub fn tokens(&self) -> usize {
        self.nodes.iter().filter(|n| n.alive).map(|n| n.tokens.len()).sum()
    }

    /// The longest cached prefix of `ids`, at most `len - 1` tokens (the last position is always
    /// computed, for its logits), in one descent: its length, its K/V spans and a hold on them.
    pub fn lookup(&mut self, ids: &[u32]) -> Lookup<'_> {
        self.lookup_upto(ids, ids.len().saturating_sub(1))
    }

    /// [`PrefixCache::lookup`] of at most the first `max` tokens: a plan that already knows how
    /// many the cache gives ([`PrefixCache::peek`]) takes exactly those.
    pub fn lookup_upto(&mut self, ids: &[u32], max: usize) -> Lookup<'_> {
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
        let spans = path.iter().map(|&(c, _)| &self.nodes[c].kv).collect();
        Lookup { len, spans, hold: Hold { ids: ids[..len].to_vec() }, stop }
    }

    /// How many tokens of `ids` a lookup would take from the cache now (nothing is touched).
    pub fn peek(&self, ids: &[u32]) -> usize {
        self.descend(ids, ids.len().saturating_sub(1)).iter().map(|&(_, take)| take).sum()
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

    /// Stores the K/V of `ids[..cache.len()]` (what the cache holds of that sequence), sharing
    /// the nodes it has in common with earlier entries, then evicts down to the budget.
    pub fn insert(&mut self, ids: &[u32], cache: &KvCache) {
        let end = cache.len().min(ids.len());
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
                kv: cache.span(len, end),
                depth: len,
                parent: node,
                children: vec![],
                last_used: self.clock,
                refs: 0,
                alive: true,
            };
            self.stats.inserted_tokens += (end - len) as u64;
            self.used += leaf.bytes();
            let id = self.alloc(leaf);
            self.nodes[node].children.push(id);
            self.note(|_| Change::Stored { ids: ids[..end].to_vec(), from: len });
        }
        self.evict_to(self.budget);
    }

    /// Splits node `c` after `m` of its tokens: a new node takes the tail and `c`'s children,
    /// and is held by whoever holds `c`.
    fn split(&mut self, c: usize, m: usize) {
        let tail_tokens = self.nodes[c].tokens.split_off(m);
        let tail_kv = self.nodes[c].kv.split_off(m);
        let n = &self.nodes[c];
        let tail = Node {
            tokens: tail_tokens,
            kv: tail_kv,
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

    /// Evicts least recently used leaves that no request holds until at most `bytes` are used.
    pub fn evict_to(&mut self, bytes: usize) {
        while self.used > bytes {
            let victim = (1..self.nodes.len())
                .filter(|&i| {
                    let n = &self.nodes[i];
                    n.alive && n.children.is_empty() && n.refs == 0
                })
                .min_by_key(|&i| self.nodes[i].last_used);
            let Some(v) = victim else { break }; // everything left is held
            self.note(|c| Change::Removed { ids: c.path_ids(v), from: c.nodes[v].depth });
            let parent = self.nodes[v].parent;
            self.nodes[parent].children.retain(|&c| c != v);
            let n = &mut self.nodes[v];
            self.used -= n.bytes();
            self.stats.evicted_nodes += 1;
            self.stats.evicted_tokens += n.tokens.len() as u64;
            n.alive = false;
            n.tokens = vec![];
            n.kv.data = vec![];
            self.free.push(v);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
