//! Block events against a mirror built independently: the blocks a tree holds are every whole
//! block of every prefix it can match, so after any run of inserts and evictions, the blocks the
//! events announced (and did not remove) must be exactly those.

use super::*;
use crate::kv_cache::tests::cache_of; // a cache holding made-up K/V for given ids
use crate::prefix_cache::PrefixCache;
use std::collections::{BTreeMap, BTreeSet};

/// SHA-256 over the parent's 8 bytes (big-endian) and the tokens (u32 little-endian), cut to
/// its first 8 bytes: spelt out here byte by byte rather than through `block_hash`.
fn hash_by_hand(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut bytes = vec![];
    if let Some(p) = parent {
        bytes.extend(p.to_be_bytes());
    }
    for t in tokens {
        bytes.extend([*t as u8, (*t >> 8) as u8, (*t >> 16) as u8, (*t >> 24) as u8]);
    }
    let d = Sha256::digest(&bytes);
    d[..8].iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b))
}

#[test]
fn a_stored_prefix_announces_the_blocks_that_end_within_it_chained_from_its_parent() {
    let ids: Vec<u32> = (100..150).collect(); // 50 tokens: three whole blocks of 16
    let h0 = hash_by_hand(None, &ids[..16]);
    let h1 = hash_by_hand(Some(h0), &ids[16..32]);
    let h2 = hash_by_hand(Some(h1), &ids[32..48]);
    // Held from nothing: all three; the first has no parent.
    let e = block_event(&Change::Stored { ids: ids.clone(), from: 0 }, 16).unwrap();
    assert_eq!(e, BlockEvent::Stored { hashes: vec![h0, h1, h2], parent: None, tokens: ids[..48].to_vec() });
    // Held from 20 on: block 1 (16..32) had not been whole, so it is new; block 0 is not.
    let e = block_event(&Change::Stored { ids: ids.clone(), from: 20 }, 16).unwrap();
    assert_eq!(e, BlockEvent::Stored { hashes: vec![h1, h2], parent: Some(h0), tokens: ids[16..48].to_vec() });
    // From exactly a block's end: the next block on.
    let e = block_event(&Change::Stored { ids: ids.clone(), from: 32 }, 16).unwrap();
    assert_eq!(e, BlockEvent::Stored { hashes: vec![h2], parent: Some(h1), tokens: ids[32..48].to_vec() });
    // From within a block: that block on, as it had not been whole.
    let e = block_event(&Change::Stored { ids: ids.clone(), from: 33 }, 16).unwrap();
    assert_eq!(e, BlockEvent::Stored { hashes: vec![h2], parent: Some(h1), tokens: ids[32..48].to_vec() });
    // No block ends within 49..=50, nor within a prefix shorter than a block.
    assert_eq!(block_event(&Change::Stored { ids: ids.clone(), from: 48 }, 16), None);
    assert_eq!(block_event(&Change::Stored { ids: ids[..15].to_vec(), from: 0 }, 16), None);
    let e = block_event(&Change::Removed { ids: ids.clone(), from: 17 }, 16).unwrap();
    assert_eq!(e, BlockEvent::Removed { hashes: vec![h1, h2] });
}

/// Random prompts over a small alphabet (so they share prefixes and split edges), a budget
/// that forces evictions, and holds that keep some prefixes from being evicted for a while.
#[test]
fn the_blocks_announced_are_the_blocks_the_tree_holds_after_every_insert_and_eviction() {
    for size in [1, 3, 4, 16] {
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut cache = PrefixCache::new(20 * 40); // about 40 tokens of K/V
        cache.keep_journal();
        let mut announced: BTreeMap<u64, Vec<u32>> = BTreeMap::new(); // hash → the whole prefix
        let mut sequences: Vec<Vec<u32>> = vec![];
        let mut holds = vec![];
        for step in 0..400 {
            let ids: Vec<u32> = match sequences.get(next(sequences.len() as u64 + 1) as usize) {
                // Often a known prefix grown or cut, so edges split and extend.
                Some(s) if next(3) > 0 => {
                    let keep = next(s.len() as u64 + 1) as usize;
                    let mut v = s[..keep].to_vec();
                    v.extend((0..next(12)).map(|_| next(3) as u32));
                    v.truncate(60); // within the test cache's 64 positions
                    v
                }
                _ => (0..1 + next(30)).map(|_| next(3) as u32).collect(),
            };
            if next(4) == 0 {
                holds.push(cache.lookup(&ids).hold);
            }
            if holds.len() > 3 || (step % 50 == 49) {
                for h in holds.drain(..) {
                    cache.release(h);
                }
            }
            cache.insert(&ids, &cache_of(&ids));
            sequences.push(ids);
            for change in cache.take_changes() {
                match block_event(&change, size) {
                    Some(BlockEvent::Stored { hashes, parent, tokens }) => {
                        let (ids, _) = match &change {
                            Change::Stored { ids, from } => (ids, from),
                            _ => unreachable!("a store"),
                        };
                        let first = ids.len() / size - hashes.len();
                        assert_eq!(parent.is_some(), first > 0);
                        if let Some(p) = parent {
                            assert_eq!(announced.get(&p).map(Vec::len), Some(first * size), "the parent is held");
                        }
                        assert_eq!(tokens, ids[first * size..(first + hashes.len()) * size]);
                        for (k, h) in hashes.into_iter().enumerate() {
                            let prefix = ids[..(first + k + 1) * size].to_vec();
                            assert!(announced.insert(h, prefix).is_none(), "a block announced twice");
                        }
                    }
                    Some(BlockEvent::Removed { hashes }) => {
                        for h in hashes {
                            assert!(announced.remove(&h).is_some(), "a block removed that was never announced");
                        }
                    }
                    Some(BlockEvent::AllCleared) => unreachable!("changes never clear"),
                    None => {}
                }
            }
            // What the tree holds, asked through peek: a prefix of `s` is held iff a lookup of
            // it plus one more token matches it whole.
            let mut held = BTreeMap::new();
            for s in &sequences {
                for end in (size..=s.len()).step_by(size) {
                    let mut probe = s[..end].to_vec();
                    probe.push(99);
                    if cache.peek(&probe) == end {
                        let hashes = block_hashes(s, size, end / size);
                        let mut parent = None;
                        for (k, &h) in hashes.iter().enumerate() {
                            assert_eq!(h, hash_by_hand(parent, &s[k * size..(k + 1) * size]));
                            parent = Some(h);
                        }
                        held.insert(*hashes.last().unwrap(), s[..end].to_vec());
                    }
                }
            }
            let set = |m: &BTreeMap<u64, Vec<u32>>| m.values().cloned().collect::<BTreeSet<_>>();
            assert_eq!(set(&announced), set(&held), "block size {size}, step {step}");
        }
        assert!(cache.stats.evicted_nodes > 50, "the budget forced evictions ({})", cache.stats.evicted_nodes);
    }
}
