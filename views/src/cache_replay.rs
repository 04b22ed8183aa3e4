//! Prompts replayed through a prompt cache, in order, as a server would see them: each is looked
//! up in the cache the earlier ones filled, its cached prefix restored and the rest computed, then
//! stored. What `kvgpt cache diff` reports, offline: where reuse stopped for each prompt, its
//! block table (the blocks it shares with the earlier prompts, the one it copied, its own), how
//! long its prefill took with what was reused against from nothing, and whether both gave the
//! same bits. Every sequence takes its blocks from one pool, so block numbers are comparable.

use kvgpt_core::error::Result;
use kvgpt_core::kv_cache::{Block, Pool};
use kvgpt_core::model::{Model, Scratch};
use kvgpt_core::prefix_cache::{PrefixCache, ReuseStop};
use kvgpt_core::sampler::Sampling;
use kvgpt_core::sequence::Sequence;
use kvgpt_core::store::{Store, TierReuse};
use kvgpt_core::KvCache;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a sequence holds one of its blocks after its prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// The prompt cache's block, mapped without a copy (an earlier prompt computed it).
    Shared,
    /// A copy of the prompt cache's partly matched block, made before this prompt wrote into it.
    Copied,
    /// Taken from the pool for positions this prompt computed.
    Own,
    /// Loaded from the disk tier (`--kv-disk`) for this prompt: past what the prompt cache held.
    Disk,
}

/// One row of a sequence's block table.
#[derive(Clone, Debug, Serialize)]
pub struct BlockRow {
    /// Logical block `j`: positions `j·B..(j+1)·B`.
    pub logical: usize,
    /// The pool's block that holds it.
    pub physical: usize,
    pub kind: BlockKind,
    /// For a copy, the block it was copied from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copied_from: Option<usize>,
}

/// A sequence's table against the blocks a prompt-cache hit gave it.
fn table(blocks: &[Arc<Block>], mapped: &[Arc<Block>]) -> Vec<BlockRow> {
    let row = |(logical, b): (usize, &Arc<Block>)| {
        let from = mapped.get(logical);
        let kind = match from {
            Some(m) if Arc::ptr_eq(m, b) => BlockKind::Shared,
            Some(_) => BlockKind::Copied,
            None => BlockKind::Own,
        };
        let copied_from = from.filter(|_| kind == BlockKind::Copied).map(|m| m.id());
        BlockRow { logical, physical: b.id(), kind, copied_from }
    };
    blocks.iter().enumerate().map(row).collect()
}

/// One prompt of a replay.
pub struct Replayed {
    pub stop: ReuseStop,
    /// Its block table after the prefill (blocks of the model's `--kv-block-size`).
    pub blocks: Vec<BlockRow>,
    /// The prefill with the cached prefix restored: the positions from the stop on.
    pub prefill: Duration,
    /// The same prompt's prefill from an empty cache.
    pub cold_prefill: Duration,
    /// Both prefills gave the same next-token logits, bit for bit.
    pub same_bits: bool,
    /// Reading, checking and placing the blocks the disk tier gave (zero without one).
    pub load: Duration,
}

/// Feeds what `seq` has not computed yet (everything after a restored prefix), timed; its logits.
fn prefill(model: &Model, seq: &mut Sequence) -> Result<(Duration, Vec<f32>)> {
    let mut scratch = Scratch::new(&model.config, seq.pending());
    let t0 = Instant::now();
    seq.feed(model, &mut scratch)?;
    Ok((t0.elapsed(), seq.logits().to_vec()))
}

/// What the store gave `ids` beyond the prompt cache, put into the cache's tree as a server's
/// load does: from which position, its blocks' positions, the blocks, and how long it took.
fn load(
    model: &Model,
    pool: &Pool,
    cache: &mut PrefixCache,
    store: &Store,
    ids: &[u32],
) -> Result<(usize, usize, Vec<Arc<Block>>, Duration)> {
    let t0 = Instant::now();
    let (b, ram) = (model.kv().block(), cache.peek(ids));
    let start = ram / b * b;
    let mut kv = KvCache::in_pool(pool, &model.config, ids.len());
    kv.map_prefix(&cache.blocks_of(ids, start).1, start)?;
    let gave = store.extend(ids, &mut kv);
    if start + gave <= ram {
        return Ok((start, 0, vec![], t0.elapsed()));
    }
    cache.insert(&ids[..kv.len()], &kv);
    Ok((start, gave, kv.blocks()[start / b..].to_vec(), t0.elapsed()))
}

/// Replays `prompts` in order through one prompt cache (unbounded: nothing is evicted), every
/// sequence's blocks from one pool that can hold them all; with a `store` under it (`--kv-disk`),
/// each prompt is continued from there first, and what it computed is written to it.
pub fn replay(model: &Model, prompts: &[Vec<u32>], store: Option<&Store>) -> Result<Vec<Replayed>> {
    let mut cache = PrefixCache::new(usize::MAX);
    let b = model.kv().block();
    // Each prompt's blocks in the tree, its cold run's, and its load's (a copy of a partial block).
    let per = if store.is_some() { 3 } else { 2 };
    let pool = Pool::new(&model.config, model.kv(), prompts.iter().map(|p| per * p.len().div_ceil(b) + 1).sum());
    let new_seq = |ids: &[u32]| Sequence::new_in(Some(&pool), model, ids, (1, Sampling::GREEDY));
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let mut out = Vec::with_capacity(prompts.len());
    for ids in prompts {
        let (cold, cold_logits) = prefill(model, &mut new_seq(ids)?)?;
        let (start, gave, loaded, load) = match store {
            Some(s) => load(model, &pool, &mut cache, s, ids)?,
            None => (0, 0, vec![], Duration::ZERO),
        };
        let mut found = cache.lookup(ids);
        if store.is_some() {
            found.stop.tiers = Some(TierReuse { disk: gave, ..TierReuse::default() }.of(start, found.len));
        }
        let mut seq = new_seq(ids)?;
        seq.map_prefix(&found.blocks, found.len)?;
        let (warm, logits) = prefill(model, &mut seq)?;
        let mut blocks = table(seq.cache().blocks(), &found.blocks);
        for r in blocks.iter_mut().filter(|r| loaded.iter().any(|l| l.id() == r.physical)) {
            r.kind = BlockKind::Disk;
        }
        cache.insert(ids, seq.cache());
        cache.release(found.hold);
        if let Some(s) = store {
            s.save(&seq, ids.len());
        }
        let same_bits = bits(&logits) == bits(&cold_logits);
        out.push(Replayed { stop: found.stop, blocks, prefill: warm, cold_prefill: cold, same_bits, load });
    }
    Ok(out)
}
