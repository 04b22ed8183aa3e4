//! The radix tree on its own: K/V made up per token (K = [id, position], V = [-id, position]),
//! so every mapped value says which token and position it came from. Blocks of one position
//! unless a test says otherwise, so that bytes count per token.

use super::*;
use crate::kv_cache::tests::{cache_in_blocks, cfg};
use crate::kv_cache::KvSpec;

const PER_TOKEN: usize = 20; // 2 parts × 2 floats × 4 bytes of K/V + 4 bytes of token id

fn insert(c: &mut PrefixCache, ids: &[u32]) {
    c.insert(ids, &cache_in_blocks(ids, 1));
}

/// Looks `ids` up and returns the matched length, checking that the blocks hold exactly the
/// K/V of `ids[..len]` at their positions; releases the hold.
fn hit(c: &mut PrefixCache, ids: &[u32]) -> usize {
    hit_in(c, ids, 1)
}

/// [`hit`] for a tree of blocks of `b` positions.
fn hit_in(c: &mut PrefixCache, ids: &[u32], b: usize) -> usize {
    let l = c.lookup(ids);
    let mut restored = KvCache::with_spec(&cfg(), 64, KvSpec::new(b).unwrap());
    restored.map_prefix(&l.blocks, l.len).unwrap();
    let want = cache_in_blocks(&ids[..l.len], b);
    for part in [crate::kv_cache::KvPart::K, crate::kv_cache::KvPart::V] {
        assert_eq!(restored.gather(0, part), want.gather(0, part), "K/V of the matched tokens at their positions");
    }
    let (len, hold) = (l.len, l.hold);
    c.release(hold);
    len
}

#[test]
fn reuse_stops_at_the_first_differing_token_and_before_the_last() {
    let mut c = PrefixCache::new(1 << 20);
    insert(&mut c, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(hit(&mut c, &[1, 2, 3, 9, 5, 6]), 3, "stops at the first differing token");
    assert_eq!(hit(&mut c, &[1, 2, 3, 4, 5, 6]), 5, "a full match leaves the last token to compute");
    assert_eq!(hit(&mut c, &[1, 2, 3, 4, 5, 6, 7, 8]), 6, "a longer prompt takes all that is cached");
    assert_eq!(hit(&mut c, &[2, 3]), 0, "only prefixes: the same tokens at other positions are not reused");
    assert_eq!(c.peek(&[1, 2, 7]), 2);
    assert_eq!((c.stats.lookups, c.stats.hits), (4, 3));
}

/// Lookups after storing [1..6], [1, 2, 3, 4, 8, 9] and [1, 2, 7], with the tokens each reuses.
const SPLIT_HITS: [(&[u32], usize); 5] = [
    (&[1, 2, 3, 4, 5, 6, 0], 6),
    (&[1, 2, 3, 4, 8, 9, 0], 6),
    (&[1, 2, 7, 0], 3),
    (&[1, 2, 3, 0], 3),
    (&[1, 2, 3, 4, 8, 0], 5),
];

#[test]
fn an_edge_split_reparents_its_children_and_keeps_every_span() {
    let mut c = PrefixCache::new(1 << 20);
    insert(&mut c, &[1, 2, 3, 4, 5, 6]);
    insert(&mut c, &[1, 2, 3, 4, 8, 9]); // splits [1..6] after 4
    insert(&mut c, &[1, 2, 7]); // splits [1, 2, 3, 4] after 2, above the first split's children
    assert_eq!(c.tokens(), 4 + 2 + 2 + 1, "[1,2] [3,4] [5,6] [8,9] [7]");
    assert_eq!(c.bytes(), c.tokens() * PER_TOKEN);
    for (ids, want) in SPLIT_HITS {
        assert_eq!(hit(&mut c, ids), want, "{ids:?}");
    }
    // Every node's parent lists it as a child, and depth adds up along the path.
    for (i, n) in c.nodes.iter().enumerate().skip(1).filter(|(_, n)| n.alive) {
        assert!(c.nodes[n.parent].children.contains(&i), "node {i} is its parent's child");
        assert_eq!(n.depth, c.nodes[n.parent].depth + c.nodes[n.parent].tokens.len());
    }
}

#[test]
fn eviction_takes_the_least_recently_used_leaf_first() {
    let (a, b, d) = (&[1, 2, 3][..], &[4, 5, 6][..], &[7, 8, 9][..]);
    let mut c = PrefixCache::new(3 * 3 * PER_TOKEN);
    insert(&mut c, a);
    insert(&mut c, b);
    insert(&mut c, d);
    assert_eq!(c.bytes(), 9 * PER_TOKEN);
    assert_eq!(hit(&mut c, &[1, 2, 3, 0]), 3); // a is now the most recently used
    c.evict_to(2 * 3 * PER_TOKEN);
    assert_eq!((c.peek(&[4, 5, 6, 0]), c.peek(&[1, 2, 3, 0]), c.peek(&[7, 8, 9, 0])), (0, 3, 3), "b went first");
    c.evict_to(3 * PER_TOKEN);
    assert_eq!((c.peek(&[1, 2, 3, 0]), c.peek(&[7, 8, 9, 0])), (3, 0), "then d");
    assert_eq!(c.stats.evicted_nodes, 2);
    // A leaf goes before its parent: after [1, 2, 3] splits, the [3] tail is the leaf.
    insert(&mut c, &[1, 2, 5]);
    c.evict_to(0);
    assert_eq!((c.bytes(), c.tokens()), (0, 0));
}

#[test]
fn a_held_prefix_survives_pressure_until_released() {
    let mut c = PrefixCache::new(1 << 20);
    insert(&mut c, &[1, 2, 3, 4, 5, 6]);
    insert(&mut c, &[9, 9, 9]);
    let held = c.lookup(&[1, 2, 3, 4, 0]); // ends inside the edge: it splits at 4
    assert_eq!(held.len, 4);
    let hold = held.hold;
    // A later split inside the held part gives both halves the hold.
    insert(&mut c, &[1, 2, 8]);
    c.evict_to(0);
    assert_eq!(c.peek(&[1, 2, 3, 4, 0]), 4, "the held path is kept");
    assert_eq!(c.peek(&[1, 2, 3, 4, 5, 6, 0]), 4, "its unheld tail [5, 6] is not");
    assert_eq!(c.peek(&[9, 9, 9, 0]), 0);
    assert_eq!(c.peek(&[1, 2, 8, 0]), 2, "nor the [8] leaf");
    assert_eq!(c.bytes(), 4 * PER_TOKEN);
    c.release(hold);
    c.evict_to(0);
    assert_eq!((c.bytes(), c.tokens()), (0, 0), "released, everything can go");
}

#[test]
fn an_entry_over_the_budget_is_not_kept() {
    let mut c = PrefixCache::new(3 * PER_TOKEN);
    insert(&mut c, &[1, 2, 3, 4]);
    assert_eq!((c.bytes(), c.stats.evicted_nodes, c.stats.inserted_tokens), (0, 1, 4));
}

#[test]
fn a_lookup_says_where_reuse_stopped_and_why() {
    let mut c = PrefixCache::new(1 << 20);
    let stop = |c: &mut PrefixCache, ids: &[u32]| {
        let l = c.lookup(ids);
        let (stop, hold) = (l.stop, l.hold);
        c.release(hold);
        stop
    };
    // An empty cache: nothing to reuse, the cache ends at 0.
    let s = stop(&mut c, &[1, 2, 3]);
    assert_eq!((s.reused, s.reason, s.new_token, s.cached_token), (0, StopReason::CacheEnds, Some(1), None));
    insert(&mut c, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    // One token changed in the middle: reuse stops at it, both sides named, the cached text after it.
    let s = stop(&mut c, &[1, 2, 3, 4, 50, 6, 7]);
    assert_eq!((s.reused, s.reason, s.new_token, s.cached_token), (4, StopReason::Differs, Some(50), Some(5)));
    assert_eq!(s.cached_after, [6, 7, 8, 9, 10, 11, 12]);
    // The lookup above split the edge at 4; the stop is the same across the split.
    let s = stop(&mut c, &[1, 2, 3, 4, 60]);
    assert_eq!((s.reused, s.reason, s.cached_token), (4, StopReason::Differs, Some(5)));
    // A prompt the cache holds whole: all but its last token, which is computed for its logits.
    let s = stop(&mut c, &[1, 2, 3]);
    assert_eq!((s.reused, s.reason, s.new_token, s.cached_token), (2, StopReason::LastToken, Some(3), Some(3)));
    // Longer than what is cached: the cache ends.
    let s = stop(&mut c, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    assert_eq!((s.reused, s.reason, s.new_token, s.cached_token), (12, StopReason::CacheEnds, Some(13), None));
    // Two continuations: the one that goes on with the prompt's token is not a difference; of
    // others, the most recently used is named.
    insert(&mut c, &[1, 2, 3, 4, 70, 71]);
    let s = stop(&mut c, &[1, 2, 3, 4, 80]);
    assert_eq!((s.reused, s.cached_token, s.cached_after.as_slice()), (4, Some(70), &[71][..]));
    let s = stop(&mut c, &[1, 2, 3, 4, 5, 6, 99]);
    assert_eq!((s.reused, s.reason, s.cached_token), (6, StopReason::Differs, Some(7)));
    // A different first token: reuse stops at 0 against what the cache starts with.
    let s = stop(&mut c, &[9, 2, 3]);
    assert_eq!((s.reused, s.reason, s.new_token, s.cached_token), (0, StopReason::Differs, Some(9), Some(1)));
}

#[test]
fn blocks_of_any_size_map_back_the_exact_prefix_and_go_back_when_nobody_holds_them() {
    for b in [1, 2, 3, 4, 16] {
        let mut c = PrefixCache::new(1 << 20);
        let caches: Vec<_> = [&[1, 2, 3, 4, 5, 6][..], &[1, 2, 3, 4, 8, 9], &[1, 2, 7]]
            .iter()
            .map(|ids| cache_in_blocks(ids, b))
            .collect();
        for (cache, ids) in caches.iter().zip([&[1, 2, 3, 4, 5, 6][..], &[1, 2, 3, 4, 8, 9], &[1, 2, 7]]) {
            c.insert(ids, cache);
        }
        for (ids, want) in SPLIT_HITS.into_iter().chain([(&[1, 2, 3, 4, 5, 0][..], 5)]) {
            assert_eq!(hit_in(&mut c, ids, b), want, "B={b} {ids:?}");
        }
        // A sequence that maps a hit keeps its blocks when the tree evicts everything.
        let Lookup { len, blocks, hold, .. } = c.lookup(&[1, 2, 3, 4, 8, 9, 0]);
        let mut seq = KvCache::with_spec(&cfg(), 64, KvSpec::new(b).unwrap());
        seq.map_prefix(&blocks, len).unwrap();
        drop(blocks);
        c.release(hold);
        let pools: Vec<_> = caches.iter().map(|k| k.pool().clone()).collect();
        drop(caches);
        c.evict_to(0);
        assert_eq!(c.tokens(), 0);
        let want = cache_in_blocks(&[1, 2, 3, 4, 8, 9], b);
        assert!(seq.same_bits(&want, 6), "B={b}: an evicted node freed no block a sequence maps");
        let held: usize = pools.iter().map(|p| p.used_blocks()).sum();
        assert_eq!(held, seq.blocks().len(), "B={b}: only the sequence's blocks are still out");
        drop(seq);
        assert_eq!(pools.iter().map(|p| p.used_blocks()).sum::<usize>(), 0, "B={b}: every block went back");
    }
}

#[test]
fn a_sequence_maps_the_trees_whole_blocks_for_its_tokens_and_keeps_the_one_it_writes() {
    for b in [1, 2, 4] {
        let mut c = PrefixCache::new(1 << 20);
        let first: Vec<u32> = (1..=8).collect();
        let a = cache_in_blocks(&first, b);
        let own = c.insert_shared(&first, &a, 8);
        assert!(own.iter().zip(a.blocks()).all(|(x, y)| Arc::ptr_eq(x, y)), "B={b}: the first holder's own blocks");
        // The same tokens computed again, one more: its whole blocks of the 8 become the first's.
        let ids: Vec<u32> = (1..=9).collect();
        let mut again = cache_in_blocks(&ids, b);
        let blocks = c.insert_shared(&ids, &again, 8);
        assert_eq!(again.share_whole(&blocks), 8 / b, "B={b}");
        assert_eq!(again.pool().used_blocks(), 9usize.div_ceil(b) - 8 / b, "B={b}: its own copies went back");
        assert!(again.same_bits(&cache_in_blocks(&ids, b), 9), "B={b}: the same K/V at every position");
        // A prompt that differs at position 3 shares only the whole blocks before it.
        let other = [1, 2, 3, 7, 7, 7, 7, 7];
        let mut third = cache_in_blocks(&other, b);
        let blocks = c.insert_shared(&other, &third, 8);
        assert_eq!(third.share_whole(&blocks), 3 / b, "B={b}: blocks wholly before the first difference");
        assert!(third.same_bits(&cache_in_blocks(&other, b), 8), "B={b}");
    }
}

#[test]
fn a_peek_counts_the_blocks_it_would_map_that_only_the_tree_holds() {
    let mut c = PrefixCache::new(1 << 20);
    let (kept, gone) = (cache_in_blocks(&[1, 2, 3, 4, 5, 6], 2), cache_in_blocks(&[1, 2, 3, 4, 8, 9], 2));
    c.insert(&[1, 2, 3, 4, 5, 6], &kept);
    c.insert(&[1, 2, 3, 4, 8, 9], &gone);
    drop(gone); // its own last block ([8, 9]) is the tree's alone now; `kept` maps all of its three
    let evictable = c.evictable();
    assert_eq!(evictable.len(), 1);
    assert_eq!(c.peek_in(&evictable, &[1, 2, 3, 4, 8, 9, 0]), (6, 1), "[8, 9]'s block would be pinned");
    assert_eq!(c.peek_in(&evictable, &[1, 2, 3, 4, 5, 6, 0]), (6, 0), "a running cache maps these anyway");
    assert_eq!(c.peek_in(&Evictable::none(), &[1, 2, 3, 4, 8, 9, 0]), (6, 0));
}
