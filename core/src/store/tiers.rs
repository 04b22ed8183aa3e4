//! The tiers a store reads and writes, with what each did: shared by the writing thread
//! (`writer.rs`) and the reading one (`reader.rs`).

use super::entry::Refusal;
use super::known::Known;
use super::{Keying, Tier};
use crate::kv_cache::BlockShape;
use std::sync::atomic::{AtomicU64, AtomicUsize};

/// Why a read block was refused, in the order the counts keep them.
pub(super) const REASONS: [Refusal; 4] = [Refusal::Header, Refusal::Truncated, Refusal::Checksum, Refusal::Mismatch];

/// What a tier did.
#[derive(Debug, Default)]
pub(super) struct TierStats {
    pub(super) written: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) refused: [AtomicU64; 4],
}

/// The tiers, in lookup order, and what is shared about them.
pub(super) struct Tiers {
    pub(super) keying: Keying,
    pub(super) shape: BlockShape,
    pub(super) tiers: Vec<(Box<dyn Tier>, TierStats)>,
    /// Blocks handed to the writer and not yet written, and the most there may be.
    pub(super) inflight: AtomicUsize,
    pub(super) max_inflight: AtomicUsize,
    pub(super) known: Known,
}
