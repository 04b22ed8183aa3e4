//! llama-bench's JSON keys, beside kvgpt's own in every `kvgpt bench -o json` row, so that a
//! script written for `llama-bench -o json` reads kvgpt's rows as they are: the same names, the
//! same units (tokens per second, nanoseconds per run of the test, bytes, the K/V type by name).

use serde::Serialize;

#[derive(Serialize, Clone)]
pub struct LlamaBenchKeys<'a> {
    pub build_commit: &'a str,
    pub backends: &'static str,
    pub model_filename: &'a str,
    pub model_type: String,
    pub model_size: usize,
    pub model_n_params: usize,
    pub n_threads: usize,
    pub type_k: &'a str,
    pub type_v: &'a str,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub avg_ns: f64,
    pub stddev_ns: f64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ns: Vec<f64>,
    pub samples_ts: Vec<f64>,
}

/// `(mean, sample standard deviation)`, 0 for one sample, as llama-bench computes it.
fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let sd = if xs.len() < 2 { 0.0 } else { (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() };
    (mean, sd)
}

/// A run's time from its tokens per second and its tokens: llama-bench's `samples_ns`.
pub fn samples(tokens: usize, tok_s: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let ns = tok_s.iter().map(|t| if *t > 0.0 { tokens as f64 / t * 1e9 } else { 0.0 }).collect();
    (ns, tok_s.to_vec())
}

/// The timing keys of a test of `tokens` tokens whose runs went at `tok_s`.
pub fn timing(tokens: usize, tok_s: &[f64]) -> [(f64, f64); 2] {
    let (ns, ts) = samples(tokens, tok_s);
    [mean_sd(&ns), mean_sd(&ts)]
}
