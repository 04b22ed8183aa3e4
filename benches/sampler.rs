//! `Sampler::sample` over DistilGPT-2's 50257-token vocabulary: greedy against temperature 1,
//! top-p 0.9 and top-k 40, on two kinds of logits: GPT-2-like (a spread of about 3, a few
//! tokens well above the rest) and flat (every logit within 0.5, as a random checkpoint gives:
//! top-p then keeps most of the vocabulary, its worst case).
//! Run: `cargo bench --bench sampler` (one thread: sampling uses none).

use criterion::{criterion_group, criterion_main, Criterion};
use kvgpt_core::{Sampler, Sampling};
use std::hint::black_box;

const VOCAB: usize = 50257;

/// Deterministic logits: roughly normal with spread `sd` around -80, and `peaks` tokens 10 above.
fn logits(sd: f32, peaks: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9u32;
    let mut unit = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s as f32 / u32::MAX as f32 - 0.5
    };
    let mut l: Vec<f32> = (0..VOCAB).map(|_| -80.0 + sd * (unit() + unit() + unit() + unit())).collect();
    for i in 0..peaks {
        l[(i * 7919) % VOCAB] = -70.0 + i as f32 * 0.5;
    }
    l
}

fn samplers(c: &mut Criterion) {
    for (kind, l) in [("gpt2-like", logits(3.0, 8)), ("flat", logits(0.5, 0))] {
        let mut g = c.benchmark_group(format!("sample_{VOCAB}_{kind}"));
        let sampled = Sampling { temperature: 1.0, seed: 1, ..Sampling::GREEDY };
        for (name, cfg) in [
            ("greedy", Sampling::GREEDY),
            ("temperature_1", sampled),
            ("top_p_0.9", Sampling { top_p: Some(0.9), ..sampled }),
            ("top_k_40", Sampling { top_k: Some(40), ..sampled }),
        ] {
            let mut s = Sampler::new(cfg, VOCAB);
            g.bench_function(name, |b| b.iter(|| s.sample(black_box(&l))));
        }
        g.finish();
    }
}

criterion_group!(benches, samplers);
criterion_main!(benches);
