//! Scoring a text under the model (llama.cpp's `llama-perplexity`, HF's `labels=`): each token's
//! surprisal and rank given the tokens before it, the mean loss and the perplexity.
//!
//! A text longer than the window is scored in windows that overlap (HF's perplexity guide):
//! window `w` starts at `w·stride`, holds up to `window` tokens, and scores only the tokens no
//! earlier window scored, each given the window's tokens before it. The first token of the text
//! has nothing before it and is not scored, as with HF's `labels=ids`.

use kvgpt_core::error::{Error, Result};
use kvgpt_core::logprobs::Distribution;
use kvgpt_core::{Model, NoTap, Scratch};
use serde::Serialize;

/// How one token fared.
#[derive(Clone, Debug, Serialize)]
pub struct TokenScore {
    /// Its index in the text's ids.
    pub position: usize,
    pub id: u32,
    /// −ln p(token | the tokens before it in its window), in nats.
    pub surprisal: f64,
    /// p(token | …).
    pub prob: f64,
    /// 1 + how many tokens the model found strictly more likely.
    pub rank: usize,
    /// How many tokens before it the model saw (its window's).
    pub context: usize,
}

/// A scored text.
#[derive(Clone, Debug, Serialize)]
pub struct Score {
    pub tokens: Vec<TokenScore>,
    /// The mean surprisal of the scored tokens (nats per token): HF's `loss`.
    pub mean_loss: f64,
    /// `exp(mean_loss)`.
    pub perplexity: f64,
    /// The same loss in bits per token.
    pub bits_per_token: f64,
    pub window: usize,
    pub stride: usize,
    /// How many windows ran.
    pub windows: usize,
}

/// Rows of logits computed per forward call while scoring.
const ROWS: usize = 64;

/// Scores `ids` in windows of `window` tokens moving by `stride` (`0 < stride ≤ window ≤
/// n_positions`).
pub fn score(model: &Model, ids: &[u32], window: usize, stride: usize) -> Result<Score> {
    let cfg = &model.config;
    if window < 2 || window > cfg.n_positions {
        return Err(Error::Invalid(format!(
            "a window of {window} tokens: it must hold 2 to {} (the model's context)",
            cfg.n_positions
        )));
    }
    if stride == 0 || stride > window {
        return Err(Error::Invalid(format!("a stride of {stride}: it must be 1 to the window's {window} tokens")));
    }
    if ids.len() < 2 {
        return Err(Error::Invalid(format!(
            "{} token(s) to score: the first token has nothing before it, so at least 2 are needed",
            ids.len()
        )));
    }
    let v = cfg.vocab_size;
    let mut cache = model.new_cache(window);
    let mut scratch = Scratch::new(cfg, ROWS);
    let mut logits = vec![0.0f32; ROWS * v];
    let (mut tokens, mut scored_to, mut windows) = (Vec::with_capacity(ids.len() - 1), 1, 0);
    let mut begin = 0;
    loop {
        let end = (begin + window).min(ids.len());
        // Tokens scored_to..end, each predicted from the row before it: rows first-1..end-1.
        let first = scored_to.max(begin + 1);
        cache.reset();
        if first - 1 > begin {
            model.run(&ids[begin..first - 1], &mut cache, &mut scratch, &mut [])?;
            // context only
        }
        let mut row = first - 1;
        while row < end - 1 {
            let n = ROWS.min(end - 1 - row);
            let out = &mut logits[..n * v];
            model.forward(&ids[row..row + n], &mut cache, &mut scratch, &mut NoTap, out)?;
            for (j, l) in out.chunks_exact(v).enumerate() {
                let position = row + j + 1;
                tokens.push(token_score(l, ids[position], position, position - begin));
            }
            row += n;
        }
        windows += 1;
        scored_to = end;
        if end == ids.len() {
            break;
        }
        begin += stride;
    }
    let mean_loss = tokens.iter().map(|t| t.surprisal).sum::<f64>() / tokens.len() as f64;
    Ok(Score {
        tokens,
        mean_loss,
        perplexity: mean_loss.exp(),
        bits_per_token: mean_loss / std::f64::consts::LN_2,
        window,
        stride,
        windows,
    })
}

/// The surprisal, probability and rank of `id` under one row of logits (log-softmax in f64).
pub fn token_score(logits: &[f32], id: u32, position: usize, context: usize) -> TokenScore {
    let target = logits[id as usize];
    let surprisal = -Distribution::of(logits).logprob(target);
    let rank = 1 + logits.iter().filter(|&&x| x > target).count();
    TokenScore { position, id, surprisal, prob: (-surprisal).exp(), rank, context }
}
