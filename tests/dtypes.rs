//! Weight types against f32 on the fixture: f16/bf16/int8 storage with f32 arithmetic, and W8A8
//! (int8 weights and activations).
//! Reported figures: greedy top-1 agreement and mean KL(f32 ‖ type) over 40-step greedy runs.

mod common;

use common::*;
use kvgpt_core::{Model, WeightType};

#[test]
fn sixteen_bit_and_int8_weights_track_f32() {
    let loaded = load_fixture();
    let files = &loaded.files;
    let prompts = Reference::load().prompts();
    for (ty, min_agree, max_kl) in [
        (WeightType::F16, 0.99, 1e-5),
        (WeightType::Bf16, 0.97, 5e-4),
        (WeightType::Q8, 0.94, 1e-3),
        (WeightType::W8A8, 0.90, 5e-3),
        (WeightType::Q8_0, 0.90, 5e-3),
        (WeightType::Q5_1, 0.70, 5e-2),
        (WeightType::Q5_0, 0.60, 5e-2),
        (WeightType::Q4_1, 0.50, 2e-1),
        (WeightType::Q4_0, 0.50, 2e-1),
        (WeightType::Q4K, 0.50, 2e-1),
    ] {
        let model = Model::load_as(&files.config, &files.weights, ty).unwrap();
        let (mut agree, mut kl, mut n, mut worst) = (0.0, 0.0, 0usize, 0.0f32);
        for p in prompts.iter().filter(|p| p.ids.len() + 40 <= 128) {
            let c = kvgpt_views::verify::against_model(&loaded.model, &model, &p.ids, 40, f32::INFINITY).unwrap();
            agree += c.top1_agreement * c.steps as f64;
            kl += c.mean_kl * c.steps as f64;
            n += c.steps;
            worst = worst.max(c.max_abs_diff);
        }
        // Cached and uncached decoding stay bit-identical whatever the storage type.
        let cached = kvgpt_views::verify::cache_vs_recompute(&model, &prompts[1].ids, 20, 0.0).unwrap();
        assert!(cached.passes() && cached.max_abs_diff == 0.0, "{} cached vs uncached: {cached:?}", ty.name());
        let (agree, kl) = (agree / n as f64, kl / n as f64);
        println!(
            "{}: top-1 agreement {:.2}% over {n} steps, mean KL {kl:.2e}, max |Δlogit| {worst:.3}",
            ty.name(),
            agree * 100.0
        );
        assert!(agree >= min_agree, "{} top-1 agreement {agree}", ty.name());
        assert!(kl <= max_kl, "{} mean KL {kl}", ty.name());
        // The held weights are smaller by the expected factor.
        let ratio = loaded.model.weight_bytes() as f64 / model.weight_bytes() as f64;
        let want = match ty {
            WeightType::F16 | WeightType::Bf16 => 2.0,
            WeightType::W8A8 | WeightType::Q8_0 => 3.5,
            WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q4K => 5.0,
            WeightType::Q5_0 | WeightType::Q5_1 => 3.0,
            _ => 3.4,
        };
        assert!(ratio > want * 0.95, "{} bytes ratio {ratio}", ty.name());
    }
}
