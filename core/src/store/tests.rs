//! Keys, the stored form and the disk tier on their own, over the tiny config's blocks.

use super::entry::{decode, encode};
use super::*;
use crate::kv_cache::tests::{cache_in_blocks, cfg};
use crate::kv_cache::{BlockShape, KvSpec};
use crate::model::Fingerprint;

fn keying(block: usize) -> Keying {
    Keying { kv: Fingerprint([7; 32]), block }
}

#[test]
fn a_key_stands_for_every_token_before_it_and_the_model_and_block_size() {
    let k = keying(2);
    let chain = k.chain(&[1, 2, 3, 4, 5]);
    assert_eq!(chain.len(), 2, "whole blocks only");
    assert_eq!(chain[1], k.key(chain[0], 2, &[3, 4]));
    assert_ne!(k.chain(&[9, 2, 3, 4])[1], chain[1], "a different earlier token: another key");
    assert_ne!(keying(4).chain(&[1, 2, 3, 4])[0], k.key(BlockKey::ROOT, 0, &[1, 2, 3, 4]));
    let other = Keying { kv: Fingerprint([8; 32]), block: 2 };
    assert_ne!(other.chain(&[1, 2])[0], chain[0], "another model's K/V: another key");
    assert_ne!(k.key(chain[0], 2, &[3]), k.key(chain[0], 2, &[3, 4]), "a part of a block is its own entry");
}

#[test]
fn a_block_comes_back_as_its_rows_and_anything_else_is_refused() {
    let (ids, b) = ([5u32, 6, 7, 8, 9], 4);
    let cache = cache_in_blocks(&ids, b);
    let shape = BlockShape::of(&cfg(), KvSpec::new(b).unwrap());
    let k = keying(b);
    let key = k.key(BlockKey::ROOT, 0, &ids[..3]);
    let bytes = encode(&k, BlockKey::ROOT, 0, &ids[..3], &cache.blocks()[0]);
    let e = decode(bytes.clone(), &k, shape, key).unwrap();
    assert_eq!((e.first, e.tokens.as_slice(), e.parent), (0, &ids[..3], BlockKey::ROOT));
    let mut back = crate::kv_cache::KvCache::with_spec(&cfg(), 16, KvSpec::new(b).unwrap());
    back.append_held(e.rows(), 3).unwrap();
    assert!(back.same_bits(&cache, 3), "the same K/V at every position");
    let mut flipped = bytes.clone();
    flipped[150] ^= 1;
    assert_eq!(decode(flipped, &k, shape, key).unwrap_err(), Refusal::Checksum);
    assert_eq!(decode(bytes[..bytes.len() - 1].to_vec(), &k, shape, key).unwrap_err(), Refusal::Truncated);
    let mut version = bytes.clone();
    version[8] = 9;
    assert_eq!(decode(version, &k, shape, key).unwrap_err(), Refusal::Header);
    assert_eq!(decode(bytes.clone(), &keying(8), shape, key).unwrap_err(), Refusal::Mismatch, "another block size");
    let other_key = k.key(BlockKey::ROOT, 0, &ids[..2]);
    assert_eq!(decode(bytes.clone(), &k, shape, other_key).unwrap_err(), Refusal::Mismatch, "not the key asked for");
}

#[test]
fn the_disk_tier_keeps_the_most_recently_used_within_its_budget_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let key = |i: u8| BlockKey([i; 32]);
    let disk = DiskTier::open(dir.path(), 300).unwrap();
    for i in 1..=3 {
        assert!(disk.put(key(i), &[i; 100]));
    }
    assert_eq!(disk.get(key(1)), Some(vec![1; 100]), "1 is used again: 2 is now the oldest");
    assert!(disk.put(key(4), &[4; 100]));
    assert_eq!(disk.held(), (3, 300));
    assert!(!disk.has(key(2)) && disk.has(key(1)) && disk.has(key(4)));
    let (old, young) = (dir.path().join("01").join("left.by.a.crash.tmp"), dir.path().join("01").join("in.flight.tmp"));
    std::fs::write(&old, b"x").unwrap();
    std::fs::write(&young, b"x").unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&old).unwrap().set_modified(hour_ago).unwrap();
    drop(disk);
    let again = DiskTier::open(dir.path(), 300).unwrap();
    assert_eq!(again.held(), (3, 300), "the index is the files");
    assert_eq!(again.get(key(4)), Some(vec![4; 100]));
    assert!(!old.exists(), "a crash's temporary file is gone");
    assert!(young.exists(), "another process's write in flight is left alone");
}

#[test]
fn a_store_written_through_gives_blocks_back_token_exact_and_skips_past_its_limit() {
    let (dir, b) = (tempfile::tempdir().unwrap(), 4);
    let ids: Vec<u32> = (10..20).collect();
    let cache = cache_in_blocks(&ids, b);
    let shape = BlockShape::of(&cfg(), KvSpec::new(b).unwrap());
    let tiers: Vec<Box<dyn Tier>> = vec![Box::new(DiskTier::open(dir.path(), 1 << 20).unwrap())];
    let store = Store::new(keying(b), shape, tiers).unwrap();
    store.limit_inflight(2);
    store.save_prefix(&ids, &cache); // three blocks: more than may wait
    assert_eq!(store.counts().tiers[0].unwrap().skipped, 3);
    store.limit_inflight(8);
    store.save_prefix(&ids[..6], &cache); // a whole block and half of the next
    drop(store);
    let tiers: Vec<Box<dyn Tier>> = vec![Box::new(DiskTier::open(dir.path(), 1 << 20).unwrap())];
    let store = Store::new(keying(b), shape, tiers).unwrap();
    let mut back = crate::kv_cache::KvCache::with_spec(&cfg(), 16, KvSpec::new(b).unwrap());
    // Asked for all ten: the six stored, up to the first position not stored.
    assert_eq!(store.fill(&ids, &mut back), 6);
    assert!(back.same_bits(&cache, 6));
    let mut other = crate::kv_cache::KvCache::with_spec(&cfg(), 16, KvSpec::new(b).unwrap());
    let differs: Vec<u32> = [10, 11, 12, 13, 14, 99].to_vec();
    assert_eq!(store.fill(&differs, &mut other), 4, "the part of the second block is another prompt's");
}
