//! Exact speculative decoding (issue #18, first step): greedy with the n-gram lookup draft gives
//! Hugging Face's greedy ids, and every token's logits bit for bit as decoding alone does, while
//! the draft is accepted often (random weights repeat themselves, so acceptance here says nothing
//! about real text).

mod common;

use common::*;
use kvgpt::speculative::{generate_greedy, Lookup};
use kvgpt::{generate, GenerateOptions, Sampling, Step};

#[test]
fn greedy_with_lookup_drafts_is_the_model_alone_bit_for_bit() {
    let loaded = load_fixture();
    let model = &loaded.model;
    let reference = Reference::load();
    let mut accepted = 0;
    for p in reference.prompts() {
        let n = p.greedy_ids.len();
        let opts =
            GenerateOptions { max_new_tokens: n, sampling: Sampling::GREEDY, stop_at_eos: false, use_cache: true };
        let mut alone = vec![];
        generate(model, &p.ids, &opts, &mut |id, l| {
            alone.push((id, l.to_vec()));
            Ok(Step::Go)
        })
        .unwrap();
        for k in [1, 4, 7] {
            let mut seen = vec![];
            let (ids, stats) = generate_greedy(model, &p.ids, n, &mut Lookup { max_ngram: 3 }, k, &mut |id, l| {
                seen.push((id, l.to_vec()))
            })
            .unwrap();
            assert_eq!(ids, p.greedy_ids, "{} k={k}: HF's greedy ids", p.key);
            assert_eq!(seen.len(), n);
            for (i, ((a, la), (b, lb))) in alone.iter().zip(&seen).enumerate() {
                assert_eq!(a, b, "{} k={k} token {i}", p.key);
                assert!(
                    la.iter().zip(lb).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{} k={k}: logits of token {i}",
                    p.key
                );
            }
            assert!(stats.accepted <= stats.drafted && stats.steps < n);
            accepted += stats.accepted;
        }
    }
    assert!(accepted > 0, "the lookup draft was never accepted");
}
