//! The scheduling policy: a pure function from what is running, what waits and what the prompt
//! cache holds to a [`Plan`] for one step. It decides; the runner executes.
//!
//! The rules, in order:
//! 1. Admit waiting sequences, oldest first, while a slot is free and the K/V pool can hold the
//!    blocks of the prompt that the prompt cache does not give, plus a watermark (a sequence
//!    that grows later gets its blocks then; when there are none, the driver preempts). Blocks
//!    only the prompt cache holds count as free (they can be evicted), except those the prompt
//!    would map: mapping them takes them from what eviction can give (a preempted sequence's own
//!    blocks waiting in the cache are no room for it). With nothing running the first always goes
//!    (the handle refused what the pool could never hold), unless its prefix is still being read
//!    from the tiers under the prompt cache: nobody passes a sequence whose prefix is loading.
//! 2. Start each admitted sequence from the longest prefix the prompt cache holds *now*, unless an
//!    earlier sequence that has not produced its first token shares more of its prompt than the
//!    cache holds: then it waits for that prompt to enter the cache rather than compute the same
//!    prefix twice (the earliest always goes).
//! 3. Rows: every pending token of a decoding sequence (its last token, and any drafted after
//!    it, all verified together) and of a full cache hit (one), then prompt chunks in admission
//!    order under what is left of the token budget, so a long new prompt never stalls the
//!    streams that are already decoding.

use super::request::SeqId;

/// Where a sequence in a slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waits for a slot while the tiers under the prompt cache read its prefix: it is not
    /// admitted, nor is anyone after it, until they have answered.
    Loading,
    /// Has a slot; waits to be started from the prompt cache.
    Admitted,
    /// Its prompt is being computed.
    Prefilling,
    /// Has produced its first token; one row per step (more with drafts to verify).
    Decoding,
}

/// What the policy sees of a sequence in a slot (or waiting for one).
#[derive(Clone, Copy, Debug)]
pub struct SlotView<'a> {
    pub id: SeqId,
    pub phase: Phase,
    pub prompt: &'a [u32],
    /// Tokens not yet fed (for an admitted sequence: its whole prompt).
    pub pending: usize,
}

/// The limits the policy works within.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Sequences running at once.
    pub parallel: usize,
    /// Rows per forward step.
    pub batch_tokens: usize,
    /// Whether there is a prompt cache to wait for (rule 2).
    pub prefix_cache: bool,
    pub memory: Memory,
}

/// The K/V memory admission works within.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    /// Blocks free, or held by the prompt cache alone (evictable).
    pub free_blocks: usize,
    /// Positions per block.
    pub block: usize,
    /// Blocks kept free beyond what admitted prompts need.
    pub watermark: usize,
}

impl Memory {
    /// As much memory as anyone could want (tests of the other rules).
    pub const PLENTY: Memory = Memory { free_blocks: usize::MAX / 2, block: 16, watermark: 0 };
}

/// What the prompt cache would give a prompt now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cached {
    /// Tokens it holds of the prompt (at most all but the last).
    pub tokens: usize,
    /// Blocks of those that only the cache holds: counted in [`Memory::free_blocks`] as
    /// evictable, they would not be once the prompt maps them.
    pub evictable: usize,
}

#[cfg(test)]
impl Cached {
    /// `tokens` tokens, in blocks someone else maps too.
    pub fn tokens(tokens: usize) -> Cached {
        Cached { tokens, evictable: 0 }
    }
}

/// One step's decisions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// How many waiting sequences take a slot (from the front of the queue).
    pub admit: usize,
    /// Sequences to start, each with the prompt-cache length it starts from.
    pub start: Vec<(SeqId, usize)>,
    /// Rows each sequence feeds in this step's forward, in slot order (absent: none).
    pub rows: Vec<(SeqId, usize)>,
}

/// Plans one step. `cached(prompt)` is what the prompt cache would give a prompt now.
pub fn plan(running: &[SlotView], waiting: &[SlotView], cached: &dyn Fn(&[u32]) -> Cached, limits: Limits) -> Plan {
    let admit = admissible(running.len(), waiting, cached, limits);
    let mut slots: Vec<SlotView> = running.iter().chain(&waiting[..admit]).copied().collect();
    let mut start = vec![];
    for i in 0..slots.len() {
        if slots[i].phase != Phase::Admitted {
            continue;
        }
        let prompt = slots[i].prompt;
        let cap = prompt.len().saturating_sub(1);
        let have = cached(prompt).tokens;
        let ahead = slots[..i]
            .iter()
            .filter(|q| q.phase != Phase::Decoding)
            .map(|q| q.prompt.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(cap))
            .max()
            .unwrap_or(0);
        if limits.prefix_cache && ahead > have {
            continue; // waits for the earlier one's prompt
        }
        start.push((slots[i].id, have));
        slots[i].phase = Phase::Prefilling;
        slots[i].pending = prompt.len() - have;
    }
    let started = |s: &SlotView| s.phase != Phase::Admitted;
    let whole = |s: &SlotView| started(s) && (s.phase == Phase::Decoding || s.pending == 1);
    let mut budget = limits.batch_tokens.max(1);
    let mut rows = vec![0; slots.len()];
    for (r, s) in rows.iter_mut().zip(&slots).filter(|(_, s)| whole(s)) {
        *r = s.pending;
        budget = budget.saturating_sub(s.pending);
    }
    for (r, s) in rows.iter_mut().zip(&slots).filter(|(_, s)| started(s) && !whole(s)) {
        *r = budget.min(s.pending);
        budget -= *r;
    }
    let rows = slots.iter().zip(rows).filter(|(_, n)| *n > 0).map(|(s, n)| (s.id, n)).collect();
    Plan { admit, start, rows }
}

/// How many of `waiting` (in order) fit the free slots and the pool.
fn admissible(running: usize, waiting: &[SlotView], cached: &dyn Fn(&[u32]) -> Cached, limits: Limits) -> usize {
    let Memory { free_blocks, block, watermark } = limits.memory;
    let mut budget = free_blocks.saturating_sub(watermark);
    let slots = limits.parallel.saturating_sub(running);
    let mut admit = 0;
    for w in waiting.iter().take(slots) {
        if w.phase == Phase::Loading {
            break;
        }
        let Cached { tokens, evictable } = cached(w.prompt);
        let need = w.prompt.len().div_ceil(block) - tokens / block + evictable;
        if need > budget && (running > 0 || admit > 0) {
            break;
        }
        budget = budget.saturating_sub(need);
        admit += 1;
    }
    admit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: SeqId, phase: Phase, prompt: &[u32], pending: usize) -> SlotView<'_> {
        SlotView { id, phase, prompt, pending }
    }

    const LIMITS: Limits = Limits { parallel: 4, batch_tokens: 16, prefix_cache: true, memory: Memory::PLENTY };
    fn none(_: &[u32]) -> Cached {
        Cached::default()
    }

    #[test]
    fn nobody_is_admitted_past_a_prefix_still_loading() {
        let (a, b) = ([1, 2, 3], [4, 5]);
        let waiting = [view(3, Phase::Loading, &a, 3), view(4, Phase::Admitted, &b, 2)];
        assert_eq!(plan(&[], &waiting, &none, LIMITS).admit, 0, "not even with nothing running");
        let loaded = [view(3, Phase::Admitted, &a, 3), view(4, Phase::Loading, &b, 2)];
        assert_eq!(plan(&[], &loaded, &none, LIMITS).admit, 1, "up to the one still loading");
    }

    #[test]
    fn admits_the_oldest_while_slots_are_free() {
        let (a, b, c) = ([1, 2, 3], [4, 5], [6]);
        let running = [view(1, Phase::Decoding, &a, 1), view(2, Phase::Decoding, &b, 1)];
        let waiting =
            [view(3, Phase::Admitted, &c, 1), view(4, Phase::Admitted, &c, 1), view(5, Phase::Admitted, &c, 1)];
        let p = plan(&running, &waiting, &none, LIMITS);
        assert_eq!(p.admit, 2, "two free slots of four");
        assert_eq!(p.start.iter().map(|s| s.0).collect::<Vec<_>>(), [3, 4], "admitted ones start in the same step");
        let full = plan(&[running[0], running[1], running[0], running[1]], &waiting, &none, LIMITS);
        assert_eq!(full.admit, 0);
    }

    #[test]
    fn decode_rows_first_then_prompt_chunks_in_admission_order_under_the_budget() {
        let long = [7u32; 40];
        let running = [
            view(1, Phase::Prefilling, &long, 30),
            view(2, Phase::Decoding, &long, 1),
            view(3, Phase::Prefilling, &long, 10),
            view(4, Phase::Decoding, &long, 1),
        ];
        let p = plan(&running, &[], &none, Limits { batch_tokens: 16, ..LIMITS });
        assert_eq!(p.rows, [(1, 14), (2, 1), (4, 1)], "decodes take 2 of 16; the first prompt the other 14");
        let p = plan(&running, &[], &none, Limits { batch_tokens: 64, ..LIMITS });
        assert_eq!(p.rows, [(1, 30), (2, 1), (3, 10), (4, 1)]);
        // Decoding rows are never dropped, even past the budget.
        let p = plan(&running, &[], &none, Limits { batch_tokens: 1, ..LIMITS });
        assert_eq!(p.rows, [(2, 1), (4, 1)]);
    }

    #[test]
    fn a_decoding_sequence_verifies_all_its_drafts_in_one_step_even_past_the_budget() {
        let long = [7u32; 40];
        let running = [
            view(1, Phase::Prefilling, &long, 30),
            view(2, Phase::Decoding, &long, 6), // its last token and five drafts
            view(3, Phase::Decoding, &long, 1),
        ];
        let p = plan(&running, &[], &none, Limits { batch_tokens: 16, ..LIMITS });
        assert_eq!(p.rows, [(1, 9), (2, 6), (3, 1)], "the drafts take 6 of 16; the prompt what is left");
        let p = plan(&running, &[], &none, Limits { batch_tokens: 4, ..LIMITS });
        assert_eq!(p.rows, [(2, 6), (3, 1)], "drafts are never cut to the budget");
    }

    #[test]
    fn a_started_sequence_feeds_what_the_cache_did_not_give() {
        let prompt = [1u32, 2, 3, 4, 5, 6];
        let waiting = [view(9, Phase::Admitted, &prompt, 6)];
        let p = plan(&[], &waiting, &|ids: &[u32]| Cached::tokens(ids.len() - 2), LIMITS);
        assert_eq!(p.start, [(9, 4)]);
        assert_eq!(p.rows, [(9, 2)]);
        // A full hit (all but the last token) feeds one row, like a decode.
        let p = plan(&[], &waiting, &|ids: &[u32]| Cached::tokens(ids.len() - 1), Limits { batch_tokens: 1, ..LIMITS });
        assert_eq!(p.rows, [(9, 1)]);
    }

    #[test]
    fn a_shared_prefix_is_computed_once() {
        let shared: Vec<u32> = (0..10).chain([100]).collect();
        let other: Vec<u32> = (0..10).chain([200]).collect();
        let unrelated = [50u32, 51, 52];
        let waiting = [
            view(1, Phase::Admitted, &shared, 11),
            view(2, Phase::Admitted, &other, 11),
            view(3, Phase::Admitted, &unrelated, 3),
        ];
        let p = plan(&[], &waiting, &none, LIMITS);
        assert_eq!(p.admit, 3);
        assert_eq!(p.start, [(1, 0), (3, 0)], "the second waits for the first's 10 shared tokens");
        assert_eq!(p.rows, [(1, 11), (3, 3)]);
        // Once the cache holds them, it starts from there.
        let running = [view(1, Phase::Decoding, &shared, 1), view(2, Phase::Admitted, &other, 11)];
        let p = plan(&running, &[], &|ids: &[u32]| Cached::tokens(if ids == &other[..] { 10 } else { 0 }), LIMITS);
        assert_eq!(p.start, [(2, 10)]);
        // Without a prompt cache there is nothing to wait for.
        let p = plan(&[], &waiting, &none, Limits { prefix_cache: false, ..LIMITS });
        assert_eq!(p.start.len(), 3);
        // A sequence still prefilling holds the next one back as well.
        let running = [view(1, Phase::Prefilling, &shared, 5), view(2, Phase::Admitted, &other, 11)];
        assert_eq!(plan(&running, &[], &|_: &[u32]| Cached::tokens(4), LIMITS).start, []);
    }

    #[test]
    fn admission_counts_the_blocks_a_prompt_needs_beyond_the_cache_and_a_watermark() {
        let (a, b, c) = ([1u32; 40], [2u32; 20], [3u32; 16]); // 3, 2 and 1 blocks of 16
        let waiting =
            [view(1, Phase::Admitted, &a, 40), view(2, Phase::Admitted, &b, 20), view(3, Phase::Admitted, &c, 16)];
        let memory = |free_blocks, watermark| Limits { memory: Memory { free_blocks, block: 16, watermark }, ..LIMITS };
        let running = [view(9, Phase::Decoding, &c, 1)];
        assert_eq!(plan(&running, &waiting, &none, memory(6, 0)).admit, 3, "3 + 2 + 1 blocks fit 6");
        assert_eq!(plan(&running, &waiting, &none, memory(5, 0)).admit, 2, "in order: the third waits");
        assert_eq!(plan(&running, &waiting, &none, memory(6, 1)).admit, 2, "the watermark is kept free");
        assert_eq!(plan(&running, &waiting, &none, memory(2, 0)).admit, 0, "the oldest does not fit: nobody passes it");
        // Whole blocks the prompt cache gives take nothing from the pool.
        let cached = |ids: &[u32]| Cached::tokens(if ids == &a[..] { 33 } else { 0 });
        assert_eq!(plan(&running, &waiting, &cached, memory(3, 0)).admit, 2, "a needs 1 block, b 2");
        // Blocks only the cache holds are free to the others but not to the prompt that maps them:
        // a's two whole cached blocks, evictable, count in the 5 free; mapped, they do not.
        let pinned = |ids: &[u32]| if ids == &a[..] { Cached { tokens: 33, evictable: 2 } } else { Cached::default() };
        assert_eq!(plan(&running, &waiting, &pinned, memory(5, 0)).admit, 2, "a takes 1 + its 2, b 2");
        assert_eq!(plan(&running, &waiting, &pinned, memory(4, 0)).admit, 1, "then b does not fit");
        // With nothing running the oldest always goes (the handle refused what could never fit).
        assert_eq!(plan(&[], &waiting, &none, memory(0, 0)).admit, 1);
    }
}
