use super::*;

#[test]
fn rng_is_chacha20_as_specified() {
    // ChaCha20 test vector (all-zero key and nonce, block 0): keystream starts 76 b8 e0 ad
    // a0 f1 3d 90, i.e. the little-endian words 0xade0b876, 0x903df1a0.
    let mut rng = ChaCha20Rng::from_seed([0u8; 32]);
    assert_eq!(rng.next_u32(), 0xade0_b876);
    assert_eq!(rng.next_u32(), 0x903d_f1a0);
}

#[test]
fn top_k_1_and_tiny_top_p_are_greedy() {
    let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 * 0.1).collect();
    let best = argmax(&logits);
    for cfg in [
        Sampling { temperature: 1.0, top_k: Some(1), seed: 1, ..Sampling::GREEDY },
        Sampling { temperature: 1.0, top_p: Some(1e-6), seed: 2, ..Sampling::GREEDY },
    ] {
        let mut s = Sampler::new(cfg, logits.len());
        for _ in 0..20 {
            assert_eq!(s.sample(&logits), best);
        }
    }
}

#[test]
fn a_tiny_temperature_is_greedy_and_ties_share_the_mass() {
    let mut logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 * 0.7 - 30.0).collect();
    logits[417] = 41.0; // one clear maximum, and logits large enough that l / T overflows
    for t in [1e-3f32, 1e-20, 1e-38, 1e-45] {
        for top_k in [None, Some(1), Some(5)] {
            let mut s = Sampler::new(Sampling { temperature: t, top_k, seed: 3, ..Sampling::GREEDY }, logits.len());
            for _ in 0..50 {
                assert_eq!(s.sample(&logits), 417, "T={t} top_k={top_k:?}");
            }
        }
    }
    // Two equal maxima: each is drawn about half the time, nothing else ever.
    logits[9] = 41.0;
    let mut s = Sampler::new(Sampling { temperature: 1e-38, seed: 5, ..Sampling::GREEDY }, logits.len());
    let draws: Vec<u32> = (0..4000).map(|_| s.sample(&logits)).collect();
    assert!(draws.iter().all(|&d| d == 9 || d == 417));
    let nine = draws.iter().filter(|&&d| d == 9).count() as f64 / 4000.0;
    assert!((nine - 0.5).abs() < 0.04, "{nine}");
}

#[test]
fn sampling_follows_the_distribution() {
    // Two tokens with probabilities 0.2 / 0.8 (logit gap ln 4).
    let logits = [0.0f32, 4.0f32.ln()];
    let mut s = Sampler::new(Sampling { temperature: 1.0, seed: 7, ..Sampling::GREEDY }, 2);
    let n = 20000;
    let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
    let frac = ones as f64 / n as f64;
    assert!((frac - 0.8).abs() < 0.015, "{frac}");
}

#[test]
fn penalties_follow_their_definitions() {
    // Logits 0..8 minus 4; the prompt is [7, 2, 2], the completion so far [5, 5, 1].
    let logits: Vec<f32> = (0..8).map(|i| i as f32 - 4.0).collect();
    let ids = [7u32, 2, 2, 5, 5, 1];
    let cfg = |theta, pres, freq| Sampling {
        repetition_penalty: theta,
        presence_penalty: pres,
        frequency_penalty: freq,
        ..Sampling::GREEDY
    };
    let mut l = logits.clone();
    Sampler::new(cfg(2.0, 0.0, 0.0), 8).penalize(&mut l, &ids, 3);
    // Seen: 7 (3 → 1.5), 2 (-2 → -4), 5 (1 → 0.5), 1 (-3 → -6); once each however often.
    assert_eq!(l, [-4.0, -6.0, -4.0, -1.0, 0.0, 0.5, 2.0, 1.5]);
    let mut l = logits.clone();
    Sampler::new(cfg(1.0, 0.5, 0.25), 8).penalize(&mut l, &ids, 3);
    // Only the completion counts: 5 twice (1 - 2·0.25 - 0.5 = 0), 1 once (-3 - 0.75).
    assert_eq!(l, [-4.0, -3.75, -2.0, -1.0, 0.0, 0.0, 2.0, 3.0]);
    // Greedy after them: the repetition penalty takes 7 below 6.
    let mut s = Sampler::new(cfg(2.0, 0.0, 0.0), 8);
    assert_eq!(s.sample_after(&logits, &ids, 3), 6);
    assert_eq!(Sampler::new(Sampling::GREEDY, 8).sample_after(&logits, &ids, 3), 7);
    // The marks are cleared: the same call again gives the same.
    assert_eq!(s.sample_after(&logits, &ids, 3), 6);
}

/// The sampler before issue #17 item 8, written plainly: every candidate sorted by
/// `(total_cmp reversed, id)`, the weights by the scalar `exp_approx`, summed in that order. The
/// new sampler must pick the same token for every setting, seed and logits.
fn reference_sample(cfg: &Sampling, rng: &mut ChaCha20Rng, logits: &[f32]) -> (u32, f64) {
    if cfg.is_greedy() {
        return (argmax(logits), 0.0);
    }
    let inv_t = (1.0 / cfg.temperature).min(f32::MAX);
    let (lo, hi) = logits.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &l| (a.min(l), b.max(l)));
    let shift = if (lo.abs().max(hi.abs()) * inv_t).is_finite() { 0.0 } else { hi };
    let mut cand: Vec<(f32, u32)> = logits.iter().enumerate().map(|(i, &l)| ((l - shift) * inv_t, i as u32)).collect();
    let by_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if let Some(k) = cfg.top_k.filter(|&k| k > 0 && k < cand.len()) {
        cand.select_nth_unstable_by(k - 1, by_desc);
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_desc);
    let max = cand[0].0;
    let mut total = 0.0f64;
    for c in cand.iter_mut() {
        let d = c.0 - max;
        c.0 = if d < -87.0 { 0.0 } else { kvgpt_kernels::exp_approx(d) };
        total += c.0 as f64;
    }
    if let Some(p) = cfg.top_p.filter(|&p| p < 1.0) {
        let mut cum = 0.0f64;
        let mut keep = cand.len();
        for (i, c) in cand.iter().enumerate() {
            cum += c.0 as f64 / total;
            if cum >= p as f64 {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
        total = cand.iter().map(|c| c.0 as f64).sum();
    }
    let target = uniform(rng) * total;
    let mut cum = 0.0f64;
    for c in &cand {
        cum += c.0 as f64;
        if target < cum {
            return (c.1, total);
        }
    }
    (cand.last().expect("at least one candidate").1, total)
}

/// SplitMix64, for test logits.
struct Gen(u64);
impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Awkward logits of length `n`, by kind: 0 GPT-2's scale (T = 1 keeps most), 1 all equal,
/// 2 many ties, 3 only zeros of both signs, 4 large (l/T overflows), 5 tiny and subnormal,
/// 6 extremes without infinities, 7 with them, 8 one NaN, 9 one negative NaN, 10 wide (many
/// weights are 0).
fn logits(kind: usize, n: usize, g: &mut Gen) -> Vec<f32> {
    let specials = [0.0, -0.0, f32::MAX, -f32::MAX, f32::MIN_POSITIVE, 1e-40, -1e-40, f32::INFINITY, f32::NEG_INFINITY];
    (0..n)
        .map(|i| {
            let (u, r) = (g.unit(), g.next() as usize);
            match kind {
                0 => u * 8.0 - 90.0,
                1 => 3.25,
                2 => ((i * 37) % 11) as f32 * 0.5 - 2.0,
                3 => [0.0, -0.0][r % 2],
                4 => u * 3e38,
                5 => u * 1e-38,
                6 => specials[r % 7],
                7 => specials[r % specials.len()],
                8 => [u * 4.0, f32::NAN][(i == n / 2) as usize],
                9 => [u, -f32::NAN][(i == n / 3) as usize],
                _ => u * 200.0,
            }
        })
        .collect()
}

const KINDS: usize = 11;

/// Draws `draws` tokens from the new sampler (on every instruction set) and the reference with
/// the same seed, and asserts the same token every time, and the same total weight to the bit
/// (a total summed in another order would change a token only rarely).
fn same_as_reference(cfg: Sampling, l: &[f32], draws: usize) {
    for isa in Isa::available() {
        let mut s = Sampler::with_isa(cfg, l.len(), isa);
        let mut rng = ChaCha20Rng::seed_from_u64(cfg.seed);
        for d in 0..draws {
            let (want, total) = reference_sample(&cfg, &mut rng, l);
            let (got, got_total) = s.sample_and_total(l);
            assert_eq!(got, want, "{} {cfg:?} n={} draw {d}", isa.name(), l.len());
            let same = got_total.to_bits() == total.to_bits() || (got_total.is_nan() && total.is_nan());
            assert!(same, "{} {cfg:?} n={} draw {d}: total {got_total} vs {total}", isa.name(), l.len());
        }
    }
}

#[test]
fn the_same_tokens_as_the_sorting_sampler_on_awkward_logits() {
    let mut g = Gen(17);
    let temps = [1.0f32, 0.7, 2.0, 1e-3, 1e-20, 1e-38, 1e-45];
    for n in [1usize, 2, 3, 31, 1000] {
        for kind in 0..KINDS {
            let l = logits(kind, n, &mut g);
            for (t, &temperature) in temps.iter().enumerate() {
                for top_k in [None, Some(1), Some(2), Some(5), Some(n), Some(n + 7)] {
                    for top_p in [None, Some(1e-6), Some(0.5), Some(0.9), Some(1.0)] {
                        let seed = (n * 1000 + kind * 100 + t) as u64;
                        same_as_reference(Sampling { temperature, top_k, top_p, seed, ..Sampling::GREEDY }, &l, 3);
                    }
                }
            }
        }
    }
}

#[test]
fn the_same_tokens_as_the_sorting_sampler_on_the_full_vocabulary() {
    let mut g = Gen(29);
    let n = 50257;
    for kind in 0..KINDS {
        let l = logits(kind, n, &mut g);
        for (temperature, top_k, top_p) in [
            (1.0, None, None),
            (1.0, None, Some(0.9)),
            (0.7, Some(40), None),
            (1.0, Some(40), Some(0.9)),
            (1e-3, Some(1), None),
            (2.0, Some(n), Some(1e-6)),
            (1e-45, Some(n + 1), Some(1.0)),
        ] {
            let seed = kind as u64;
            same_as_reference(Sampling { temperature, top_k, top_p, seed, ..Sampling::GREEDY }, &l, 4);
        }
    }
}

#[test]
fn the_same_tokens_as_the_sorting_sampler_after_penalties() {
    let mut g = Gen(41);
    let l = logits(0, 5000, &mut g);
    let ids: Vec<u32> = (0..300).map(|_| (g.next() % 5000) as u32).collect();
    for (repetition_penalty, presence_penalty, frequency_penalty) in
        [(1.3, 0.0, 0.0), (1.0, 0.5, 0.25), (0.8, -1.0, 2.0)]
    {
        for top_p in [None, Some(0.9)] {
            let cfg = Sampling {
                temperature: 0.8,
                top_p,
                seed: 9,
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                ..Sampling::GREEDY
            };
            let mut s = Sampler::new(cfg, l.len());
            let mut rng = ChaCha20Rng::seed_from_u64(cfg.seed);
            for prompt in [0, 100, 300] {
                let mut penalized = l.clone();
                Sampler::new(cfg, l.len()).penalize(&mut penalized, &ids, prompt);
                assert_eq!(s.sample_after(&l, &ids, prompt), reference_sample(&cfg, &mut rng, &penalized).0, "{cfg:?}");
            }
        }
    }
}

#[test]
fn the_sort_keys_order_as_total_cmp_does() {
    let mut g = Gen(5);
    let mut v: Vec<f32> = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::MIN_POSITIVE];
    v.extend([1e-45, -1e-45, f32::MAX, f32::MIN, 1.0, -1.0, f32::from_bits(0x7f80_0001), f32::from_bits(0xffff_ffff)]);
    v.extend((0..2000).map(|_| f32::from_bits(g.next() as u32)));
    for &a in &v {
        assert_eq!(order::from_ascending_key(order::ascending_key(a)).to_bits(), a.to_bits());
        for &b in &v[..200] {
            assert_eq!(order::ascending_key(a).cmp(&order::ascending_key(b)), a.total_cmp(&b), "{a} {b}");
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    #[test]
    fn any_bits_any_settings_the_same_tokens_as_the_sorting_sampler(
        bits in proptest::collection::vec(proptest::prelude::any::<u32>(), 1..300),
        small in proptest::collection::vec(-20i8..20, 1..300),
        mix in 0u8..3,
        temperature in 1e-6f32..2.0,
        top_k in proptest::option::of(1usize..320),
        top_p in proptest::option::of(1e-6f32..=1.0),
        seed in proptest::prelude::any::<u64>(),
    ) {
        // Any bit pattern (NaNs, infinities, subnormals), or few distinct values (ties).
        let l: Vec<f32> = match mix {
            0 => bits.iter().map(|&b| f32::from_bits(b)).collect(),
            1 => small.iter().map(|&s| s as f32 * 0.25).collect(),
            _ => bits.iter().map(|&b| (b % 2000) as f32 * 0.01 - 10.0).collect(),
        };
        same_as_reference(Sampling { temperature, top_k, top_p, seed, ..Sampling::GREEDY }, &l, 2);
    }
}
