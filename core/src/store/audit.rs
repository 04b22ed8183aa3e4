//! `kvgpt cache verify DIR`: a disk tier checked offline, block by block. Each block of this
//! model's K/V (its fingerprint, type and block size) is read and checked as a lookup would
//! (header, length, checksum, key), then proved: the blocks before it on its chain are loaded as
//! stored, its positions are recomputed after them, and its rows must be the stored bits.

use super::entry::{decode, is_of, Entry, Refusal};
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

/// Checks every block in `dir` for `model` (nothing is changed).
pub fn audit(model: &Model, dir: &Path) -> Result<Audit> {
    let disk = DiskTier::open(dir, u64::MAX).map_err(|e| crate::error::Error::io(dir, e))?;
    let keying = Keying::of(model);
    let shape = BlockShape::of(&model.config, model.kv());
    let mut out = Audit::default();
    let mut mine: HashMap<BlockKey, Entry> = HashMap::new();
    for key in disk.keys() {
        let Some(bytes) = disk.get(key) else { continue };
        if !is_of(&bytes, &keying, shape) {
            out.others += 1;
            continue;
        }
        match decode(bytes, &keying, shape, key) {
            Ok(e) => {
                mine.insert(key, e);
            }
            Err(r) => out.damaged.push((key, r)),
        }
    }
    let mut scratch = Scratch::new(&model.config, keying.block);
    for (key, e) in &mine {
        // A chain that does not lead from position 0 to this block in whole blocks cannot be
        // proved: an ancestor was evicted (or the files were not written by kvgpt).
        let Some(chain) = chain(&mine, e).filter(|c| c.iter().all(|p| p.tokens.len() == keying.block)) else {
            out.orphans += 1;
            continue;
        };
        if chain.len() * keying.block != e.first {
            out.orphans += 1;
        } else if recomputes(model, &mut scratch, &chain, e)? {
            out.proved += 1;
        } else {
            out.differ.push(*key);
        }
    }
    Ok(out)
}

/// Whether recomputing `e`'s positions after the stored blocks of `chain` (whole, from position
/// 0) gives exactly its stored rows.
fn recomputes(model: &Model, scratch: &mut Scratch, chain: &[&Entry], e: &Entry) -> Result<bool> {
    let mut cache = model.new_cache(e.first + e.tokens.len());
    for before in chain {
        cache.append_held(before.rows(), before.tokens.len())?;
    }
    model.run(&e.tokens, &mut cache, scratch, &mut [])?;
    Ok(e.same_rows(&cache.blocks()[e.first / model.kv().block()]))
}

/// The stored blocks before `e` on its chain, from the first; None if one is missing (or the
/// chain is longer than any context: a loop crafted by hand).
fn chain<'a>(mine: &'a HashMap<BlockKey, Entry>, e: &Entry) -> Option<Vec<&'a Entry>> {
    let mut out = vec![];
    let mut parent = e.parent;
    while parent != BlockKey::ROOT {
        if out.len() > e.first {
            return None;
        }
        let p = mine.get(&parent)?;
        out.push(p);
        parent = p.parent;
    }
    out.reverse();
    Some(out)
}
