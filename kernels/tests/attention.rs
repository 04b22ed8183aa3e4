//! Attention on every compiled path against the scalar reference (bit for bit) and a naive f64
//! computation: the weighted sums, the weights, the scores before the softmax that the views show,
//! and a query alone over the cache (decode) against its row in the full call.

use kvgpt_kernels::*;

mod common;
use common::{bits, close, Gen};

#[test]
fn attention_every_path_and_cached_equals_full() {
    // Head sizes: 17 (no SIMD shortcut), 16 (four-key scores), 64 (GPT-2: register-held sums).
    for (nh, hs, t_max) in [(3usize, 17usize, 40usize), (2, 16, 40), (3, 64, 40)] {
        attention_case(nh, hs, t_max);
    }
}

fn attention_case(nh: usize, hs: usize, t_max: usize) {
    let c = nh * hs;
    for &total in &[1usize, 2, 3, 5, 7, 33] {
        let mut g = Gen(total as u64 + 100);
        let q = g.vec(total * 3 * c); // rows laid out like c_attn's [q | k | v]
        let k_cache = g.vec(nh * t_max * hs);
        let v_cache = g.vec(nh * t_max * hs);
        let scale = 1.0 / (hs as f32).sqrt();
        let dims = |t, p| AttnDims { t, p, nh, hs, t_max, scale };
        // Naive reference.
        let mut want = vec![0.0f64; total * c];
        let mut want_probs = vec![0.0f64; nh * total * total];
        let mut want_scores = vec![f64::NEG_INFINITY; nh * total * total];
        for h in 0..nh {
            for i in 0..total {
                let qi = &q[i * 3 * c + h * hs..][..hs];
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kj = &k_cache[(h * t_max + j) * hs..][..hs];
                        qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..=i {
                    want_scores[(h * total + i) * total + j] = s[j];
                    want_probs[(h * total + i) * total + j] = e[j] / z;
                    for d in 0..hs {
                        want[i * c + h * hs + d] += e[j] / z * v_cache[(h * t_max + j) * hs + d] as f64;
                    }
                }
            }
        }
        let mut scratch = vec![0.0; 2 * nh * t_max];
        let mut reference = vec![0.0; total * c];
        attention(Isa::scalar(), &mut reference, None, &q, 3 * c, &k_cache, &v_cache, &mut scratch, dims(total, 0));
        for isa in Isa::available() {
            let mut out = vec![0.0; total * c];
            let mut probs = vec![f32::NAN; nh * total * total];
            attention(isa, &mut out, Some(&mut probs), &q, 3 * c, &k_cache, &v_cache, &mut scratch, dims(total, 0));
            assert_eq!(bits(&out), bits(&reference), "attention {} T={total}", isa.name());
            close(&out, &want, 1e-5, "attention out");
            close(&probs, &want_probs, 1e-6, "attention probs");
            // The scores a view shows: −∞ where masked, and softmax of a row is the weights used.
            let mut sc = vec![f32::NAN; nh * total * total];
            attention_scores(isa, &mut sc, &q, 3 * c, &k_cache, dims(total, 0));
            let sc_full = sc.clone();
            for (i, (g, w)) in sc.iter().zip(&want_scores).enumerate() {
                let ok = if w.is_finite() {
                    (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs())
                } else {
                    *g == f32::NEG_INFINITY
                };
                assert!(ok, "attention scores {} [{i}]: {g} vs {w}", isa.name());
            }
            for (row, prow) in sc.chunks_mut(total).zip(probs.chunks(total)) {
                let n = row.iter().filter(|x| x.is_finite()).count();
                softmax_inplace(isa, &mut row[..n]);
                assert_eq!(bits(&row[..n]), bits(&prow[..n]), "softmax(scores) {} is the weights", isa.name());
            }
            // A query alone over the cache (decode) gives the same bits as its row in the full
            // call, whether that row was the first or the second of a pair there, or alone.
            for p in [0, 1, total / 2, total.saturating_sub(2), total - 1].into_iter().filter(|&p| p < total) {
                let mut one = vec![0.0; c];
                attention(isa, &mut one, None, &q[p * 3 * c..], 3 * c, &k_cache, &v_cache, &mut scratch, dims(1, p));
                assert_eq!(bits(&one), bits(&reference[p * c..(p + 1) * c]), "decode row {p} {}", isa.name());
                // Its scores over the cache, and a chunk of two queries after p cached positions,
                // are the rows of the full call's.
                let t = (total - p).min(2);
                let mut sc = vec![f32::NAN; nh * t * (p + t)];
                attention_scores(isa, &mut sc, &q[p * 3 * c..], 3 * c, &k_cache, dims(t, p));
                for h in 0..nh {
                    for i in 0..t {
                        let got = &sc[(h * t + i) * (p + t)..(h * t + i + 1) * (p + t)];
                        let full = &sc_full[(h * total + p + i) * total..][..p + t];
                        assert_eq!(bits(got), bits(full), "scores of query {} after {p} cached, {}", p + i, isa.name());
                    }
                }
            }
        }
    }
}
