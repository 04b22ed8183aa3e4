//! A sequence in the engine: its [`Sequence`], what was asked of it, where it is, where its
//! events go and the times its usage reports.

use super::policy::{Phase, SlotView};
use super::request::{Event, Request, SeqId, Usage};
use crate::prefix_cache::{Hold, ReuseStop};
use crate::sequence::Sequence;
use crate::store::TierReuse;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// A submitted sequence waiting for a slot.
pub(super) struct Waiting {
    pub id: SeqId,
    pub req: Request,
    pub events: UnboundedSender<Event>,
    pub submitted: Instant,
    /// What the tiers under the prompt cache were asked for its prompt's prefix.
    pub tiers: TierLoad,
}

/// A waiting sequence's prefix in the tiers under the prompt cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum TierLoad {
    /// Not asked yet.
    #[default]
    Unasked,
    /// Being read, off the step loop (it is not admitted until the answer is placed).
    Loading,
    /// Answered: what was loaded, if anything (from which position, how many from each tier).
    Loaded(Option<(usize, TierReuse)>),
}

impl Waiting {
    pub fn view(&self) -> SlotView<'_> {
        let phase = if self.tiers == TierLoad::Loading { Phase::Loading } else { Phase::Admitted };
        SlotView { id: self.id, phase, prompt: &self.req.prompt, pending: self.req.prompt.len() }
    }

    pub fn gone(&self) -> bool {
        self.events.is_closed()
    }
}

/// A sequence that holds a slot.
pub(super) struct Slot {
    pub id: SeqId,
    pub seq: Sequence,
    pub req: Request,
    pub phase: Phase,
    pub events: UnboundedSender<Event>,
    /// The prompt-cache prefix it started from, held until it finishes.
    pub hold: Option<Hold>,
    pub cached: usize,
    /// What the store loaded for its prompt (see [`Waiting::loaded`]).
    pub loaded: Option<(usize, TierReuse)>,
    /// Positions of its ids given to the prompt cache (their whole blocks shared).
    pub shared: usize,
    /// Where its lookup in the prompt cache stopped (None with the cache off).
    pub reuse: Option<ReuseStop>,
    pub submitted: Instant,
    pub admitted: Instant,
    pub first_token: Option<Instant>,
    pub last_token: Instant,
    /// Generated tokens sent (a step may make several; those after an end are not sent).
    pub sent: usize,
}

impl Slot {
    pub fn new(w: Waiting, seq: Sequence) -> Slot {
        let now = Instant::now();
        Slot {
            id: w.id,
            seq,
            req: w.req,
            phase: Phase::Admitted,
            events: w.events,
            hold: None,
            cached: 0,
            loaded: match w.tiers {
                TierLoad::Loaded(l) => l,
                _ => None,
            },
            shared: 0,
            reuse: None,
            submitted: w.submitted,
            admitted: now,
            first_token: None,
            last_token: now,
            sent: 0,
        }
    }

    /// What the policy sees: a preempted sequence (admitted again) is looked up by all its ids.
    pub fn view(&self) -> SlotView<'_> {
        let prompt = if self.phase == Phase::Admitted { self.seq.ids() } else { self.seq.prompt() };
        SlotView { id: self.id, phase: self.phase, prompt, pending: self.seq.pending() }
    }

    pub fn gone(&self) -> bool {
        self.events.is_closed()
    }

    /// Sends an event; a receiver that has gone is noticed at the next step.
    pub fn send(&self, e: Event) {
        let _ = self.events.send(e);
    }

    /// The usage so far (at most `completion` generated tokens counted).
    pub fn usage(&self, completion: usize) -> Usage {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let prompt = self.seq.prompt().len();
        let drafts = self.seq.speculation().map(|s| s.stats).unwrap_or_default();
        Usage {
            prompt_tokens: prompt,
            cached_tokens: self.cached,
            prompt_computed: prompt - self.cached,
            completion_tokens: self.seq.generated().len().min(completion),
            queue: self.admitted - self.submitted,
            prompt_time: first - self.admitted,
            decode_time: now - first,
            draft_steps: drafts.steps,
            drafted_tokens: drafts.drafted,
            accepted_tokens: drafts.accepted,
            reuse: self.reuse.clone(),
        }
    }
}
