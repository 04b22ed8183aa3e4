//! Scoring a text under the model (llama.cpp's `llama-perplexity`, HF's `labels=`): each token's
//! surprisal and rank given the tokens before it, the mean loss and the perplexity.
//!
//! A text longer than the window is scored in windows that overlap (HF's perplexity guide):
//! window `w` starts at `w·stride`, holds up to `window` tokens, and scores only the tokens no
//! earlier window scored, each given the window's tokens before it. The first token of the text
//! has nothing before it and is not scored, as with HF's `labels=ids`.

use kvgpt_core::error::{Error, Result};
use kvgpt_core::logprobs::Distribution;
use kvgpt_core::{KvCache, KvSpec, KvType, Model, NoTap, Scratch};
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
    let mut tokens = Vec::with_capacity(ids.len().saturating_sub(1));
    let windows = walk(model, &[model.kv()], ids, (window, stride), &mut |position, context, rows| {
        tokens.push(token_score(rows[0], ids[position], position, context));
    })?;
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

/// What holding K/V as the model's `--kv-dtype` costs against f32 K/V on one text, as
/// llama.cpp's `llama-perplexity --kl-divergence` reports a quantization: per scored token the KL
/// divergence of the model's distribution from the f32-K/V one (nats), how often their top tokens
/// agree, and both perplexities.
#[derive(Clone, Debug, Serialize)]
pub struct KvAccuracy {
    pub kv_dtype: &'static str,
    pub kl_mean: f64,
    pub kl_max: f64,
    pub top1_agreement: f64,
    pub perplexity: f64,
    pub perplexity_f32_kv: f64,
    /// `perplexity / perplexity_f32_kv − 1`.
    pub perplexity_change: f64,
}

/// [`KvAccuracy`] of `model` (its K/V held as [`Model::kv`]) over `ids`, scored as [`score`]
/// does, both runs in step.
pub fn kv_accuracy(model: &Model, ids: &[u32], window: usize, stride: usize) -> Result<KvAccuracy> {
    let specs = [model.kv().with_type(KvType::F32), model.kv()];
    let (mut kl, mut kl_max, mut agree, mut loss, mut loss_f32, mut n) = (0.0, 0.0f64, 0, 0.0, 0.0, 0);
    walk(model, &specs, ids, (window, stride), &mut |position, _, rows| {
        let (p, q) = (log_softmax(rows[0]), log_softmax(rows[1]));
        let d: f64 = p.iter().zip(&q).map(|(&lp, &lq)| lp.exp() * (lp - lq)).sum();
        (kl, kl_max, n) = (kl + d, kl_max.max(d), n + 1);
        agree += usize::from(argmax(rows[0]) == argmax(rows[1]));
        let id = ids[position] as usize;
        (loss_f32, loss) = (loss_f32 - p[id], loss - q[id]);
    })?;
    let n = n as f64;
    let (ppl, ppl_f32) = ((loss / n).exp(), (loss_f32 / n).exp());
    Ok(KvAccuracy {
        kv_dtype: model.kv().kv_type().name(),
        kl_mean: kl / n,
        kl_max,
        top1_agreement: agree as f64 / n,
        perplexity: ppl,
        perplexity_f32_kv: ppl_f32,
        perplexity_change: ppl / ppl_f32 - 1.0,
    })
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let lse = max + logits.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
    logits.iter().map(|&x| x as f64 - lse).collect()
}

fn argmax(logits: &[f32]) -> usize {
    logits.iter().enumerate().fold(0, |b, (i, &x)| if x > logits[b] { i } else { b })
}

/// Hears one scored token: its position, how many tokens its window gave it, and its row of logits
/// under each K/V spec.
type EachToken<'a> = &'a mut dyn FnMut(usize, usize, &[&[f32]]);

/// Walks the windows of [`score`] once for each K/V spec in `specs`, in step: `each(position,
/// context, rows)` hears every scored token with its row of logits under each spec. Returns how
/// many windows ran.
fn walk(
    model: &Model,
    specs: &[KvSpec],
    ids: &[u32],
    (window, stride): (usize, usize),
    each: EachToken<'_>,
) -> Result<usize> {
    check(model, ids, window, stride)?;
    let (cfg, v) = (&model.config, model.config.vocab_size);
    let mut runs: Vec<(KvCache, Vec<f32>)> =
        specs.iter().map(|&s| (KvCache::with_spec(cfg, window, s), vec![0.0f32; ROWS * v])).collect();
    let mut scratch = Scratch::new(cfg, ROWS);
    let (mut scored_to, mut windows, mut begin) = (1, 0, 0);
    loop {
        let end = (begin + window).min(ids.len());
        // Tokens scored_to..end, each predicted from the row before it: rows first-1..end-1.
        let first = scored_to.max(begin + 1);
        for (cache, _) in &mut runs {
            cache.reset();
            if first - 1 > begin {
                model.run(&ids[begin..first - 1], cache, &mut scratch, &mut [])?;
                // context only
            }
        }
        let mut row = first - 1;
        while row < end - 1 {
            let n = ROWS.min(end - 1 - row);
            for (cache, logits) in &mut runs {
                model.forward(&ids[row..row + n], cache, &mut scratch, &mut NoTap, &mut logits[..n * v])?;
            }
            let mut rows: Vec<&[f32]> = Vec::with_capacity(runs.len());
            for j in 0..n {
                rows.clear();
                rows.extend(runs.iter().map(|(_, l)| &l[j * v..(j + 1) * v]));
                each(row + j + 1, row + j + 1 - begin, &rows);
            }
            row += n;
        }
        (windows, scored_to) = (windows + 1, end);
        if end == ids.len() {
            return Ok(windows);
        }
        begin += stride;
    }
}

fn check(model: &Model, ids: &[u32], window: usize, stride: usize) -> Result<()> {
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
    Ok(())
}

/// The surprisal, probability and rank of `id` under one row of logits (log-softmax in f64).
pub fn token_score(logits: &[f32], id: u32, position: usize, context: usize) -> TokenScore {
    let target = logits[id as usize];
    let surprisal = -Distribution::of(logits).logprob(target);
    let rank = 1 + logits.iter().filter(|&&x| x > target).count();
    TokenScore { position, id, surprisal, prob: (-surprisal).exp(), rank, context }
}
