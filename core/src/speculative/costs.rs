//! What drafting costs, measured on this machine when a draft is loaded: a verify row beyond the
//! first and one drafted token, each as a fraction of the target's one-row decode step. How many
//! tokens to draft depends on them (never what the answer is).

use super::DraftSource;
use crate::error::Result;
use crate::model::{Model, Scratch};
use crate::tap::NoTap;
use std::time::Instant;

/// Costs as fractions of one decode step of the target (one row, weights read once).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// One verify row beyond the first (its arithmetic and its attention).
    pub row: f64,
    /// One drafted token (the draft's own decode step).
    pub draft: f64,
}

/// Timed forwards per measurement, after one untimed (the fastest is kept: the least disturbed
/// by whatever else the machine does, on both sides of a ratio). Three, not seven: the costs came
/// out the same within the drift (AMD EPYC Zen 5 class, AVX-512, DistilGPT-2 shape: a verify row
/// 0.026–0.037 against 0.029–0.033, a drafted token 0.34–0.35 against 0.33) and a `--draft`
/// start took 70 ms less (305 ms against 375).
const REPS: usize = 3;
/// The context the steps are timed at.
const CONTEXT: usize = 16;

impl Costs {
    /// Times the target's one-row and (1 + `max_k`)-row steps and the draft's one-row step.
    pub fn measure(target: &Model, source: &DraftSource, max_k: usize) -> Result<Costs> {
        let one = step_seconds(target, 1)?;
        let rows = step_seconds(target, 1 + max_k)?;
        let draft = match source {
            DraftSource::Lookup { .. } => 0.0,
            DraftSource::Model(m) => step_seconds(m, 1)? / one,
        };
        Ok(Costs { row: ((rows / one - 1.0) / max_k.max(1) as f64).max(0.0), draft })
    }
}

/// The fewest seconds of a forward over `rows` new tokens (with their logits) after a short
/// context.
fn step_seconds(m: &Model, rows: usize) -> Result<f64> {
    let cfg = &m.config;
    let context = CONTEXT.min(cfg.n_positions.saturating_sub(rows)).max(1);
    let ids: Vec<u32> = (0..context + rows).map(|i| ((i * 7919 + 13) % cfg.vocab_size) as u32).collect();
    let mut cache = m.new_cache(context + rows);
    let mut scratch = Scratch::new(cfg, context.max(rows));
    m.run(&ids[..context], &mut cache, &mut scratch, &mut [])?;
    let mut logits = vec![0.0; rows * cfg.vocab_size];
    let mut times = Vec::with_capacity(REPS + 1);
    for _ in 0..=REPS {
        let t = Instant::now();
        m.forward(&ids[context..], &mut cache, &mut scratch, &mut NoTap, &mut logits)?;
        times.push(t.elapsed().as_secs_f64());
        cache.truncate(context);
    }
    Ok(times[1..].iter().copied().fold(f64::INFINITY, f64::min).max(1e-9))
}
