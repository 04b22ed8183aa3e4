//! `kvgpt cache verify DIR`: a disk tier checked offline, block by block. Each block of this
//! model's K/V (its fingerprint, type and block size) is read and checked as a lookup would
//! (header, length, checksum, key), then proved: the blocks before it on its chain are loaded as
//! stored, its positions are recomputed after them, and its rows must be the stored bits. Blocks
//! whose chain does not lead from position 0 in whole stored blocks cannot be proved (orphans).

use super::entry::{decode, is_of, Refusal};
use super::{BlockKey, DiskTier, Keying};
use crate::error::Result;
use crate::kv_cache::BlockShape;
use crate::model::{Model, Scratch};
use std::collections::HashMap;
use std::path::Path;

/// What the check found.
#[derive(Debug, Default)]
pub struct Audit {
    /// Blocks whose recomputed bits are the stored ones.
    pub proved: usize,
    /// Blocks whose recomputed bits differ (stored K/V this model does not compute).
    pub differ: Vec<BlockKey>,
    /// Blocks refused before recomputing (header, truncated, checksum, not their key).
    pub damaged: Vec<(BlockKey, Refusal)>,
    /// Blocks of another model, K/V type or block size (left alone).
    pub others: usize,
    /// Blocks whose chain misses a block (evicted): they cannot be proved.
    pub orphans: usize,
}

/// Where a stored block sits on its chain (its rows are read again when it is proved).
struct Meta {
    parent: BlockKey,
    first: usize,
    n: usize,
}

/// Checks every block in `dir` for `model` (nothing is changed). Two passes: every file is read
/// and checked, keeping only where each block sits; then the chains are walked from position 0,
/// depth first, with one cache holding the stored blocks before the one proved (each file read
/// once more): memory for one context, however large the directory.
pub fn audit(model: &Model, dir: &Path) -> Result<Audit> {
    let disk = DiskTier::open(dir, u64::MAX).map_err(|e| crate::error::Error::io(dir, e))?;
    let keying = Keying::of(model);
    let shape = BlockShape::of(&model.config, model.kv());
    let mut out = Audit::default();
    let mut mine: HashMap<BlockKey, Meta> = HashMap::new();
    for key in disk.keys() {
        let Some(bytes) = disk.get(key) else { continue };
        if !is_of(&bytes, &keying, shape) {
            out.others += 1;
            continue;
        }
        match decode(bytes, &keying, shape, key) {
            Ok(e) => _ = mine.insert(key, Meta { parent: e.parent, first: e.first, n: e.tokens.len() }),
            Err(r) => out.damaged.push((key, r)),
        }
    }
    // Children of whole blocks only: a chain leads from position 0 in whole blocks.
    let mut children: HashMap<BlockKey, Vec<BlockKey>> = HashMap::new();
    for (key, m) in &mine {
        let whole_parent = m.parent == BlockKey::ROOT || mine.get(&m.parent).is_some_and(|p| p.n == keying.block);
        if whole_parent {
            children.entry(m.parent).or_default().push(*key);
        }
    }
    let mut cache = model.new_cache(model.config.n_positions);
    let mut scratch = Scratch::new(&model.config, keying.block);
    let mut stack: Vec<BlockKey> = children.get(&BlockKey::ROOT).cloned().unwrap_or_default();
    let mut reached = 0;
    while let Some(key) = stack.pop() {
        let m = &mine[&key];
        // Every block on the stack after this one's parent was processed lies at or past its first.
        cache.truncate(m.first);
        if cache.len() != m.first || m.first + m.n > model.config.n_positions {
            continue; // not where its parent ends, or past the context (not written by kvgpt)
        }
        reached += 1;
        let Some(e) = disk.get(key).and_then(|b| decode(b, &keying, shape, key).ok()) else {
            out.damaged.push((key, Refusal::Truncated)); // gone or changed since the first pass
            continue;
        };
        model.run(&e.tokens, &mut cache, &mut scratch, &mut [])?;
        if e.same_rows(&cache.blocks()[e.first / keying.block]) {
            out.proved += 1;
        } else {
            out.differ.push(key);
        }
        if let Some(kids) = children.get(&key).filter(|_| m.n == keying.block) {
            // What comes after is proved after this block as stored.
            cache.truncate(m.first);
            cache.append_held(e.rows(), m.n)?;
            stack.extend(kids);
        }
    }
    out.orphans = mine.len() - reached;
    Ok(out)
}
