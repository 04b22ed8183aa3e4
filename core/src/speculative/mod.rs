//! Speculative decoding, exact.
//!
//! A draft proposes up to k tokens; the model feeds the last accepted token and the drafted ones
//! in one forward (one read of the weights for k + 1 rows), and chooses its own token at every
//! row, with its own sampler, in order: while its choice equals the draft it goes on, at the first
//! disagreement its own choice is kept and the rest dropped, and the cache is rolled back to what
//! was accepted. Every row of a multi-row forward has the bits a one-row decode of the same token
//! at the same position has (no row's arithmetic reads another's), and each chosen token takes
//! exactly one draw of the sampler, as decoding alone does, so the answer is the model's alone,
//! bit for bit: ids, logits and log-probabilities, greedy or sampled with the same seed.
//!
//! For sampling this is speculative (rejection) sampling with a draft that proposes one token
//! with certainty (q = δₓ): accept x with probability min(1, p(x)/q(x)) = p(x), and on rejection
//! draw from (p − q)₊ normalised, which is p without x. Drawing y ~ p and accepting iff y = x does
//! both with one uniform draw.
//!
//! [`Speculation`] holds one sequence's draft and chooses how many tokens to draft each step
//! ([`Speculation::plan`]): from the acceptance seen so far, the expected tokens per verify step
//! against what the step costs (extra rows, the draft's own forwards), down to none.

mod costs;
mod draft;
mod spec;

pub use costs::Costs;
pub use draft::{DraftSource, Lookup, ModelDraft};
pub use spec::{DraftKind, DraftSpec, Drafting};

use crate::error::Result;
use crate::kv_cache::{BlockShape, KvCache, Pool};

/// Proposes up to `k` tokens to follow `ids` (the accepted sequence so far) into `out`.
pub trait Draft: Send {
    fn propose(&mut self, ids: &[u32], k: usize, out: &mut Vec<u32>) -> Result<()>;

    /// Takes in `ids` (the prompt, once the target has computed it) ahead of the first
    /// proposal, so that the draft's own prefill is part of the prompt's time, not the first
    /// decode step's. Drafts without state need nothing.
    fn prefill(&mut self, _ids: &[u32]) -> Result<()> {
        Ok(())
    }

    /// Gives back the memory its state holds (a preempted sequence's draft); the next proposal
    /// starts again from the sequence's ids.
    fn release(&mut self) {}
}

/// What drafting did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Verify steps that fed at least one drafted token.
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl DraftStats {
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            return 0.0;
        }
        self.accepted as f64 / self.drafted as f64
    }

    pub fn add(&mut self, o: DraftStats) {
        self.steps += o.steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
    }
}

/// Every this many steps without drafting, one token is drafted anyway, so that a draft that
/// starts to agree again is noticed (what an always-wrong draft costs: DESIGN.md).
const PROBE_EVERY: usize = 16;

/// Acceptance is counted with this decay per verify step (recent steps weigh more).
const DECAY: f64 = 0.97;

/// One sequence's draft and the statistics its k is chosen from.
pub struct Speculation {
    draft: Box<dyn Draft>,
    /// At most this many drafted tokens a step.
    pub max_k: usize,
    /// What a verify row and a drafted token cost ([`Costs::measure`]).
    costs: Costs,
    /// Decayed counts of drafted tokens accepted, and of tokens judged (accepted or rejected).
    hits: f64,
    judged: f64,
    idle: usize,
    /// Draft at least this many tokens a step (room permitting), whatever the costs say.
    pub min_k: usize,
    pub stats: DraftStats,
    /// The tokens proposed this step (reused).
    pub proposed: Vec<u32>,
}

impl Speculation {
    pub fn new(draft: Box<dyn Draft>, max_k: usize, costs: Costs) -> Speculation {
        Speculation {
            draft,
            max_k,
            costs,
            hits: 0.0,
            judged: 0.0,
            idle: 0,
            min_k: 0,
            stats: DraftStats::default(),
            proposed: Vec::with_capacity(max_k),
        }
    }

    /// The same draft, drafting `max_k` tokens every step it has room for.
    pub fn fixed(self) -> Speculation {
        Speculation { min_k: self.max_k, ..self }
    }

    /// The chance that a drafted token is accepted, as seen so far (with a prior of one half
    /// worth two tokens, so the first steps draft).
    pub fn acceptance(&self) -> f64 {
        (self.hits + 1.0) / (self.judged + 2.0)
    }

    /// How many tokens to draft this step, at most `room`, for a sequence that decodes beside
    /// `batch − 1` others: the d that maximises the expected tokens per step,
    /// (1 − αᵈ⁺¹)/(1 − α), over its cost relative to this sequence's share of a step without
    /// drafts, (1 + e·B)/B + d·(e + c·(1 + e)) for row cost e and draft cost c. None if no d pays,
    /// except a one-token probe every [`PROBE_EVERY`] idle steps; no probe either where no d could
    /// pay were every draft accepted (a share of a large batch smaller than a drafted token).
    /// Never fewer than `min_k`.
    pub fn plan(&mut self, room: usize, batch: usize) -> usize {
        self.best(room, batch).max(self.min_k).min(room)
    }

    fn best(&mut self, room: usize, batch: usize) -> usize {
        let (a, e, c) = (self.acceptance().min(0.999), self.costs.row, self.costs.draft);
        let b = batch.max(1) as f64;
        let share = (1.0 + e * b) / b;
        if share <= e + c * (1.0 + e) {
            return 0; // two tokens for the price of more than two shares: never pays
        }
        let gain =
            |d: usize| (1.0 - a.powi(d as i32 + 1)) / (1.0 - a) * share / (share + d as f64 * (e + c * (1.0 + e)));
        let best = (0..=self.max_k.min(room)).max_by(|&x, &y| gain(x).total_cmp(&gain(y))).unwrap_or(0);
        if best > 0 {
            self.idle = 0;
            return best;
        }
        self.idle += 1;
        if self.idle >= PROBE_EVERY && room > 0 && self.max_k > 0 {
            self.idle = 0;
            return 1;
        }
        0
    }

    /// Proposes up to `k` tokens after `ids` into [`Speculation::proposed`].
    /// The draft's prefill of `ids` ([`Draft::prefill`]).
    pub fn prefill(&mut self, ids: &[u32]) -> Result<()> {
        self.draft.prefill(ids)
    }

    /// The draft gives back its memory (see [`Draft::release`]).
    pub fn release(&mut self) {
        self.draft.release();
    }

    pub fn propose(&mut self, ids: &[u32], k: usize) -> Result<()> {
        self.proposed.clear();
        if k > 0 {
            self.draft.propose(ids, k, &mut self.proposed)?;
            self.proposed.truncate(k);
        }
        Ok(())
    }

    /// Records a verify step: `accepted` of `drafted` tokens were the model's.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.stats.steps += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        let rejected = usize::from(accepted < drafted);
        self.hits = self.hits * DECAY + accepted as f64;
        self.judged = self.judged * DECAY + (accepted + rejected) as f64;
    }
}

/// How sequences draft: where drafts come from, at most how many a step, and what one costs.
/// Shared by every sequence (a server's draft model is loaded once).
#[derive(Clone)]
pub struct DraftConfig {
    pub source: DraftSource,
    pub max_k: usize,
    /// Draft at least this many a step (`--draft-min`; 0: as the costs say).
    pub min_k: usize,
    pub costs: Costs,
}

impl std::fmt::Debug for DraftConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            DraftSource::Lookup { max_ngram } => format!("lookup (n-grams up to {max_ngram})"),
            DraftSource::Model(m) => format!("a model of {} layers × {}", m.config.n_layer, m.config.n_embd),
        };
        f.debug_struct("DraftConfig")
            .field("source", &source)
            .field("max_k", &self.max_k)
            .field("min_k", &self.min_k)
            .finish()
    }
}

impl DraftConfig {
    /// Bytes of the draft model's weights (0 for lookup): the memory drafting costs, beside
    /// [`DraftConfig::kv_bytes`] per sequence.
    pub fn weight_bytes(&self) -> usize {
        match &self.source {
            DraftSource::Lookup { .. } => 0,
            DraftSource::Model(m) => m.weight_bytes(),
        }
    }

    /// Bytes of one sequence's draft cache at `positions` positions outside a pool of blocks
    /// `shape` (0 when the draft's blocks are that shape: they are the pool's).
    pub fn kv_bytes(&self, positions: usize, shape: BlockShape) -> usize {
        match &self.source {
            DraftSource::Model(m) if BlockShape::of(&m.config, m.kv()) != shape => {
                positions * KvCache::bytes_per_position_as(&m.config, m.kv().kv_type())
            }
            _ => 0,
        }
    }

    /// One sequence's speculation, its draft sized for `capacity` positions, its K/V in `pool`
    /// when the draft model's blocks are the pool's shape (else in a cache of its own).
    pub fn speculation(&self, capacity: usize, pool: Option<&Pool>) -> Speculation {
        let spec = Speculation::new(self.source.make(capacity, pool), self.max_k, self.costs);
        Speculation { min_k: self.min_k.min(self.max_k), ..spec }
    }
}
