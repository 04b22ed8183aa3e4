//! Log-probabilities of a row of logits, in f64: the one log-sum-exp that logprobs, the top-k
//! views, scores and KL divergences all share.

/// Statistics of one row of logits, computed in f64.
#[derive(Clone, Debug)]
pub struct Distribution {
    /// log Σ exp(logits).
    pub log_z: f64,
}

impl Distribution {
    pub fn of(logits: &[f32]) -> Distribution {
        let m = logits.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x as f64));
        let z: f64 = logits.iter().map(|&x| (x as f64 - m).exp()).sum();
        Distribution { log_z: m + z.ln() }
    }

    pub fn logprob(&self, logit: f32) -> f64 {
        logit as f64 - self.log_z
    }
}

/// Probability, log-probability and logit of a candidate token.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
    pub prob: f64,
    pub logprob: f64,
}

/// The `k` most likely tokens (ties by lower id) and the entropy in nats.
pub fn top_k(logits: &[f32], k: usize) -> (Vec<Candidate>, f64) {
    let d = Distribution::of(logits);
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(idx.len());
    let by_desc = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by_desc);
    }
    idx.truncate(k);
    idx.sort_by(by_desc);
    let top = idx
        .iter()
        .map(|&id| {
            let lp = d.logprob(logits[id as usize]);
            Candidate { id, logit: logits[id as usize], prob: lp.exp(), logprob: lp }
        })
        .collect();
    let entropy = -logits
        .iter()
        .map(|&x| {
            let lp = d.logprob(x);
            lp.exp() * lp
        })
        .sum::<f64>();
    (top, entropy)
}

/// KL(p ‖ q) in nats between the softmax distributions of two logit rows.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (dp, dq) = (Distribution::of(p_logits), Distribution::of(q_logits));
    p_logits
        .iter()
        .zip(q_logits)
        .map(|(&a, &b)| {
            let lp = dp.logprob(a);
            lp.exp() * (lp - dq.logprob(b))
        })
        .sum::<f64>()
        .max(0.0)
}

/// A token's log-probability (natural log, from the logits before temperature) and the most
/// likely alternatives, as the server and `generate --logprobs` report them.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

/// The log-probability of `id` under `logits` and the `k` most likely alternatives.
pub fn token_logprob(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let d = Distribution::of(logits);
    TokenLogprob {
        logprob: d.logprob(logits[id as usize]),
        top: top_k(logits, k).0.iter().map(|c| (c.id, c.logprob)).collect(),
    }
}
